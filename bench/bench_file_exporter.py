"""CPU time per span of turning a batch into the file exporter's OTLP JSON line: protobuf route vs direct.

"old" is the route the file exporter took before (and metrics still take): the
OTLP protobuf encoder, protobuf's JSON mapping, ids re-encoded as hex, then
``json.dumps``. "new" is ``span_json.spans_to_otlp_json``. Both encode the same
batches (checked to give the same text first), interleaved in rounds with the
order alternating, GC collected before and off during each measure; the
figures are medians over rounds and the ratio is the median of the per-round
ratios, with its spread. Only the encoding is timed: the write that follows is
the same for both.

Workloads: ``trainer``, the spans ``TrainerProcess`` emits for a loop of steps
with two substeps each (what the embedded default writes), and ``rich``, SDK
spans with eight attributes of every type, an event and a link, some of them
errors. Batches of 512 spans, the BatchSpanProcessor's default.

    .venv/bin/python bench/bench_file_exporter.py [--spans 6144] [--rounds 11]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's package, not another install

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_training
from otel_training.exporters.otlp_json import to_otlp_json
from otel_training.exporters.span_json import spans_to_otlp_json

BATCH = 512


def trainer_spans(count: int) -> list[ReadableSpan]:
    telemetry = otel_training.configure(reconfigure=True, exporter="none", metrics=False, goodput=False,
                                        signal_hooks=False, exception_hooks=False, offload=False)
    memory = InMemorySpanExporter()
    telemetry.add_span_processor(SimpleSpanProcessor(memory))
    trainer = otel_training.TrainerProcess()
    with trainer.epoch(epoch=0):
        for step in range(count // 3 + 1):
            with trainer.step(global_step=step, batch_size=32):
                with trainer.substep("forward"):
                    pass
                with trainer.substep("backward"):
                    pass
    telemetry.shutdown(timeout_s=5)
    return list(memory.get_finished_spans())[:count]


def rich_spans(count: int) -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "bench", "training.rank": 0}),
                              shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("bench", "1.0")
    with tracer.start_as_current_span("training.epoch") as epoch:
        link = trace.Link(epoch.get_span_context(), {"training.link.type": "alerted"})
        for index in range(count - 1):
            with tracer.start_as_current_span("training.step", links=[link], attributes={
                    "training.step": index, "training.epoch": 0, "training.loss": 0.25 + index * 1e-6,
                    "training.ok": index % 7 != 0, "training.phase": "train", "note": "naïve \"quoted\"\n",
                    "training.shape": (32, 3, 224, 224), "training.names": ["forward", "backward"]}) as span:
                span.add_event("training.checkpoint", {"path": f"/ckpt/{index}", "bytes": 1 << 30})
                if index % 10 == 0:
                    span.set_status(trace.Status(trace.StatusCode.ERROR, "loss is NaN"))
    provider.shutdown()
    return list(memory.get_finished_spans())[:count]


def old(batch: Sequence[ReadableSpan]) -> str:
    return to_otlp_json(encode_spans(batch))


def new(batch: Sequence[ReadableSpan]) -> str:
    return spans_to_otlp_json(batch)


def measure(encode: Callable[[Sequence[ReadableSpan]], str], batches: list[list[ReadableSpan]]) -> float:
    """µs of process CPU time per span."""
    gc.collect()
    gc.disable()
    try:
        start = time.process_time_ns()
        for batch in batches:
            encode(batch)
        elapsed = time.process_time_ns() - start
    finally:
        gc.enable()
    return elapsed / sum(len(batch) for batch in batches) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=12 * BATCH, help="spans per workload")
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    encoders = {"old": old, "new": new}
    print(f"µs of CPU per span, median of {args.rounds} interleaved rounds, {args.spans} spans in batches of {BATCH}")
    print(f"{'workload':10s} {'old (protobuf route)':>22s} {'new (span_json)':>16s} {'old/new':>8s}  spread of old/new")
    for workload, make in (("trainer", trainer_spans), ("rich", rich_spans)):
        spans = make(args.spans)
        batches = [spans[index:index + BATCH] for index in range(0, len(spans), BATCH)]
        for batch in batches:
            if old(batch) != new(batch):
                raise SystemExit(f"{workload}: the encoders disagree; not timing them")
        for encode in encoders.values():
            measure(encode, batches[:2])  # warm up caches
        results: dict[str, list[float]] = {name: [] for name in encoders}
        for round_index in range(args.rounds):
            names = list(encoders) if round_index % 2 == 0 else list(reversed(encoders))
            for name in names:
                results[name].append(measure(encoders[name], batches))
        ratios = [before / after for before, after in zip(results["old"], results["new"])]
        print(f"{workload:10s} {statistics.median(results['old']):22.1f} {statistics.median(results['new']):16.1f} "
              f"{statistics.median(ratios):8.1f}  {min(ratios):.1f}–{max(ratios):.1f}")


if __name__ == "__main__":
    main()
