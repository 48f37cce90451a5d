"""The stuck detector's alert sink: a ``training.alert`` span, a counter and a log line per alert.

The alert span is parented to and linked to the stuck span, in the stuck
span's trace, and ended at once: the stuck span itself is exported only when it
ends, which a hung step never does. With no provider given, the alert goes
through the stuck span's own pipeline (its resource, processors and exporter).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import metrics as metrics_api
from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Span, TracerProvider
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext

from otel_training import semconv as sc
from otel_training._sdk_compat import span_pipeline, tracer_for_pipeline
from otel_training.processors import alert_context
from otel_training.processors.thresholds import Threshold

logger = logging.getLogger("otel_training")
_ids = RandomIdGenerator()


@dataclasses.dataclass(frozen=True)
class StuckEvent:
    """What ``on_stuck`` callbacks receive, for stuck and recovered alerts alike."""

    kind: str
    span_name: str
    span_context: SpanContext
    attributes: Mapping[str, Any]
    elapsed_s: float
    threshold_s: float
    threshold_source: str
    threshold_rule: str
    count: int
    stacks: str | None = None


class AlertSink:
    """Emits the alerts of one detector; ``flush_target`` is the pipeline its last alert went to."""

    def __init__(self, tracer_provider: TracerProvider | None, meter_provider: metrics_api.MeterProvider | None,
                 action: str) -> None:
        self._tracer = (tracer_provider.get_tracer(sc.INSTRUMENTATION_SCOPE, schema_url=sc.SCHEMA_URL)
                        if tracer_provider is not None else None)
        self._tracer_provider = tracer_provider
        meter = (meter_provider or metrics_api.get_meter_provider()).get_meter(
            sc.INSTRUMENTATION_SCOPE, schema_url=sc.SCHEMA_URL)
        self._counter = meter.create_counter(sc.METRIC_ALERTS, unit="{alert}",
                                             description="Stuck-span alerts, by kind (stuck, recovered, died).")
        self._action = action
        self._pipeline_tracers: dict[int, SdkTracer] = {}
        self.flush_target: Callable[[], Any] | None = None

    def emit(self, kind: str, span: Span, parent_context: Context | None, threshold: Threshold, count: int,
             elapsed: float, stacks: str | None) -> StuckEvent:
        context = span.get_span_context()
        attributes: dict[str, Any] = {}
        parent = trace_api.get_current_span(parent_context) if parent_context is not None else None
        parent_attributes = getattr(parent, "attributes", None)
        if parent_attributes and sc.EPOCH in parent_attributes:
            attributes[sc.EPOCH] = parent_attributes[sc.EPOCH]
        attributes.update(span.attributes or {})
        if kind == sc.ALERT_KIND_STUCK:
            attributes.update(alert_context.collect())  # e.g. the collective this rank is inside
        attributes.update({
            sc.ALERT_KIND: kind,
            sc.ALERT_SOURCE: sc.ALERT_SOURCE_PROCESSOR,
            sc.ALERT_SPAN_NAME: span.name,
            sc.ALERT_SPAN_ID: f"{context.span_id:016x}",
            sc.ALERT_ELAPSED_S: round(elapsed, 6),
            sc.ALERT_THRESHOLD_S: threshold.seconds,
            sc.ALERT_THRESHOLD_SOURCE: threshold.source,
            sc.ALERT_THRESHOLD_RULE: threshold.rule,
            sc.ALERT_COUNT: count,
        })
        if stacks is not None:
            attributes[sc.ALERT_STACKS] = stacks
        if kind == sc.ALERT_KIND_STUCK and self._action != "none":
            attributes[sc.ALERT_ACTION] = self._action
        if kind == sc.ALERT_KIND_STUCK and count > 1:
            attributes[sc.ALERT_REPEAT] = True  # one episode, one recovery: rules count first alerts only
        self._export(span, context, attributes)
        self._counter.add(1, {sc.ALERT_KIND: kind, sc.ALERT_SPAN_NAME: span.name})
        level = logging.WARNING if kind == sc.ALERT_KIND_STUCK else logging.INFO
        logger.log(level, "otel_training: %s %s (span %016x) %s after %.3f s (threshold %.3f s, %s)",
                   span.name, _describe(span.attributes), context.span_id, kind, elapsed,
                   threshold.seconds, threshold.source)
        return StuckEvent(kind, span.name, context, attributes, elapsed, threshold.seconds,
                          threshold.source, threshold.rule, count, stacks)

    def _export(self, span: Span, context: SpanContext, attributes: dict[str, Any]) -> None:
        """End an alert span at once, in the watched span's trace, and remember where to flush it."""
        links = [Link(context, {sc.LINK_TYPE: sc.LINK_ALERTED})]
        if self._tracer is not None:
            parent = trace_api.set_span_in_context(NonRecordingSpan(context))
            self._tracer.start_span(sc.SPAN_ALERT, context=parent, attributes=attributes, links=links).end()
            self.flush_target = self._tracer_provider.force_flush  # type: ignore[union-attr]
            return
        # No provider given: use the stuck span's own pipeline (resource, processors, exporter).
        pipeline = span_pipeline(span)
        if pipeline is None:
            return  # not an SDK span: there is no pipeline to put the alert in
        tracer = self._pipeline_tracers.get(id(pipeline))
        if tracer is None:
            tracer = tracer_for_pipeline(span.resource, pipeline, ALWAYS_ON, _ids,
                                         InstrumentationScope(sc.INSTRUMENTATION_SCOPE, schema_url=sc.SCHEMA_URL))
            self._pipeline_tracers = {id(pipeline): tracer}  # one pipeline in practice; keep it bounded
        parent = trace_api.set_span_in_context(NonRecordingSpan(context))
        tracer.start_span(sc.SPAN_ALERT, context=parent, attributes=attributes, links=links).end()
        self.flush_target = pipeline.force_flush


def _describe(attributes: Mapping[str, Any] | None) -> str:
    if not attributes:
        return ""
    parts = [f"{key.rsplit('.', 1)[-1]} {attributes[key]}" for key in (sc.EPOCH, sc.STEP) if key in attributes]
    return ", ".join(parts)
