"""The pipeline's own account of its spans, as metrics: dropped, waited for, spooled.

Observable counters, read when the metric reader collects: the values are the pipeline's running totals
(``Telemetry.counts()``; offloaded, the drain's counts in the ring), so nothing is done per span to keep them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_training import semconv as sc

Observe = Callable[[CallbackOptions], Iterable[Observation]]


def register_span_counters(meter: Meter, dropped: Observe, queue_wait: Observe, spooled: Observe) -> None:
    """``training.telemetry.spans.dropped``, ``.spans.spooled`` and ``.span_queue.wait`` on ``meter``."""
    meter.create_observable_counter(
        sc.METRIC_SPANS_DROPPED, callbacks=[dropped], unit="{span}",
        description="Spans the exporter will never deliver (failed exports and queue overflow).")
    meter.create_observable_counter(
        sc.METRIC_SPAN_QUEUE_WAIT, callbacks=[queue_wait], unit="s",
        description="Time the threads ending spans waited for room in a full span queue.")
    meter.create_observable_counter(
        sc.METRIC_SPANS_SPOOLED, callbacks=[spooled], unit="{span}",
        description="Spans the collector could not take, written to the local spool instead.")
