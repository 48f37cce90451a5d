"""Cost per step span of ``trainer.step()`` vs a bare OpenTelemetry SDK span.

Both sides run on the same kind of pipeline (TracerProvider + BatchSpanProcessor
to an exporter that discards), interleaved in rounds within one process so
machine noise hits both alike. Costs are process CPU time (the batch worker's
export work included), and the figure of merit is the median of the per-round
ratios (goal <= 1.15); the spread of those ratios says how noisy the run was.

``--default-pipeline`` adds the figure users get: ``trainer.step()`` under the
default ``configure()`` options (metrics and live goodput on; exporter "none"
plus the same discarding BatchSpanProcessor; the exit/signal hooks, which cost
nothing per span, left off), and the training-thread cost of the
``GoodputSpanProcessor`` alone (on_start + on_end per step span, thread CPU
time) next to its cost on the metric reader's thread when it collects.

``--gc --ballast N`` leaves Python's cyclic GC on, with N objects kept alive as a
big program's heap would be: each side then also pays the collections its own
spans cause (a full collection walks the whole heap), which is what a training
process pays.

    .venv/bin/python bench/bench_events.py [--spans 20000] [--rounds 11] [--default-pipeline]
    .venv/bin/python bench/bench_events.py --default-pipeline --gc --ballast 2000000
    .venv/bin/python bench/bench_events.py --default-pipeline --offload

``--offload`` measures the C core and the pure-Python fallback (``native="off"``) in the same rounds.

``--instructions`` counts each side's instructions under callgrind instead (``bench/_callgrind.py``): the
same ratios, deterministic to a few parts in 10 000, for a machine whose speed varies from round to round:

    .venv/bin/python bench/bench_events.py --offload --spans 2000 --rounds 3 --instructions
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_training
from otel_training.processors.batch import CountingBatchSpanProcessor
from otel_training.processors.goodput import GoodputSpanProcessor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _callgrind

#: The side being measured (main() sets it), for the instruction counts' labels.
_SIDE = [""]


def _measure_begins(n: int) -> int:
    """The measured loop of ``n`` steps begins: its CPU clock, and a callgrind segment under ``--instructions``."""
    _callgrind.mark(_SIDE[0], n)
    return time.process_time_ns()


def _measure_ends(start: int) -> int:
    elapsed = time.process_time_ns() - start
    _callgrind.mark(None)
    return elapsed


class _Discard(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS


def bare_sdk(n: int) -> float:
    provider = TracerProvider(resource=Resource.create({}), shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(_Discard()))
    tracer = provider.get_tracer("bench")
    start = _measure_begins(n)
    with tracer.start_as_current_span("training.epoch"):  # steps live in an epoch, as in training
        for step in range(n):
            with tracer.start_as_current_span("training.step",
                                              attributes={"training.step": step, "training.batch.size": 32}):
                pass
    elapsed = _measure_ends(start)
    provider.shutdown()
    return elapsed / n / 1000


def otel_training_step(n: int, **options: bool) -> float:
    options = {"metrics": False, "goodput": False, "offload": False, **options}  # in-process unless asked
    telemetry = otel_training.configure(reconfigure=True, exporter="none", signal_hooks=False, exception_hooks=False,
                                        **options)
    if options["goodput"]:
        # configure() installs it only with a metric exporter (file or otlp); with
        # exporter "none" add it by hand so the row measures what users run.
        telemetry.add_span_processor(GoodputSpanProcessor(telemetry.meter_provider))
    # Same sink as the bare side: a BatchSpanProcessor to a discarding exporter.
    batch = CountingBatchSpanProcessor(_Discard())
    telemetry.add_span_processor(batch)
    trainer = otel_training.TrainerProcess()
    start = _measure_begins(n)
    with trainer.epoch(epoch=0):  # so the trace-size budget is counted, as in training
        for step in range(n):
            with trainer.step(global_step=step, batch_size=32):
                pass
    elapsed = _measure_ends(start)
    telemetry.shutdown(timeout_s=5)
    return elapsed / n / 1000


def offload_step(n: int, native: str = "auto") -> float:
    """``trainer.step()`` with ``offload=True`` and the default options, to a real trace file.

    The figure is the training process's CPU (all its threads); the drain process's CPU per
    span and the spans it delivered (counted from the file) are kept in ``OFFLOAD_SEEN``.
    Timed once the drain runs (the C core writes its fast records only from then on).
    """
    directory = tempfile.mkdtemp(prefix="bench-offload-")
    try:
        telemetry = otel_training.configure(reconfigure=True, exporter="file", output_dir=directory, offload=True,
                                            signal_hooks=False, exception_hooks=False, native=native)
        if not telemetry.drain_ready(timeout_s=30):
            raise SystemExit("the drain process did not start within 30 s")
        drain_cpu = _cpu_of(telemetry._drain.pid)
        trainer = otel_training.TrainerProcess()
        start = _measure_begins(n)
        with trainer.epoch(epoch=0):
            for step in range(n):
                with trainer.step(global_step=step, batch_size=32):
                    pass
        elapsed = _measure_ends(start)
        telemetry.force_flush(timeout_s=60)
        drain_cpu = _cpu_of(telemetry._drain.pid) - drain_cpu
        telemetry.shutdown(timeout_s=30)
        steps = 0
        for path in Path(directory).glob("traces-*.jsonl"):
            steps += path.read_text().count('"name":"training.step"')
        (OFFLOAD_SEEN if native != "off" else FALLBACK_SEEN).append((drain_cpu / n * 1e6, steps, n))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return elapsed / n / 1000


#: Per offload round: the drain's CPU µs per step, steps delivered, steps made (C core; fallback).
OFFLOAD_SEEN: list[tuple[float, int, int]] = []
FALLBACK_SEEN: list[tuple[float, int, int]] = []


def offload_fallback_step(n: int) -> float:
    """The same on the pure-Python fallback (``native="off"``): the C core's gain, side by side."""
    return offload_step(n, native="off")


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def default_pipeline_step(n: int) -> float:
    """``trainer.step()`` with the default options: metrics and live goodput on."""
    return otel_training_step(n, metrics=True, goodput=True)


def goodput_processor(n: int) -> tuple[float, float]:
    """µs per step span of the GoodputSpanProcessor: on the training thread, and at collection."""
    reader = InMemoryMetricReader()
    processor = GoodputSpanProcessor(MeterProvider(metric_readers=[reader], shutdown_on_exit=False))
    provider = TracerProvider(shutdown_on_exit=False)
    finished = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(finished))
    tracer = provider.get_tracer("bench")
    spans = [tracer.start_span("training.step", attributes={"training.step": step, "training.batch.size": 32})
             for step in range(n)]
    for span in spans:
        span.end()
    # As the SDK calls them: on_start with the live span, on_end with the copy its end() makes.
    pairs = list(zip(spans, finished.get_finished_spans()))
    start = time.thread_time_ns()
    for span, ended in pairs:
        processor.on_start(span)
        processor.on_end(ended)
    on_thread = time.thread_time_ns() - start
    start = time.thread_time_ns()
    reader.get_metrics_data()
    collecting = time.thread_time_ns() - start
    return on_thread / n / 1000, collecting / n / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--default-pipeline", action="store_true",
                        help="also measure trainer.step() with the default options (metrics, goodput) "
                             "and the GoodputSpanProcessor alone")
    parser.add_argument("--offload", action="store_true",
                        help="also measure trainer.step() with offload=True (default options, a real trace file)")
    parser.add_argument("--gc", action="store_true", help="leave the cyclic GC on while measuring")
    parser.add_argument("--ballast", type=int, default=0, help="objects kept alive meanwhile (default: %(default)s)")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions under callgrind instead of CPU time (deterministic; "
                             "bench/_callgrind.py; try --spans 2000 --rounds 3: valgrind runs ~50x slower)")
    args = parser.parse_args()
    if args.instructions and not _callgrind.active():
        report_instructions(args, _callgrind.run(sys.argv))
        return
    ballast = [{"i": index, "children": []} for index in range(args.ballast // 3)]  # a dict and a list each
    sides = {"bare": bare_sdk, "ours": otel_training_step}
    if args.default_pipeline:
        sides["default"] = default_pipeline_step
        sides["goodput"] = goodput_processor
    if args.offload:
        sides["offload"] = offload_step
        sides["fallback"] = offload_fallback_step
    for measure in sides.values():
        measure(min(2000, args.spans))  # warm up imports and caches
    _callgrind.start()
    OFFLOAD_SEEN.clear()
    FALLBACK_SEEN.clear()
    results: dict[str, list] = {name: [] for name in sides}
    for round_index in range(args.rounds):
        # Same conditions for all: a collected heap, no collection mid-measure,
        # and the order rotated so no side always runs first or last.
        names = list(sides)
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            _SIDE[0] = name
            gc.collect()
            if not args.gc:
                gc.disable()
            try:
                results[name].append(sides[name](args.spans))
            finally:
                gc.enable()
    del ballast
    if _callgrind.active():
        _callgrind.finish()
        return
    if args.gc:
        print(f"cyclic GC on, {len(gc.get_objects())} objects tracked after the ballast was freed (+{args.ballast})")
    bare = results["bare"]
    b = statistics.median(bare)
    print(f"bare SDK span + BatchSpanProcessor    : {b:6.1f} µs CPU/span (median of {args.rounds} rounds of {args.spans})")
    rows = [("ours", "trainer.step(), metrics+goodput off")]
    if args.default_pipeline:
        rows.append(("default", "trainer.step(), configure(offload=False), other options default"))
    if args.offload:
        rows.append(("offload", "trainer.step(), offload=True"))
        rows.append(("fallback", "  the same, pure-Python fallback"))
    for name, label in rows:
        ratios = [side / base for side, base in zip(results[name], bare)]
        print(f"{label:38s}: {statistics.median(results[name]):6.1f} µs CPU/span, ratio to bare "
              f"{statistics.median(ratios):.3f} median of per-round ratios "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f}; goal <= {1.15 if name in ('ours', 'default') else 0.2}); "
              f"at the floor {min(results[name]) / min(bare):.3f} (each side's fastest round: noise only adds)")
    if args.offload:
        ratios = [native / fallback for native, fallback in zip(results["offload"], results["fallback"])]
        print(f"{'  C core / fallback':38s}: {statistics.median(ratios):.3f} median of per-round ratios "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f})")
        for label, seen_rows in (("C core", OFFLOAD_SEEN), ("fallback", FALLBACK_SEEN)):
            drain = statistics.median(seen[0] for seen in seen_rows)
            delivered, made = sum(seen[1] for seen in seen_rows), sum(seen[2] for seen in seen_rows)
            print(f"{'  the drain process, per step (' + label + ')':38s}: {drain:6.1f} µs CPU (another process); "
                  f"steps delivered to the trace file: {delivered} of {made}")
    if args.default_pipeline:
        on_thread = statistics.median(cost[0] for cost in results["goodput"])
        collecting = statistics.median(cost[1] for cost in results["goodput"])
        print(f"GoodputSpanProcessor per step span    : {on_thread:6.2f} µs on the training thread (on_start + on_end), "
              f"{collecting:.2f} µs on the metric reader's thread")


def report_instructions(args: argparse.Namespace, per_span: dict[str, list[float]]) -> None:
    """``--instructions``: each side's instructions a span (all the process's threads), and its ratio to the bare
    SDK span's, round by round. Both sides are mostly the same interpreter running Python, so the ratio reads
    close to a CPU-time ratio; the drain process (offload) is not counted, as its CPU is not on the CPU side."""
    bare = per_span["bare"]
    print(f"instructions a span counted by callgrind, {args.rounds} rounds of {args.spans} "
          f"(median; min-max over rounds)")
    print(f"bare SDK span + BatchSpanProcessor    : {statistics.median(bare):9.0f} ({min(bare):.0f}-{max(bare):.0f})")
    labels = {"ours": "trainer.step(), metrics+goodput off", "default": "trainer.step(), offload=False, defaults",
              "offload": "trainer.step(), offload=True", "fallback": "  the same, pure-Python fallback"}
    for name, label in labels.items():
        if name in per_span:
            ratios = [side / base for side, base in zip(per_span[name], bare)]
            print(f"{label:38s}: {statistics.median(per_span[name]):9.0f}, ratio to bare "
                  f"{statistics.median(ratios):.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f}; goal <= "
                  f"{1.15 if name in ('ours', 'default') else 0.2})")


if __name__ == "__main__":
    main()
