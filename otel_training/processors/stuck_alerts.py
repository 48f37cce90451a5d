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
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext

from otel_training import semconv as sc
from otel_training._ids import PrivateIdGenerator
from otel_training._sdk_compat import span_pipeline, tracer_for_pipeline
from otel_training.processors import alert_context
from otel_training.processors.thresholds import Threshold

logger = logging.getLogger("otel_training")
_ids = PrivateIdGenerator()


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
             elapsed: float, stacks: str | None, stacks_missing: str | None = None,
             stacks_source: str | None = None, process_context: Mapping[str, Any] | None = None) -> StuckEvent:
        """``stacks_missing``: why the stacks could not be taken (``training.alert.stacks.error``);
        ``stacks_source``: who took them, when not the process's own Python (``training.alert.stacks.source``);
        ``process_context``: the stuck span's process's ``alert_context``, when that is another process."""
        context = span.get_span_context()
        attributes: dict[str, Any] = {}
        parent = trace_api.get_current_span(parent_context) if parent_context is not None else None
        parent_attributes = getattr(parent, "attributes", None)
        if parent_attributes and sc.EPOCH in parent_attributes:
            attributes[sc.EPOCH] = parent_attributes[sc.EPOCH]
        attributes.update(span.attributes or {})
        if kind == sc.ALERT_KIND_STUCK:  # e.g. the collective this rank is inside: the span's process's own
            attributes.update(alert_context.collect() if process_context is None else process_context)
        attributes.update(alert_attributes(kind, sc.ALERT_SOURCE_PROCESSOR, count, span.name, context.span_id,
                                           elapsed, threshold.seconds, threshold.source))
        attributes[sc.ALERT_THRESHOLD_RULE] = threshold.rule
        if stacks is not None:
            attributes[sc.ALERT_STACKS] = stacks
        if stacks_missing is not None:
            attributes[sc.ALERT_STACKS_ERROR] = stacks_missing
        if stacks_source is not None:
            attributes[sc.ALERT_STACKS_SOURCE] = stacks_source
        if kind == sc.ALERT_KIND_STUCK and self._action != "none":
            attributes[sc.ALERT_ACTION] = self._action
        self._export(span, context, attributes)
        self._counter.add(1, {sc.ALERT_KIND: kind, sc.ALERT_SPAN_NAME: span.name})
        level = logging.WARNING if kind == sc.ALERT_KIND_STUCK else logging.INFO
        repeat = kind == sc.ALERT_KIND_STUCK and count > 1
        # Every alert is exported; the log gets the first, then repeats 2, 4, 8...: a 90 s hang with a 3 s
        # escalation wrote 30 lines to the training script's stderr.
        if not repeat or count & (count - 1) == 0:
            logger.log(level, "otel_training: %s %s (span %016x) %s after %.3f s (threshold %.3f s, %s)%s",
                       span.name, _describe(span.attributes), context.span_id, kind, elapsed,
                       threshold.seconds, threshold.source,
                       f"; alert {count}, logged at 1, 2, 4, 8... (all are exported)" if repeat else "")
        return StuckEvent(kind, span.name, context, attributes, elapsed, threshold.seconds,
                          threshold.source, threshold.rule, count, stacks)

    def _export(self, span: Span, context: SpanContext, attributes: dict[str, Any]) -> None:
        """End an alert span at once, in the watched span's trace, and remember where to flush it."""
        if self._tracer is not None:
            end_alert_span(self._tracer, context, attributes)
            self.flush_target = self._tracer_provider.force_flush  # type: ignore[union-attr]  # _tracer is only set with a provider
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
        end_alert_span(tracer, context, attributes)
        self.flush_target = pipeline.force_flush


def alert_attributes(kind: str, source: str, count: int, span_name: str | None = None, span_id: int | None = None,
                     elapsed_s: float | None = None, threshold_s: float | None = None,
                     threshold_source: str | None = None) -> dict[str, Any]:
    """The attributes every alert has, from the in-process detector or the watchdog sidecar alike."""
    attributes: dict[str, Any] = {sc.ALERT_KIND: kind, sc.ALERT_SOURCE: source, sc.ALERT_COUNT: count}
    if span_name is not None and span_id is not None:
        attributes[sc.ALERT_SPAN_NAME] = span_name
        attributes[sc.ALERT_SPAN_ID] = f"{span_id:016x}"
    if elapsed_s is not None:
        attributes[sc.ALERT_ELAPSED_S] = round(elapsed_s, 6)
    if threshold_s is not None:
        attributes[sc.ALERT_THRESHOLD_S] = threshold_s
    if threshold_source is not None:
        attributes[sc.ALERT_THRESHOLD_SOURCE] = threshold_source
    if kind == sc.ALERT_KIND_STUCK and count > 1:
        attributes[sc.ALERT_REPEAT] = True  # one episode, one recovery: rules count first alerts only
    return attributes


def end_alert_span(tracer: trace_api.Tracer, alerted: SpanContext | None, attributes: Mapping[str, Any]) -> None:
    """A ``training.alert`` span, child of and linked to the span it alerts on (when there is one), ended at once."""
    context, links = None, []
    if alerted is not None:
        context = trace_api.set_span_in_context(NonRecordingSpan(alerted))
        links.append(Link(alerted, {sc.LINK_TYPE: sc.LINK_ALERTED}))
    tracer.start_span(sc.SPAN_ALERT, context=context, attributes=attributes, links=links).end()


def _describe(attributes: Mapping[str, Any] | None) -> str:
    if not attributes:
        return ""
    parts = [f"{key.rsplit('.', 1)[-1]} {attributes[key]}" for key in (sc.EPOCH, sc.STEP) if key in attributes]
    return ", ".join(parts)
