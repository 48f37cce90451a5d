"""The offloaded span: what ``RecordTracer`` returns, two records in the ring (``record_tracer.py`` says how).

Why a module of its own: the span's API (what the events API, the integrations and the user's own code call)
is one thing, the tracer that decides sampling and parentage another. The span's storage is either slots
(``PyRecordSpan``: the pure-Python fallback, and spans begun on the marshal path) or the C core's fields
(``NativeRecordSpan``, over ``native/span.c``), and every API method below serves both.
"""

from __future__ import annotations

import marshal
import threading
import time
import traceback
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode

from otel_training.pipeline.records import END, encode, encode_links

if TYPE_CHECKING:
    from otel_training.pipeline.record_tracer import RecordTracerProvider

#: Two threads ending one span (the signal path's ``end_open_spans`` and the span's own) write one end.
_END_LOCK = threading.Lock()


class RecordSpan(trace_api.Span):
    """A span that lives as two records in the ring (see the module docstring).

    Its storage is a subclass's: ``PyRecordSpan``'s slots, or, with the C core, ``NativeRecordSpan``'s C fields
    (``native/span.c``), whose begin is one call (``begin_span``) and whose ``end`` writes the end record in C
    when nothing but attributes was added. Both read and write the same names, so the methods here serve both.
    """

    __slots__ = ()

    _provider: RecordTracerProvider
    _context: SpanContext
    parent: SpanContext | None
    name: str
    start_time: int
    end_time: int | None
    kind: SpanKind
    _attributes: Mapping[str, Any] | None
    _updates: dict[str, Any] | None
    _events: list[tuple[str, int, dict[str, Any]]] | None
    _status: Status | None
    _renamed: bool
    _links: list[Link] | None
    _on_exception: tuple[bool, bool]

    def __init__(self, provider: RecordTracerProvider, context: SpanContext, parent: SpanContext | None,
                 name: str, kind: SpanKind, start_time: int, attributes: Mapping[str, Any] | None,
                 on_exception: tuple[bool, bool] = (True, True)) -> None:
        self._provider = provider
        self._context = context
        self.parent = parent
        self.name = name
        self.kind = kind
        self.start_time = start_time
        self.end_time = None
        self._attributes = attributes
        self._updates = None
        self._events = None
        self._status = None
        self._renamed = False
        self._links = None
        #: (record_exception, set_status_on_exception) for ``with tracer.start_span(...)``, as the SDK's.
        self._on_exception = on_exception

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
        if self.end_time is None:
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
        module, qualname = type(exception).__module__, type(exception).__qualname__
        values = {"exception.type": f"{module}.{qualname}" if module and module != "builtins" else qualname,
                  "exception.message": str(exception),
                  "exception.stacktrace": "".join(traceback.format_exception(exception)),
                  "exception.escaped": str(escaped)}
        if attributes:
            values.update(attributes)
        self.add_event("exception", values, timestamp)

    def __exit__(self, exc_type: type[BaseException] | None, exc_val: BaseException | None,
                 exc_tb: TracebackType | None) -> None:
        if exc_val is not None and self.end_time is None:
            record, set_status = self._on_exception
            if record:
                self.record_exception(exc_val, escaped=True)
            if set_status:
                self.set_status(Status(StatusCode.ERROR, f"{type(exc_val).__name__}: {exc_val}"))
        self.end()

    def end(self, end_time: int | None = None) -> None:
        with _END_LOCK:
            if self.end_time is not None:
                return
            self.end_time = end_time = time.time_ns() if end_time is None else end_time
        self._end_record(end_time)

    def _end_record(self, end_time: int) -> None:
        """Write the end record (``end_time`` is set): the C core's fast record when nothing but attributes was
        added since the span began, else the marshal record (events, status, a new name, links)."""
        status = self._status
        plain = self._events is None and status is None and not self._renamed and self._links is None
        fast = self._provider.fast
        if plain and fast is not None:
            written = fast.end(self._context.span_id, end_time, self._updates)
            if written is not None:
                if written[0] is not None:  # the ring was full: wait or drop as any record does
                    self._provider.emit(written[0], False)
                return
        if plain and self._updates is None:
            payload: bytes | None = marshal.dumps((END, self._context.span_id, end_time))
        else:
            payload = encode((END, self._context.span_id, end_time, self._updates, self._events,
                              None if status is None else (status.status_code.value, status.description),
                              self.name if self._renamed else None, encode_links(self._links)))
        if payload is None:
            self._provider.ring_drops += 1
        else:
            self._provider.emit(payload, False)

    def __repr__(self) -> str:
        return f"RecordSpan({self.name!r}, span_id={self._context.span_id:016x})"


class PyRecordSpan(RecordSpan):
    """A ``RecordSpan`` stored in slots: the pure-Python fallback's, and spans begun on the marshal path."""

    __slots__ = ("_provider", "_context", "parent", "name", "start_time", "end_time", "kind", "_attributes",
                 "_updates", "_events", "_status", "_renamed", "_links", "_on_exception")


def native_span_class(core: type) -> type[RecordSpan]:
    """``RecordSpan`` over the C core's ``SpanCore`` (``native/span.c``): its fields, ``end``,
    ``get_span_context`` and ``is_recording`` in C, the rest of the API from ``RecordSpan``."""
    cached = _NATIVE_CLASSES.get(core)
    if cached is None:
        cached = _NATIVE_CLASSES[core] = type("NativeRecordSpan", (core, RecordSpan), {
            "__slots__": (), "__module__": __name__, "__doc__": native_span_class.__doc__})
    return cached


_NATIVE_CLASSES: dict[type, type[RecordSpan]] = {}
#: ``_on_exception`` for the usual call, made once.
_ON_EXCEPTION = (True, True)
