"""What the default pipeline keeps of a span between its end and its export: little the GC tracks.

A span waits in the batch queue (up to a batch or 5 s) and, for the goodput metrics, until the next
settling: long enough to be promoted to the GC's oldest generation. Promoted objects make Python run
full collections, each walking every object of the process (torch's and the model's) while the
training thread waits; bench/bench_torch_overhead.py prints them. The SDK's span objects bring a
lock, bounded containers and a flags object each; what the pipeline keeps must not.
"""

from __future__ import annotations

import collections
import gc

import otel_training
from otel_training import semconv as sc

#: Objects of the SDK's live spans that a kept span would hold on to.
_LIVE_SPAN_PARTS = ("_Span", "BoundedAttributes", "BoundedList", "TraceFlags", "lock", "deque")


def _tracked_by_type() -> collections.Counter[str]:
    return collections.Counter(type(thing).__name__ for thing in gc.get_objects())


def test_spans_waiting_for_export_and_settling_hold_no_live_span_parts(configure, monkeypatch) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")  # nothing exported meanwhile: all 300 stay queued
    configure(exporter="file", metrics=True)
    trainer = otel_training.TrainerProcess()
    with trainer.train():
        with trainer.step(global_step=0):  # warm-up: one-time objects (meters, caches) are made here
            pass
        gc.collect()
        gc.disable()
        try:
            before = _tracked_by_type()
            for index in range(1, 301):
                with trainer.step(global_step=index, **{sc.TOKENS: 128}):
                    pass
            grown = _tracked_by_type() - before
        finally:
            gc.enable()
    # 300 step spans are queued for export and for settling: none of their live parts is kept.
    assert all(grown[name] < 30 for name in _LIVE_SPAN_PARTS), {name: grown[name] for name in _LIVE_SPAN_PARTS}
    # What is kept is a compact copy per span (the span and its context), not ~15 objects.
    assert grown["ReadableSpan"] >= 300
    assert sum(count for name, count in grown.items() if name != "tuple") < 4 * 300, grown.most_common(8)
