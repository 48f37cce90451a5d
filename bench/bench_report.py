"""How fast, and in how much memory, ``otel-training report`` reads a job: this code against the code before it.

Generates jobs of 1M, 10M and 50M spans (``bench/report_job.py``: the file
exporter's format, one file per rank, restarts, checkpoints, stuck and
recovered alerts, a straggler), runs ``otel-training report`` on each in a
subprocess under ``/usr/bin/time -v`` (the terminal summary alone, then with
the HTML page), and prints side by side: seconds, seconds per million spans,
the peak RSS ``time -v`` reports (its largest process), and the peak of the
whole process tree (parent and workers, sampled every 0.1 s). The code before
the streaming report (``BEFORE_STREAMING``, the last commit whose report held
every span, or ``--old-ref``) runs on the smallest size only: it holds every
span, and 10M would need over 10 GB.

``--repeat N`` then writes each rank's file again as its content N times over
(a spool replayed, files concatenated: every span N times) and times the summary
of that too; its figures must be those of the spans written once, the report
saying how many it dropped (the bench compares the summaries, those lines aside).

Usage:
    .venv/bin/python bench/bench_report.py [--sizes 1M,10M,50M] [--ranks 8,100,1000] [--restarts 1]
        [--html-up-to 10M] [--before-up-to 1M] [--old-ref REF] [--repeat N] [--dir /tmp/bench-report] [--keep]

Inputs go under ``--dir`` (about 300 bytes a span: 15 GB at 50M) and are
deleted after each size unless ``--keep``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report_job import generate

ROOT = Path(__file__).resolve().parent.parent
#: The parent of the commit that made the report stream (3d5eb3b): the report that held every span.
BEFORE_STREAMING = "3d5eb3b^"


def _count(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 10**3, "M": 10**6, "G": 10**9}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * scale)


def _tree_rss_kb(pid: int) -> int:
    """RSS of a process and all its descendants, from /proc (0 once gone)."""
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        try:
            with open(f"/proc/{current}/status") as handle:
                total += next((int(line.split()[1]) for line in handle if line.startswith("VmRSS:")), 0)
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as handle:
                    stack.extend(int(child) for child in handle.read().split())
        except (OSError, ValueError):
            continue
    return total


def run_report(code: Path, traces: Path, html: Path | None, cwd: Path) -> dict[str, object]:
    """One ``otel-training report`` run of the package under ``code``: seconds, RSS, its summary."""
    command = ["/usr/bin/time", "-v", sys.executable, "-m", "otel_training.cli.main", "report", str(traces)]
    command += ["--html", str(html)] if html else ["--no-html"]
    env = dict(os.environ, PYTHONPATH=str(code))
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = [0]

    def sample() -> None:
        while process.poll() is None:
            peak[0] = max(peak[0], _tree_rss_kb(process.pid))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = process.communicate()
    seconds = time.perf_counter() - started
    sampler.join()
    if process.returncode:
        raise RuntimeError(f"{' '.join(command)} failed ({process.returncode}):\n{err[-3000:]}")
    largest = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", err).group(1))  # type: ignore[union-attr]
    summary = "\n".join(line for line in out.splitlines() if not line.startswith("html report:"))
    return {"seconds": seconds, "rss_mb": largest / 1024, "tree_mb": peak[0] / 1024, "summary": summary}


def _figures(summary: str) -> str:
    """A summary without its input problems (the spans a repeated input dropped are said there)."""
    lines = summary.splitlines()
    cut = next((index for index, line in enumerate(lines) if line.startswith("input problems")), len(lines))
    return "\n".join(lines[:cut])


def repeat_files(traces: Path, times: int) -> None:
    """Each file's content written ``times`` times over, in place (a chunk at a time)."""
    for path in sorted(traces.iterdir()):
        once = path.with_name(path.name + ".once")
        path.rename(once)
        with path.open("wb") as out:
            for _ in range(times):
                with once.open("rb") as source:
                    shutil.copyfileobj(source, out, 16 << 20)
        once.unlink()


def old_code(ref: str, into: Path) -> Path:
    """The package as it was at ``ref`` (git archive), importable from ``into``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "otel_training"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1M,10M", help="spans per job, comma-separated (default: %(default)s)")
    parser.add_argument("--ranks", default="8,100,1000", help="ranks of each size, in order (the last repeats)")
    parser.add_argument("--restarts", type=int, default=1)
    parser.add_argument("--html-up-to", default="10M", help="also time the HTML page up to this size")
    parser.add_argument("--before-up-to", default="1M",
                        help="run the code before up to this size (it holds every span: ~0.9 GB a million)")
    parser.add_argument("--old-ref", default=BEFORE_STREAMING,
                        help="git ref of the code to compare (default: %(default)s, the report before it streamed)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="also time the summary of each job with every file's content this many times over")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "bench-report")
    parser.add_argument("--keep", action="store_true", help="keep the generated traces")
    args = parser.parse_args()
    sizes = [_count(size) for size in args.sizes.split(",")]
    ranks = [int(rank) for rank in args.ranks.split(",")]
    ref = args.old_ref
    args.dir.mkdir(parents=True, exist_ok=True)
    rows: list[tuple[int, int, str, str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="bench-report-code-") as scratch:
        old = old_code(ref, Path(scratch))
        for index, size in enumerate(sizes):
            size_ranks = ranks[min(index, len(ranks) - 1)]
            traces = args.dir / f"traces-{size}"
            shutil.rmtree(traces, ignore_errors=True)
            started = time.perf_counter()
            spans = generate(traces, size, size_ranks, args.restarts, workers=2)
            megabytes = sum(path.stat().st_size for path in traces.iterdir()) / 1e6
            print(f"generated {spans:,} spans, {size_ranks} ranks, {args.restarts} restart(s): {megabytes:,.0f} MB "
                  f"in {time.perf_counter() - started:.0f} s", flush=True)
            versions = [("this", ROOT)] + ([("before", old)] if size <= _count(args.before_up_to) else [])
            once: dict[str, dict[str, Any]] = {}
            for mode in ("summary", "summary+html"):
                if mode == "summary+html" and size > _count(args.html_up_to):
                    continue
                results: dict[str, dict[str, Any]] = {}
                for name, code in versions:
                    html = args.dir / f"report-{name}.html" if mode == "summary+html" else None
                    results[name] = result = run_report(code, traces, html, cwd=args.dir)
                    rows.append((spans, size_ranks, mode, name, result))
                    print(f"  {mode:<13} {name:<7} {result['seconds']:7.1f} s  "
                          f"{result['seconds'] / spans * 1e6:5.2f} s/M spans  rss {result['rss_mb']:7.0f} MB  "
                          f"tree {result['tree_mb']:7.0f} MB", flush=True)
                if "before" in results:
                    same = results["this"]["summary"] == results["before"]["summary"]
                    print(f"  {mode}: the two summaries are {'identical' if same else 'DIFFERENT'}; "
                          f"this is {results['before']['seconds'] / results['this']['seconds']:.1f}x faster, "
                          f"{results['before']['tree_mb'] / results['this']['tree_mb']:.1f}x less memory", flush=True)
                if mode == "summary":
                    once = results
            if args.repeat > 1:
                repeat_files(traces, args.repeat)
                mode = f"summary x{args.repeat}"
                for name, code in versions:
                    result = run_report(code, traces, None, cwd=args.dir)
                    rows.append((spans * args.repeat, size_ranks, mode, name, result))
                    same = _figures(result["summary"]) == _figures(once[name]["summary"])
                    print(f"  {mode:<13} {name:<7} {result['seconds']:7.1f} s  "
                          f"{result['seconds'] / spans / args.repeat * 1e6:5.2f} s/M spans read  "
                          f"rss {result['rss_mb']:7.0f} MB  tree {result['tree_mb']:7.0f} MB; figures "
                          f"{'identical to' if same else 'DIFFERENT from'} the input written once", flush=True)
            if not args.keep:
                shutil.rmtree(traces)
    print(f"\n{'spans':>6} {'ranks':>5} {'mode':<13} {'code':<7} {'s':>7} {'s/M':>6} {'rss MB':>7} {'tree MB':>8}")
    for spans, size_ranks, mode, name, result in rows:
        print(f"{spans / 1e6:>5.1f}M {size_ranks:>5} {mode:<13} {name:<7} {result['seconds']:7.1f} "
              f"{result['seconds'] / spans * 1e6:6.2f} {result['rss_mb']:7.0f} {result['tree_mb']:8.0f}")
    held = " (the report that held every span)" if ref == BEFORE_STREAMING else ""
    print(f"\n'before' is {ref[:12]}{held}; rss: the largest process, as "
          "/usr/bin/time -v reports it; tree: the parent and its workers together, sampled"
          + (f"; x{args.repeat}: every span {args.repeat} times, the spans read counted." if args.repeat > 1 else "."))
    return 0


if __name__ == "__main__":
    sys.exit(main())
