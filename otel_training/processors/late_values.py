"""Holding a span for export until the values it is waiting for arrive (``training.values.pending``).

Why: a one-element device tensor (the usual CUDA loss) cannot be read when the training thread logs it
without synchronising the device; the training process reads it once its device work has completed
(``events/values.py``), which is often after the step span has ended. Such a span ends on time, so the stuck
detector, goodput and the other processors see it when they would, but it says how many values are still
coming (``training.values.pending``, on the span or on one of its events). This processor, in front of the
exporting processor only, holds it until ``resolve`` brings them, then passes on the span with the values
and without the marker. A span whose values do not come within ``hold_s`` (the device hung, the process
died) is passed on without them, naming the missing keys (``training.values.unresolved``); a flush or a
shutdown passes on everything held. Nothing is held longer than ``hold_s`` nor more than ``max_held`` spans.

Values may also arrive before their span ends (an event's value read before its span ended, however long the
span runs: an epoch's): they are kept, at most ``max_held`` spans' worth, and applied when it ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import Event, ReadableSpan, Span, SpanProcessor

from otel_training import semconv as sc

#: ``resolve``'s target for the span's own attributes (an event's is its timestamp, which the training
#: process sets when it adds the event).
SPAN = -1


class _Held:
    __slots__ = ("span", "deadline", "values", "waiting")

    def __init__(self, span: ReadableSpan | None, deadline: float) -> None:
        self.span = span
        self.deadline = deadline
        self.values: dict[int, dict[str, Any]] = {}
        #: Values still to come, per target (SPAN or an event's timestamp): from the span's markers once it ended.
        self.waiting: dict[int, int] = {}


class LateValuesSpanProcessor(SpanProcessor):
    """Passes spans on to ``downstream``, holding those with pending values until they arrive (module doc)."""

    def __init__(self, downstream: SpanProcessor, hold_s: float = 30.0, max_held: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.downstream = downstream
        self.hold_s = hold_s
        self.max_held = max_held
        self._clock = clock
        self._lock = threading.Lock()
        self._held: dict[int, _Held] = {}
        #: Spans passed on without some of their values (they did not come in time, or too many were held).
        self.unresolved = 0
        self._next_expiry = 0.0

    # -- the SDK's calls -------------------------------------------------------
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.downstream.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        waiting = _waiting(span)
        ready: list[ReadableSpan] = []
        with self._lock:
            span_id = span.get_span_context().span_id  # type: ignore[union-attr]  # None only for a ReadableSpan built without one: an ended span has it
            held = self._held.get(span_id)
            if waiting or held is not None:
                if held is None:
                    held = self._held[span_id] = _Held(span, 0.0)
                held.span, held.waiting, held.deadline = span, waiting, self._clock() + self.hold_s
                for target, values in held.values.items():  # arrived before the span ended
                    if target in held.waiting:
                        held.waiting[target] = max(0, held.waiting[target] - len(values))
                if not any(held.waiting.values()):
                    ready.append(self._release(span_id, held))
                elif len(self._held) > self.max_held:
                    ready.append(self._release(next(iter(self._held)), expired=True))
            else:
                ready.append(span)
            ready.extend(self._expired())
        for item in ready:
            self.downstream.on_end(item)

    def shutdown(self) -> None:
        self._release_all()
        self.downstream.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self._release_all()
        return self.downstream.force_flush(timeout_millis)

    # -- values ----------------------------------------------------------------
    def resolve(self, span_id: int, target: int, values: Mapping[str, Any]) -> None:
        """``values`` for span ``span_id``'s attributes (``target`` SPAN) or its event whose timestamp is ``target``."""
        ready: list[ReadableSpan] = []
        with self._lock:
            held = self._held.get(span_id)
            if held is None:  # its span has not ended yet
                if len(self._held) >= self.max_held:
                    self.unresolved += 1
                    return
                held = self._held[span_id] = _Held(None, 0.0)
            held.values.setdefault(target, {}).update(values)
            if held.span is not None and target in held.waiting:
                held.waiting[target] = max(0, held.waiting[target] - len(values))
                if not any(held.waiting.values()):
                    ready.append(self._release(span_id, held))
            ready.extend(self._expired())
        for item in ready:
            self.downstream.on_end(item)

    def tick(self) -> None:
        """Pass on the spans held past ``hold_s`` (the drain calls it as it goes; on_end does too)."""
        with self._lock:
            ready = self._expired(every_time=True)
        for item in ready:
            self.downstream.on_end(item)

    @property
    def held(self) -> int:
        with self._lock:
            return sum(1 for held in self._held.values() if held.span is not None)

    # -- internals -------------------------------------------------------------
    def _expired(self, every_time: bool = False) -> list[ReadableSpan]:
        """The spans held past their deadline, released; looked for at most every 0.1 s unless ``every_time``
        (on_end and resolve ask on every span)."""
        now = self._clock()
        if not self._held or (now < self._next_expiry and not every_time):
            return []
        self._next_expiry = now + 0.1
        # Values that came before their span ended wait for it however long it runs (an epoch's event): only
        # ended spans expire; the early ones are bounded by max_held.
        late = [span_id for span_id, held in self._held.items() if held.span is not None and held.deadline <= now]
        return [span for span in (self._release(span_id, expired=True) for span_id in late) if span is not None]

    def _release_all(self) -> None:
        with self._lock:
            ready = [self._release(span_id, expired=True) for span_id in list(self._held)]
        for span in ready:
            if span is not None:
                self.downstream.on_end(span)

    def _release(self, span_id: int, held: _Held | None = None, expired: bool = False) -> Any:
        held = held or self._held.get(span_id)
        self._held.pop(span_id, None)
        if held is None or held.span is None:
            return None  # values of a span that never ended here (dropped, or another pipeline's)
        missing = expired and any(held.waiting.values())
        if missing:
            self.unresolved += 1
        return _with_values(held.span, held.values, missing)


def _waiting(span: ReadableSpan) -> dict[int, int]:
    """Values still to come per target, from the markers on the span and its events."""
    waiting: dict[int, int] = {}
    pending = (span.attributes or {}).get(sc.VALUES_PENDING)
    if type(pending) is int and pending > 0:
        waiting[SPAN] = pending
    for event in span.events:
        pending = (event.attributes or {}).get(sc.VALUES_PENDING)
        if type(pending) is int and pending > 0:
            waiting[event.timestamp] = pending
    return waiting


def _with_values(span: ReadableSpan, values: dict[int, dict[str, Any]], missing: bool) -> ReadableSpan:
    """``span`` with ``values`` merged and the markers removed (a marker stays where values are missing)."""

    def merged(attributes: Mapping[str, Any] | None, target: int) -> dict[str, Any]:
        result = dict(attributes or {})
        result.update(values.get(target, {}))
        pending = result.pop(sc.VALUES_PENDING, None)
        if missing and type(pending) is int and pending > len(values.get(target, {})):
            result[sc.VALUES_UNRESOLVED] = pending - len(values.get(target, {}))
        return result

    events = [Event(event.name, merged(event.attributes, event.timestamp), event.timestamp)
              if sc.VALUES_PENDING in (event.attributes or {}) else event for event in span.events]
    return ReadableSpan(name=span.name, context=span.get_span_context(), parent=span.parent, resource=span.resource,
                        attributes=merged(span.attributes, SPAN), events=events, links=span.links, kind=span.kind,
                        status=span.status, start_time=span.start_time, end_time=span.end_time,
                        instrumentation_scope=span.instrumentation_scope)
