"""Who holds the training process's GIL, per step: the figure behind a host-bound loop's overhead.

A step's wall cost under instrumentation is not only the training thread's own
CPU time: every torch op releases the GIL, a waiting thread (the batch span
processor's exporter, the device timeline's resolver, the metric reader) takes
it, and the training thread waits for it back. This samples the GIL holder with
py-spy (``--gil``: only samples of the thread that holds it) and prints, per
thread, its GIL time per step, and the otel-training/OpenTelemetry code that
held it, outermost first.

    .venv/bin/python bench/gil_share.py --steps 2500 -- python examples/cuda_plain_loop.py --steps 2500

runs the command under ``otel-training run`` (the zero-code path a user takes;
``--plain`` runs it as is) with py-spy inside, so the profiled process is the
training process itself. Needs py-spy (the ``watchdog`` extra) and ptrace
permission. ``--raw FILE`` summarises an existing ``py-spy record --gil
--threads -f raw`` output instead.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def _calls_through() -> tuple[str, ...]:
    """Frames of ours that only call back into user code (the lines of the torch instrumentor's
    wrappers that call the wrapped function: the DataLoader fetch, backward) or run imports:
    samples whose innermost frame of ours is one of these are not our cost."""
    import importlib.util

    lines: list[str] = []
    spec = importlib.util.find_spec("otel_training.integrations.torch.instrumentor")
    if spec is not None and spec.origin:
        source = Path(spec.origin).read_text().splitlines()
        lines = [f"instrumentor.py:{number}" for number, line in enumerate(source, 1) if "wrapped(*args" in line]
    return (*lines, "wrapt/importer.py", "<frozen importlib")


_CALLS_THROUGH = _calls_through()
_OURS = ("otel_training", "opentelemetry", "wrapt")
_STARTUP = ("auto_instrument", "_find_and_load")


def summarise(raw: Path, steps: int, rate_hz: int) -> None:
    threads: collections.Counter[str] = collections.Counter()
    ours: collections.Counter[str] = collections.Counter()
    where: collections.Counter[tuple[str, str]] = collections.Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread = frames[0].rpartition(":")[2].strip() or frames[0]
        samples = int(count)
        total += samples
        threads[thread] += samples
        mine = [frame for frame in frames[1:] if any(key in frame for key in _OURS)]
        if not mine or any(key in mine[-1] for key in _CALLS_THROUGH):
            continue
        if any(key in frame for frame in frames for key in _STARTUP):
            continue  # start-up: imports and configuration, paid once
        ours[thread] += samples
        outer = [frame for frame in mine if "gated" not in frame and "_contain.py" not in frame]
        where[(thread, (outer or mine)[0])] += samples

    def per_step(samples: int) -> str:
        return f"{samples / rate_hz / steps * 1e6:8.1f} µs/step" if steps else f"{samples:8d} samples"

    print(f"{total} GIL samples at {rate_hz} Hz; {steps or '?'} steps")
    print("GIL held, by thread (all code):")
    for thread, samples in threads.most_common(12):
        print(f"  {thread[:40]:40s} {per_step(samples)}")
    print("GIL held by otel-training / OpenTelemetry code, by thread (start-up excluded):")
    for thread, samples in ours.most_common(12):
        print(f"  {thread[:40]:40s} {per_step(samples)}")
    print(f"  {'total':40s} {per_step(sum(ours.values()))}")
    print("where (outermost frame of ours):")
    for (thread, frame), samples in where.most_common(15):
        print(f"  {per_step(samples)}  {thread[:24]:24s} {frame}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=0, help="steps the command runs (for the per-step figures)")
    parser.add_argument("--rate", type=int, default=1000, help="samples per second (default: %(default)s)")
    parser.add_argument("--plain", action="store_true", help="run the command as is, not under otel-training run")
    parser.add_argument("--raw", type=Path, help="summarise this py-spy raw output instead of running anything")
    parser.add_argument("--keep", type=Path, help="also write the raw profile here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the training command")
    args = parser.parse_args()
    if args.raw is not None:
        summarise(args.raw, args.steps, args.rate)
        return
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the training command after --, or --raw FILE")
    bin_dir = Path(sys.executable).parent
    py_spy = shutil.which("py-spy", path=str(bin_dir)) or shutil.which("py-spy")
    if py_spy is None:
        raise SystemExit("py-spy not found: pip install 'otel-training[watchdog]'")
    with tempfile.TemporaryDirectory(prefix="gil-share-") as scratch:
        raw = args.keep or Path(scratch) / "gil.txt"
        spy = [py_spy, "record", "--gil", "--threads", "--nonblocking", "-r", str(args.rate), "-f", "raw",
               "-o", str(raw), "--", *command]
        if not args.plain:
            spy = [str(bin_dir / "otel-training"), "run", "--output-dir", str(Path(scratch) / "traces"), "--", *spy]
        result = subprocess.run(spy, stdout=subprocess.PIPE, text=True)
        if result.returncode != 0:
            raise SystemExit(f"{' '.join(spy)} failed ({result.returncode})")
        print(result.stdout.strip().splitlines()[-1] if result.stdout.strip() else "")
        summarise(raw, args.steps, args.rate)


if __name__ == "__main__":
    main()
