"""Cost per step span of ``trainer.step()`` vs a bare OpenTelemetry SDK span.

Both sides run on the same kind of pipeline (TracerProvider + BatchSpanProcessor
to an exporter that discards), interleaved in rounds within one process so
machine noise hits both alike. Costs are process CPU time (the batch worker's
export work included), and the figure of merit is the median of the per-round
ratios (goal <= 1.15); the spread of those ratios says how noisy the run was.

    .venv/bin/python bench/bench_events.py [--spans 20000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import otel_training
from otel_training.config import telemetry as telemetry_module


class _Discard(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS


def bare_sdk(n: int) -> float:
    provider = TracerProvider(resource=Resource.create({}), shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(_Discard()))
    tracer = provider.get_tracer("bench")
    start = time.process_time_ns()
    for step in range(n):
        with tracer.start_as_current_span("training.step", attributes={"training.step": step, "training.batch.size": 32}):
            pass
    elapsed = time.process_time_ns() - start
    provider.shutdown()
    return elapsed / n / 1000


def otel_training_step(n: int) -> float:
    telemetry = otel_training.configure(reconfigure=True, exporter="none", metrics=False, goodput=False,
                                        signal_hooks=False, exception_hooks=False)
    # Same sink as the bare side: a BatchSpanProcessor to a discarding exporter.
    batch = telemetry_module._CountingBatchSpanProcessor(_Discard())
    telemetry.add_span_processor(batch)
    trainer = otel_training.TrainerProcess()
    start = time.process_time_ns()
    for step in range(n):
        with trainer.step(global_step=step, batch_size=32):
            pass
    elapsed = time.process_time_ns() - start
    telemetry.shutdown(timeout_s=5)
    return elapsed / n / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    bare_sdk(2000), otel_training_step(2000)  # warm up imports and caches
    bare, ours, ratios = [], [], []
    for round_index in range(args.rounds):
        # Same conditions for both: a collected heap, no collection mid-measure,
        # and the order alternated so neither side always runs second.
        sides = [(bare, bare_sdk), (ours, otel_training_step)]
        for results, measure in sides if round_index % 2 == 0 else reversed(sides):
            gc.collect()
            gc.disable()
            try:
                results.append(measure(args.spans))
            finally:
                gc.enable()
        ratios.append(ours[-1] / bare[-1])
    b, o = statistics.median(bare), statistics.median(ours)
    print(f"bare SDK span + BatchSpanProcessor : {b:6.1f} µs CPU/span (median of {args.rounds} rounds of {args.spans})")
    print(f"trainer.step() (otel_training)      : {o:6.1f} µs CPU/span")
    print(f"ratio trainer.step / bare SDK       : {statistics.median(ratios):.3f} median of per-round ratios "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}; goal <= 1.15)")


if __name__ == "__main__":
    main()
