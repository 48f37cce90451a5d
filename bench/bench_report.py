"""How long ``otel-training report`` takes per million spans.

Generates a synthetic job (ranks x restarts, steps with substeps, data waits,
evaluation, checkpoints, a straggler rank and a stuck step) as OTLP JSON Lines
files, exactly as the file exporter writes them, then times each phase of the
report side by side in one run: reading, analysis (goodput, deviation,
stragglers), the terminal summary, the HTML page, the Chrome trace.

Usage:
    .venv/bin/python bench/bench_report.py [--spans 200000] [--ranks 8] [--restarts 1] [--keep DIR]

The default size keeps the run within a couple of minutes on 2 cores; the
per-million figure is extrapolated linearly from it (reading and analysis are
linear in spans; sorting is n log n, so the extrapolation is slightly
optimistic at 10x the size), and the output says so.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from otel_training import semconv as sc

BATCH = 512  # spans per OTLP line, the batch span processor's export batch size
SPANS_PER_STEP = 4  # step, two substeps, a data wait


def _attrs(values: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for key, value in values.items():
        if isinstance(value, bool):
            out.append({"key": key, "value": {"boolValue": value}})
        elif isinstance(value, int):
            out.append({"key": key, "value": {"intValue": str(value)}})
        elif isinstance(value, float):
            out.append({"key": key, "value": {"doubleValue": value}})
        else:
            out.append({"key": key, "value": {"stringValue": str(value)}})
    return out


def generate(directory: Path, spans: int, ranks: int, restarts: int, seed: int = 0) -> int:
    """Write the synthetic job; returns the number of spans written."""
    rng = random.Random(seed)
    runs = restarts + 1
    steps_per_run = max(20, spans // (ranks * runs * SPANS_PER_STEP))
    straggler = ranks - 1 if ranks > 1 else None
    t0 = 1_700_000_000 * 10**9
    written = 0
    directory.mkdir(parents=True, exist_ok=True)
    ids = iter(range(1, 1 << 62))
    for rank in range(ranks):
        with open(directory / f"traces-r{rank}.jsonl", "w", encoding="utf-8") as handle:
            clock = t0
            step_number = 0
            for restart in range(runs):
                resource = {"attributes": _attrs({
                    sc.SERVICE_NAME: "bench", sc.TRAINING_JOB_ID: "bench-job", sc.TRAINING_RUN_ID: f"run-{restart}",
                    sc.TRAINING_RANK: rank, sc.TRAINING_RESTART_COUNT: restart, sc.TRAINING_ROLE: sc.ROLE_TRAINER})}
                trace_id = format(rng.getrandbits(128), "032x")
                batch: list[dict[str, Any]] = []

                def span(name: str, start: int, end: int, attrs: dict[str, Any] | None = None,
                         error: bool = False) -> str:
                    span_id = format(next(ids), "016x")
                    batch.append({"traceId": trace_id, "spanId": span_id, "name": name, "kind": 1,
                                  "startTimeUnixNano": str(start), "endTimeUnixNano": str(end),
                                  "attributes": _attrs(attrs or {}), "status": {"code": 2} if error else {}})
                    if len(batch) >= BATCH:
                        flush()
                    return span_id

                def flush() -> None:
                    nonlocal written
                    if batch:
                        handle.write(json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [
                            {"scope": {"name": sc.INSTRUMENTATION_SCOPE}, "spans": batch}]}]}) + "\n")
                        written += len(batch)
                        batch.clear()

                run_start = clock
                span(sc.SPAN_INIT, clock, clock + 2 * 10**9)
                clock += 2 * 10**9
                if restart:
                    span(sc.SPAN_LOAD_CHECKPOINT, clock, clock + 10**9)
                    clock += 10**9
                base = 0.1 * (1.5 if rank == straggler else 1.0)
                for index in range(steps_per_run):
                    wait = int(rng.uniform(0.002, 0.006) * 1e9)
                    span(sc.SPAN_DATA_WAIT, clock, clock + wait)
                    clock += wait
                    duration = int(base * rng.uniform(0.95, 1.1) * 1e9)
                    if rank == 0 and restart == 0 and index == steps_per_run // 3:
                        duration = 10 * 10**9  # a stuck step, alerted at 5 s
                    step_id = span(sc.SPAN_STEP, clock, clock + duration,
                                   {sc.STEP: step_number, sc.SAMPLES: 32, sc.TOKENS: 32 * 2048})
                    if duration == 10 * 10**9:
                        span(sc.SPAN_ALERT, clock + 5 * 10**9, clock + 5 * 10**9, {
                            sc.ALERT_KIND: sc.ALERT_KIND_STUCK, sc.ALERT_ELAPSED_S: 5.0, sc.ALERT_THRESHOLD_S: 2.0,
                            sc.ALERT_SPAN_NAME: sc.SPAN_STEP, sc.ALERT_SPAN_ID: step_id,
                            sc.ALERT_STACKS: "Thread MainThread, most recent call last:\n"
                                             "  File \"train.py\", line 88, in train_step\n    loss.backward()"})
                    for substep in range(2):
                        span(sc.SPAN_SUBSTEP, clock + substep * duration // 2, clock + (substep + 1) * duration // 2,
                             {sc.SUBSTEP: substep})
                    clock += duration
                    step_number += 1
                    if (index + 1) % max(1, steps_per_run // 4) == 0:
                        span(sc.SPAN_EVALUATE, clock, clock + 10**9)
                        span(sc.SPAN_SAVE_CHECKPOINT, clock + 10**9, clock + 15 * 10**8)
                        clock += 15 * 10**8
                last = restart == runs - 1
                span(sc.SPAN_PROCESS, run_start, clock + 10**8, error=not last)
                flush()
                clock += 10 * 10**9  # downtime before the restart
                step_number -= steps_per_run // 8  # progress lost since the last checkpoint
    return written


def measure(spans_wanted: int, args: argparse.Namespace, keep: bool) -> tuple[int, dict[str, float]]:
    """Generate a trace set of about ``spans_wanted`` spans and time each phase of the report on it."""
    from otel_training.report import build_report, read_paths, render_html, render_summary, write_chrome_trace

    with tempfile.TemporaryDirectory(prefix="bench-report-") as scratch:
        directory = args.keep if keep and args.keep else Path(scratch)
        started = time.perf_counter()
        spans = generate(directory / "traces", spans_wanted, args.ranks, args.restarts)
        size = sum(path.stat().st_size for path in (directory / "traces").iterdir())
        print(f"generated {spans:,} spans ({size / 1e6:.0f} MB OTLP JSON, {args.ranks} ranks, "
              f"{args.restarts} restart(s)) in {time.perf_counter() - started:.1f} s")
        phases: dict[str, float] = {}

        def timed(name: str, function: Any) -> Any:
            start = time.perf_counter()
            value = function()
            phases[name] = time.perf_counter() - start
            return value

        result = timed("read", lambda: read_paths([directory / "traces"], progress=False))
        assert not result.problems, result.problems
        report = timed("analyse", lambda: build_report(result.records))
        summary = timed("summary", lambda: render_summary(report))
        page = timed("html", lambda: render_html(report, result.records))
        (directory / "report.html").write_text(page, encoding="utf-8")
        timed("chrome", lambda: write_chrome_trace(result.records, directory / "chrome.json"))
        print(f"  {spans / phases['read']:,.0f} spans/s read; html page {len(page) / 1e6:.2f} MB; "
              + summary.splitlines()[1])
    return spans, phases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=200_000)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--restarts", type=int, default=1)
    parser.add_argument("--keep", type=Path, default=None, help="write the trace set (and reports) here and keep it")
    args = parser.parse_args()
    # Warm imports (matplotlib, tqdm) so the first size does not pay them alone.
    import matplotlib.pyplot  # noqa: F401

    sizes = (args.spans // 4, args.spans)
    measured = [measure(size, args, index == len(sizes) - 1) for index, size in enumerate(sizes)]
    (small_spans, small), (spans, large) = measured
    print(f"\n{'phase':<10} {'s @' + format(small_spans, ','):>14} {'s @' + format(spans, ','):>14} "
          f"{'s per 1M @small':>16} {'s per 1M @large':>16}")
    for name in large:
        print(f"{name:<10} {small[name]:>14.2f} {large[name]:>14.2f} "
              f"{small[name] / small_spans * 1e6:>16.1f} {large[name] / spans * 1e6:>16.1f}")
    report_phases = ("read", "analyse", "summary", "html")
    total = sum(large[name] for name in report_phases)
    print(f"\nreport (read + analyse + summary + html): {total:.1f} s for {spans:,} spans "
          f"= {total / spans * 1e6:.1f} s per million spans, extrapolated linearly (not measured at 1M; "
          f"the html part is mostly a fixed cost, so this overstates it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
