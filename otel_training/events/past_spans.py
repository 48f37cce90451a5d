"""Spans recorded after the fact, for work whose boundaries are known only once it is over.

Gradient-accumulation substeps are known to be substeps only when the second
backward pass of a step arrives, and a Hugging Face checkpoint save is reported
only after it is written; both are emitted with their measured start and end
times, as children of the span they belong to.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.trace import Span

from otel_training import semconv as sc
from otel_training.events.runtime import EventsRuntime, runtime
from otel_training.events.span_factory import record_error, start_span


def record_span(
    name: str,
    event_name: str,
    start_ns: int,
    end_ns: int,
    attributes: Mapping[str, Any],
    parent: Span | None = None,
    target: str = sc.TARGET_TRAINER,
    error: BaseException | str | None = None,
    events: EventsRuntime | None = None,
) -> Span:
    """Emit a finished span ``[start_ns, end_ns]`` (wall-clock ns) under ``parent`` (or the current span).

    An ``error`` (other than StopIteration) is recorded and sets status ERROR; a
    string is the message of a failure that has no exception (a rollout session
    marked failed). The ended span is returned so that work recorded after it,
    with its own measured times, can be its children. ``events``: the runtime of the
    ``Process`` it belongs to (one with an injected provider), else the pipeline's.
    """
    rt = events if events is not None else runtime()
    attrs = {sc.EVENT_TARGET: target, sc.EVENT_NAME: event_name}
    attrs.update(attributes)
    context = trace_api.set_span_in_context(parent) if parent is not None else None
    span = start_span(rt, name, context=context, attributes=attrs, start_time=start_ns)
    if error is not None and not isinstance(error, StopIteration):
        record_error(span, error)
    span.end(end_time=max(end_ns, start_ns))
    return span
