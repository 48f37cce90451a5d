"""``Process``: DLRover's event emitter, with OpenTelemetry underneath.

An instant becomes a span event on the current span (or, when nothing is
current, on a process-lifetime ``training.process`` span); a duration becomes a
span. Every span and event carries ``training.event.target`` and
``training.event.name``, so a DLRover-style log or dashboard can be rebuilt
from the traces.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, TypeVar

from opentelemetry.trace import TracerProvider

from otel_training import semconv as sc
from otel_training._contain import contained
from otel_training.events.attributes import readable, text, to_attributes
from otel_training.events.duration import Duration
from otel_training.events.runtime import EventsRuntime, current_recording_span, runtime, runtime_for
from otel_training.events.values import defer_or_describe

D = TypeVar("D", bound=Duration)


class Process:
    """Emits the events of one target (``TrainerProcess``, an agent, your component)."""

    def __init__(self, target: str, *, tracer_provider: TracerProvider | None = None) -> None:
        # Spans and events carry it: a lone surrogate would lose them at export.
        self.target = text(target) if isinstance(target, str) else target
        #: Where its spans go: the configured pipeline's provider when None.
        self.tracer_provider = tracer_provider
        self._runtime: EventsRuntime | None = None

    def events_runtime(self) -> EventsRuntime:
        """The runtime its spans are made in (the pipeline's, or one for its ``tracer_provider``): looked up
        once and kept until its pipeline shuts down (a new ``configure()`` shuts the old one down first)."""
        kept = self._runtime
        if kept is not None and not kept.closed:
            return kept
        provider = self.tracer_provider
        kept = self._runtime = runtime() if provider is None else runtime_for(provider)
        return kept

    @contained(default=None)
    def _event(self, event_name: str, name: str, attributes: dict[str, Any],
               late: list[tuple[str, Any]] | None = None) -> None:
        """``late``: one-element device tensors of the content, read once computed (``values.py``); the event's
        timestamp names it when they arrive."""
        attributes[sc.EVENT_TARGET] = self.target
        attributes[sc.EVENT_NAME] = text(name)
        span = current_recording_span() or self.events_runtime().process_span(self.target)
        if not late:
            span.add_event(text(event_name), attributes)
            return
        timestamp = time.time_ns()
        described = defer_or_describe(self.events_runtime().values, span, timestamp, late)
        attributes.update(described)
        if len(described) < len(late):
            attributes[sc.VALUES_PENDING] = len(late) - len(described)
        span.add_event(text(event_name), attributes, timestamp)

    def instant(self, name: str, content: Mapping[str, object] | None = None) -> None:
        """A point-in-time event named ``name``."""
        late: list[tuple[str, Any]] = []
        attributes = to_attributes(content, late=late)
        self._event(name, name, attributes, late)

    def instant_of_attributes(self, name: str, attributes: dict[str, Any]) -> None:
        """A point-in-time event whose attributes are already converted, by rules of the caller's own (a drop-in
        shim's, as DLRover's content becomes attributes); ``instant`` converts a content mapping itself."""
        self._event(name, name, attributes)

    def duration(self, name: str, content: Mapping[str, object] | None = None) -> Duration:
        """A Duration whose span is named ``name``; begin it with ``with`` or ``begin()``."""
        return Duration(self, name, readable(content))

    def custom_duration(self, duration_class: type[D], name: str, content: Mapping[str, object] | None = None) -> D:
        """A Duration of your subclass (to add methods for the stages of your event)."""
        return duration_class(self, name, readable(content))

    def info(self, msg: str, **content: object) -> None:
        """A log-like event with a message, on the current span."""
        late: list[tuple[str, Any]] = []
        attributes = to_attributes(content, late=late)
        attributes[sc.LOG_MESSAGE] = text(msg)
        self._event(sc.EVENT_LOG_INFO, "#info", attributes, late)

    def error(self, msg: str, **content: object) -> None:
        """An error event with a message; does not change the span's status."""
        late: list[tuple[str, Any]] = []
        attributes = to_attributes(content, late=late)
        attributes[sc.LOG_MESSAGE] = text(msg)
        self._event(sc.EVENT_LOG_ERROR, "#error", attributes, late)

    def _span(self, span_name: str, event_name: str, attributes: dict[str, Any] | None,
              content: Mapping[str, Any] | None, kind: type[Duration] = Duration) -> Duration:
        # ``attributes`` hold what the caller was given too (a checkpoint path): converted alike.
        return kind(self, span_name, readable(content), event_name=event_name,
                    attributes=to_attributes(attributes) if attributes else None)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.target!r})"
