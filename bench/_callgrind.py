"""Instructions counted by callgrind: the CPU-time figures' deterministic twin on a noisy machine.

On a shared 2-core guest the same pure-Python loop takes 15 to 22 ms from one round to the next,
so a 40 µs difference on a 1.2 ms step drowns in the spread of CPU time. The number of
instructions a process executes does not move with its neighbours: callgrind (valgrind) counts
them exactly, in every thread of the process (threads run one at a time under valgrind, all
counted) and in no other process (the drain, started by ``exec``, runs natively, untraced).

How: the bench re-runs itself under ``valgrind --tool=callgrind --instr-atstart=no`` with
``--dump-before=getppid``; in that run it turns counting on once warm (``start()``), and
``mark(label, units)`` (an ``os.getppid()``, which no code of ours or torch's calls) closes one
segment and opens the next. Callgrind writes one dump per segment; ``run()`` reads them back and
returns each labelled segment's instructions per unit (per step, per span).

What it does not say: time. An instruction of the interpreter's and one of a matrix kernel's
cost different time, so read instructions against instructions of the same kind (our Python
against the SDK's Python), and the CPU-time rounds for µs. Under valgrind a program runs ~50×
slower, so a thread woken by a timer is counted more often per step than it would be; the
offloaded training process has none, and the SDK's batch processor exports by count here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_ENV = "BENCH_CALLGRIND_SEGMENTS"  # the file the run under callgrind writes its segments to
#: A folder to keep callgrind's dumps in (one per segment, numbered as ``run()`` reads them, with
#: ``segments.json``), for ``callgrind_annotate`` to say where a segment's instructions went.
KEEP_ENV = "BENCH_CALLGRIND_KEEP"

_segments: list[dict[str, object]] = []
_counting = [False]  # start() called: marks before it (a warm-up's) make no dump, so they are not segments


def active() -> bool:
    """Whether this process is the run under callgrind."""
    return bool(os.environ.get(_ENV))


def start() -> None:
    """Count from here on (after imports and warm-up, which would take minutes counted)."""
    if active():
        _counting[0] = True
        subprocess.run(["callgrind_control", "--instr=on", str(os.getpid())], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def mark(label: str | None = None, units: int = 0) -> None:
    """End the current segment and start one called ``label`` that did ``units`` units of work.

    ``label=None``: a segment nobody reads (set-up between measured ones). ``units`` may be given
    at the segment's end instead, with ``count()``.
    """
    if active() and _counting[0]:
        _segments.append({"label": label, "units": units})
        os.getppid()


def count(units: int) -> None:
    """The units of work the current segment did, once known."""
    if active() and _counting[0] and _segments:
        _segments[-1]["units"] = units


def finish() -> None:
    """Close the last segment and hand the list to the parent run."""
    if active():
        mark(None)
        Path(os.environ[_ENV]).write_text(json.dumps(_segments))


def run(argv: list[str]) -> dict[str, list[float]]:
    """Run this script under callgrind with ``argv``; each label's instructions per unit, a list per round."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("--instructions needs valgrind (callgrind) on the PATH")
    with tempfile.TemporaryDirectory(prefix="bench-callgrind-") as work:
        segments_file = Path(work) / "segments.json"
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--dump-before=getppid",
                   f"--callgrind-out-file={work}/cg.out", sys.executable, *argv]
        done = subprocess.run(command, env={**os.environ, _ENV: str(segments_file)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0 or not segments_file.exists():
            sys.stdout.write(done.stdout[-4000:])
            raise SystemExit(f"the run under callgrind failed (exit {done.returncode})")
        segments = json.loads(segments_file.read_text())
        dumps = sorted(Path(work).glob("cg.out.*"), key=lambda path: int(path.suffix[1:]))
        totals = [_total(path) for path in dumps]
        keep = os.environ.get(KEEP_ENV)
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            for path in [*dumps, segments_file]:
                shutil.copy(path, Path(keep) / path.name)
    # Dump k is written at the k-th mark(): dump 1 ends the warm-up's tail, dump k+1 segment k; the
    # last segment (finish()'s, unread) goes to the file callgrind writes at exit.
    if len(totals) != len(segments):
        raise SystemExit(f"callgrind wrote {len(totals)} dumps for {len(segments)} segments")
    per_unit: dict[str, list[float]] = {}
    for segment, instructions in zip(segments, totals[1:]):
        if segment["label"] is not None and segment["units"]:
            per_unit.setdefault(str(segment["label"]), []).append(instructions / int(segment["units"]))
    return per_unit


def _total(path: Path) -> int:
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    return 0
