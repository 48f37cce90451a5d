"""A tracer whose spans are records in the offload ring, turned into SDK spans by the drain process.

``RecordSpan`` implements the OpenTelemetry API's ``Span``: the events API, the
integrations and the user's own code (through the global provider) use it as
any span (context, parentage, attributes, events, status, exceptions, links).
Beginning one writes a begin record (ids, parent, name, start time, attributes),
ending it writes an end record (end time and whatever was added meanwhile). No
SDK span, no attribute validation, no span processor runs here: the drain
process replays the records through the SDK and the pipeline's processors and
exporters (``pipeline/drain.py``), so the spans it exports are the ones this
process would have exported.

Sampling is decided here, with the SDK's sampler from the environment; the
default (parent-based, always on) costs nothing. Span limits are applied by
the drain's SDK.
"""

from __future__ import annotations

import logging
import marshal
import os
import time
import traceback
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from random import getrandbits
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.sampling import DEFAULT_ON, Decision, Sampler
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from otel_training._contain import log_once

logger = logging.getLogger("otel_training")

BEGIN, END, SCOPE, FLUSH, CLOSE = 1, 2, 3, 4, 5
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSAMPLED = TraceFlags(TraceFlags.DEFAULT)
_VALUE_TYPES = (str, bool, int, float, bytes)

#: ``emit(payload, begin)``: write one record (``begin`` None: a control record); False when it was dropped.
Emit = Callable[[bytes, "bool | None"], bool]


def _plain(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """What marshal can carry of attributes the SDK would accept (it drops the rest too)."""
    plain: dict[str, Any] = {}
    for key, value in attributes.items():
        if isinstance(value, _VALUE_TYPES):
            plain[str(key)] = value
        elif isinstance(value, (list, tuple)) and all(isinstance(item, _VALUE_TYPES) for item in value):
            plain[str(key)] = tuple(value)
        else:
            log_once(f"offload-attribute:{type(value).__name__}",
                     "otel_training: attribute %r of type %s dropped (not a valid attribute value)", key,
                     type(value).__name__, exc_info=False)
    return plain


def _dump(record: tuple[Any, ...]) -> bytes:
    try:
        return marshal.dumps(record)
    except ValueError:  # an attribute value marshal cannot carry: the SDK would refuse it as well
        return marshal.dumps(tuple(_plain(item) if isinstance(item, dict) else item for item in record))


def _links(links: Sequence[Link] | None) -> list[tuple[Any, ...]] | None:
    if not links:
        return None
    return [(link.context.trace_id, link.context.span_id, link.context.is_remote, int(link.context.trace_flags),
             dict(link.attributes or {})) for link in links if link.context.is_valid]


class RecordSpan(trace_api.Span):
    """A span that lives as two records in the ring (see the module docstring)."""

    __slots__ = ("_provider", "_context", "parent", "name", "start_time", "end_time", "kind", "_attributes",
                 "_updates", "_events", "_status", "_renamed", "_links")

    def __init__(self, provider: RecordTracerProvider, context: SpanContext, parent: SpanContext | None,
                 name: str, kind: SpanKind, start_time: int, attributes: Mapping[str, Any] | None) -> None:
        self._provider = provider
        self._context = context
        self.parent = parent
        self.name = name
        self.kind = kind
        self.start_time = start_time
        self.end_time: int | None = None
        self._attributes = attributes
        self._updates: dict[str, Any] | None = None
        self._events: list[tuple[str, int, dict[str, Any]]] | None = None
        self._status: Status | None = None
        self._renamed = False
        self._links: list[Link] | None = None

    # -- what the SDK's span offers for reading -----------------------------
    @property
    def attributes(self) -> dict[str, Any]:
        merged = dict(self._attributes or {})
        if self._updates:
            merged.update(self._updates)
        return merged

    @property
    def resource(self) -> Resource:
        return self._provider.resource

    @property
    def status(self) -> Status:
        return self._status or Status(StatusCode.UNSET)

    @property
    def events(self) -> list[tuple[str, int, dict[str, Any]]]:
        return list(self._events or ())

    # -- the API ------------------------------------------------------------
    def get_span_context(self) -> SpanContext:
        return self._context

    def is_recording(self) -> bool:
        return self.end_time is None

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        if self.end_time is None and attributes:
            if self._updates is None:
                self._updates = {}
            self._updates.update(attributes)

    def set_attribute(self, key: str, value: Any) -> None:
        if self.end_time is None:
            if self._updates is None:
                self._updates = {}
            self._updates[key] = value

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None,
                  timestamp: int | None = None) -> None:
        if self.end_time is None:
            if self._events is None:
                self._events = []
            self._events.append((name, time.time_ns() if timestamp is None else timestamp, dict(attributes or {})))

    def add_link(self, context: SpanContext, attributes: Mapping[str, Any] | None = None) -> None:
        if self.end_time is None and context.is_valid:
            if self._links is None:
                self._links = []
            self._links.append(Link(context, attributes))

    def update_name(self, name: str) -> None:
        if self.end_time is None:
            self.name = name
            self._renamed = True

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if self.end_time is not None:
            return
        if isinstance(status, StatusCode):
            status = Status(status, description)
        # As the SDK: OK is final, UNSET never overrides.
        if (self._status is not None and self._status.status_code is StatusCode.OK) or \
                status.status_code is StatusCode.UNSET:
            return
        self._status = status

    def record_exception(self, exception: BaseException, attributes: Mapping[str, Any] | None = None,
                         timestamp: int | None = None, escaped: bool = False) -> None:
        stacktrace = "".join(traceback.format_exception(type(exception), exception, exception.__traceback__))
        values = {"exception.type": type(exception).__name__, "exception.message": str(exception),
                  "exception.stacktrace": stacktrace, "exception.escaped": str(escaped)}
        if attributes:
            values.update(attributes)
        self.add_event("exception", values, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self.end_time is not None:
            return
        self.end_time = end_time = time.time_ns() if end_time is None else end_time
        status = self._status
        if self._updates is None and self._events is None and status is None and not self._renamed \
                and self._links is None:
            self._provider.emit(marshal.dumps((END, self._context.span_id, end_time)), False)
            return
        self._provider.emit(_dump((END, self._context.span_id, end_time, self._updates, self._events,
                          None if status is None else (status.status_code.value, status.description),
                          self.name if self._renamed else None, _links(self._links))), False)

    def __repr__(self) -> str:
        return f"RecordSpan({self.name!r}, span_id={self._context.span_id:016x})"


class RecordTracer(trace_api.Tracer):
    """Starts ``RecordSpan``s in one instrumentation scope."""

    def __init__(self, provider: RecordTracerProvider, scope: int) -> None:
        self._provider = provider
        self._scope = scope

    def start_span(self, name: str, context: Context | None = None, kind: SpanKind = SpanKind.INTERNAL,
                   attributes: Mapping[str, Any] | None = None, links: Sequence[Link] | None = None,
                   start_time: int | None = None, record_exception: bool = True,
                   set_status_on_exception: bool = True) -> trace_api.Span:
        provider = self._provider
        parent = trace_api.get_current_span(context).get_span_context()
        if parent.is_valid:
            trace_id, parent_id = parent.trace_id, parent.span_id
        else:
            trace_id, parent_id, parent = getrandbits(128) or 1, 0, None
        span_id = getrandbits(64) or 1
        sampler = provider.sampler
        trace_state = parent.trace_state if parent is not None else None
        if sampler is not DEFAULT_ON:
            result = sampler.should_sample(context, trace_id, name, kind, attributes, links)
            trace_state = result.trace_state
            if result.decision is not Decision.RECORD_AND_SAMPLE:
                return trace_api.NonRecordingSpan(SpanContext(trace_id, span_id, False, _UNSAMPLED, trace_state))
            if result.attributes:
                attributes = {**(attributes or {}), **result.attributes}
        elif parent is not None and not parent.trace_flags.sampled:
            return trace_api.NonRecordingSpan(SpanContext(trace_id, span_id, False, parent.trace_flags,
                                                          parent.trace_state))
        if start_time is None:
            start_time = time.time_ns()
        span_context = SpanContext(trace_id, span_id, False, _SAMPLED, trace_state)
        record = (BEGIN, span_id, trace_id, parent_id, parent is not None and parent.is_remote, name, start_time,
                  kind.value, attributes or None, _links(links), self._scope,
                  tuple(trace_state.items()) if trace_state else None)
        try:
            payload = marshal.dumps(record)
        except ValueError:
            payload = _dump(record)
        provider.emit(payload, True)
        return RecordSpan(provider, span_context, parent, name, kind, start_time, attributes)

    @contextmanager  # type: ignore[override]
    def start_as_current_span(self, name: str, context: Context | None = None, kind: SpanKind = SpanKind.INTERNAL,
                              attributes: Mapping[str, Any] | None = None, links: Sequence[Link] | None = None,
                              start_time: int | None = None, record_exception: bool = True,
                              set_status_on_exception: bool = True, end_on_exit: bool = True) -> Iterator[Any]:
        span = self.start_span(name, context, kind, attributes, links, start_time, record_exception,
                               set_status_on_exception)
        with trace_api.use_span(span, end_on_exit=end_on_exit, record_exception=record_exception,
                                set_status_on_exception=set_status_on_exception) as current:
            yield current


_providers: weakref.WeakSet[RecordTracerProvider] = weakref.WeakSet()


class RecordTracerProvider(trace_api.TracerProvider):
    """The training process's tracer provider when spans are offloaded (``offload=True``)."""

    def __init__(self, emit: Emit, resource: Resource, sampler: Sampler = DEFAULT_ON, *,
                 flush: Callable[[float], bool] = lambda timeout_s: True,
                 close: Callable[[], bool] = lambda: True) -> None:
        self.emit: Emit = emit
        self.resource = resource
        self.sampler = sampler
        self._flush = flush
        self._close = close
        self._tracers: dict[tuple[str, str | None, str | None], RecordTracer] = {}
        self.forked_spans = 0
        _providers.add(self)

    def get_tracer(self, instrumenting_module_name: str, instrumenting_library_version: str | None = None,
                   schema_url: str | None = None, attributes: Mapping[str, Any] | None = None) -> RecordTracer:
        key = (instrumenting_module_name, instrumenting_library_version, schema_url)
        tracer = self._tracers.get(key)
        if tracer is None:
            scope = len(self._tracers) + 1
            self.emit(_dump((SCOPE, scope, instrumenting_module_name, instrumenting_library_version, schema_url,
                             dict(attributes or {}) or None)), None)
            tracer = self._tracers.setdefault(key, RecordTracer(self, scope))
        return tracer

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Until the drain has exported every record written before this call (bounded)."""
        return self._flush(timeout_millis / 1000)

    def shutdown(self) -> bool:
        """Tell the drain to finish; it exports what is left and stops (bounded by the pipeline's deadline)."""
        return self._close()

    def _refuse_in_child(self, payload: bytes, begin: bool | None) -> bool:
        if begin:
            self.forked_spans += 1
            log_once("offload-forked", "otel_training: a process forked from one whose spans are offloaded records "
                     "no spans (the ring is its parent's); configure(reconfigure=True) in the child to record them",
                     exc_info=False)
        return False


def _after_fork_in_child() -> None:
    for provider in list(_providers):
        provider.emit = provider._refuse_in_child  # noqa: SLF001 - the ring belongs to the parent


os.register_at_fork(after_in_child=_after_fork_in_child)
