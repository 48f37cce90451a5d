"""The one way the events API and the integrations make a span: within the trace budget, errors recorded alike.

``Duration`` (spans begun and ended as work happens) and ``record_span`` (spans
recorded after the fact with measured times) both start their spans here, so
both count against ``trace_max_spans``/``trace_max_age_s`` and both fail a span
the same way: status ERROR first, then the details, never raising however the
error's ``__str__`` behaves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, Status, StatusCode

from otel_training import semconv as sc
from otel_training._contain import contain, log_once
from otel_training._sdk_compat import trace_id_of
from otel_training._text import text
from otel_training.events.runtime import EventsRuntime


def start_span(rt: EventsRuntime, name: str, *, context: Context | None = None,
               attributes: Mapping[str, Any] | None = None, links: Sequence[Link] | None = None,
               start_time: int | None = None, charge: bool = True) -> Span:
    """A span of ``rt``'s tracer; ``charge``: count it in its trace's budget."""
    span = rt.tracer.start_span(name, context=context, attributes=attributes, links=links, start_time=start_time)
    if charge:
        rt.charge(trace_id_of(span.get_span_context()))
    return span


def start_child(rt: EventsRuntime, name: str, parent: Span, attributes: Mapping[str, Any] | None,
                charge: bool, current: bool = True) -> Span:
    """``start_span(rt, name, context=..., attributes=attributes, charge=charge)`` with ``parent`` the parent
    span, for a caller that has just read it (``current``: it is the current span, the usual case, or a trace
    segment the current span continues in): the offloaded pipeline's tracer then makes the child without
    reading the context again (``RecordTracer.start_child``), a step's hot path; any other tracer is given a
    context only when the parent is not the current span."""
    starter = rt.start_child
    if starter is not None:
        span = starter(name, parent, attributes)
    else:
        span = rt.tracer.start_span(name, None if current else trace_api.set_span_in_context(parent),
                                    attributes=attributes)
    if charge:
        rt.charge(trace_id_of(span.get_span_context()))
    return span


def begin_failed() -> None:
    """An internal error in a Duration's begin, contained: logged once (the C core's begin logs through it too)."""
    log_once("Duration.begin", "otel_training: internal error in Duration.begin; training continues")


def end_failed() -> None:
    """An internal error in a Duration's end, contained: logged once (the C core's end logs through it too)."""
    log_once("Duration.end", "otel_training: internal error in Duration.end; training continues")


def record_error(span: Span, error: BaseException | str | None) -> None:
    """Status ERROR first, then the details: an exception whose ``__str__`` raises still fails the span."""
    if isinstance(error, BaseException):
        span.set_attribute(sc.ERROR_TYPE, type(error).__qualname__)
        span.set_status(Status(StatusCode.ERROR, text(f"{type(error).__name__}: {text(error)}"[:512])))
        # The SDK calls str(error); the status above already says it failed.
        with contain("record_exception", "otel_training: could not record an exception's details", exc_info=False):
            span.record_exception(error, escaped=True)
    else:
        message = "" if error is None else text(error)[:512]
        span.set_attribute(sc.ERROR_TYPE, "error")
        span.set_status(Status(StatusCode.ERROR, message or None))
