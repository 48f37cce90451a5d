"""DLRover's emitter, ``DurationSpan`` and ``Process``: each event to the log, and as a span.

This is where DLRover's events meet otel-training's spans: ``_SPANS`` maps
DLRover's Duration names to the spans of otel-training's own API (so the stuck
detector, goodput and the report see DLRover-instrumented code unchanged), and
``events.attributes.ALIASES`` maps content keys; the log never sees our names.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from otel_training import semconv as sc
from otel_training._contain import contain, contained, log_once
from otel_training._text import text
from otel_training.compat.dlrover._safe import SafeCallable, _as_dict, _SafeAttributes, _SafeCalls
from otel_training.compat.dlrover.event import Event, generate_event_id
from otel_training.compat.dlrover.exporter import EventExporter, get_default_exporter
from otel_training.compat.dlrover.names import TrainerEventName
from otel_training.events.attributes import METRIC_PREFIX, to_attributes
from otel_training.events.duration import Duration as _Span
from otel_training.events.process import Process as _SpanProcess
from otel_training.events.span_kinds import HostWork, StepDuration

logger = logging.getLogger("otel_training.compat.dlrover")

D = TypeVar("D", bound="DurationSpan")


# -- where DLRover's names meet ours -----------------------------------------
_CHECKPOINT_KEYS: Mapping[str, str] = {"global_step": sc.CHECKPOINT_STEP}

#: DLRover's Duration names -> (span name, span class, content keys meaning
#: something else on that span than ``ALIASES`` says). The span names and
#: classes are those of otel-training's own API, so the stuck detector, goodput
#: (host work, checkpoint steps) and the device timeline see the same spans.
#: Other names make a plain span of the DLRover name.
_SPANS: Mapping[str, tuple[str, type[_Span], Mapping[str, str]]] = {
    "#train": (sc.SPAN_TRAIN, HostWork, {}),
    "#epoch": (sc.SPAN_EPOCH, _Span, {}),
    "#step": (sc.SPAN_STEP, StepDuration, {}),
    "#evaluate": (sc.SPAN_EVALUATE, HostWork, {}),
    "#predict": (sc.SPAN_PREDICT, HostWork, {}),
    "#save": (sc.SPAN_SAVE_CHECKPOINT, HostWork, _CHECKPOINT_KEYS),
    "#persist_ckpt": (sc.SPAN_PERSIST_CHECKPOINT, HostWork, _CHECKPOINT_KEYS),
    "#init": (sc.SPAN_INIT, HostWork, {}),
    "#init##load_ckpt": (sc.SPAN_LOAD_CHECKPOINT, HostWork, {}),
    "#init##load_dataset": (sc.SPAN_LOAD_DATASET, HostWork, {}),
    "#rendezvous": (sc.SPAN_RENDEZVOUS, _Span, {"round_num": sc.ELASTIC_RENDEZVOUS_ROUND}),
    "#network_check": (sc.SPAN_NETWORK_CHECK, _Span, {}),
}
_PLAIN: tuple[None, type[_Span], Mapping[str, str]] = (None, _Span, {})
#: On END these are the span's status (OK, or ERROR with the message), not attributes.
_OUTCOME = ("success", "error")


def _span_attributes(content: Mapping[Any, Any], renames: Mapping[str, str], skip: tuple[str, ...] = ()
                     ) -> dict[str, Any]:
    return to_attributes({renames.get(key, key): value for key, value in content.items() if key not in skip})


def _instant_attributes(name: Any, content: Mapping[Any, Any]) -> dict[str, Any]:
    if name == TrainerEventName.LOG.value and isinstance(content.get("logs"), Mapping):
        # The metrics of a #log are metrics, as TrainerProcess.log makes them (training.loss, training.metric.*).
        attributes = to_attributes({key: value for key, value in content.items() if key != "logs"})
        attributes.update(to_attributes(content["logs"], unnamed_prefix=METRIC_PREFIX))
        return attributes
    return to_attributes(content)


# -- emitter, durations and processes ----------------------------------------
class EventEmitter:
    """A target's events to the exporter (DLRover's emitter); instants also become span events."""

    def __init__(self, target: str, exporter: EventExporter | None) -> None:
        self.target = target
        self.exporter = exporter
        #: The target's span process: its events' spans, and the Process's error and info span events.
        self.spans = _SpanProcess(target)

    def instant(self, name: str, content: Mapping[str, Any] | None = None) -> None:
        content = _as_dict(content)
        if self.exporter is not None:
            self.exporter.export(Event.instant(generate_event_id(), self.target, name, content))
        self._span_event(name, content)

    def begin(self, event_id: str, name: str, content: dict[str, Any]) -> None:
        if self.exporter is not None:
            self.exporter.export(Event.begin(event_id, self.target, name, content))

    def end(self, event_id: str, name: str, content: dict[str, Any]) -> None:
        if self.exporter is not None:
            self.exporter.export(Event.end(event_id, self.target, name, content))

    @contained(default=None)
    def _span_event(self, name: str, content: Mapping[Any, Any]) -> None:
        self.spans.instant_of_attributes(text(name), _instant_attributes(name, content))

    @contained(default=None)
    def _span(self, name: str, content: Mapping[Any, Any]) -> _Span | None:
        span_name, kind, renames = _SPANS.get(name, _PLAIN) if isinstance(name, str) else _PLAIN
        return kind(self.spans, span_name or text(name), None, event_name=text(name),
                    attributes=_span_attributes(content, renames, _OUTCOME)).begin()


class DurationSpan(_SafeAttributes, metaclass=_SafeCalls):
    """DLRover's Duration: a BEGIN/END pair in the log, and a span.

    ``begin()``/``end()`` (or ``with``) emit BEGIN and END once each: a second
    begin, an end before begin or after end emit nothing. ``success(**content)``
    and ``fail(error, **content)`` end it with ``success`` (and ``error``) in the
    END content; leaving a ``with`` by an exception fails it with the message and
    traceback, and the exception goes on. Subclass it to add stages
    (``custom_duration``).
    """

    def __init__(self, emitter: EventEmitter, name: str, content: Mapping[str, Any] | None = None) -> None:
        self.emitter = emitter
        self.name = name
        self.content: dict[str, Any] = _as_dict(content)
        self._is_begin = False
        self._is_end = False
        self._event_id = generate_event_id()
        self._span: _Span | None = None
        self._error: BaseException | None = None
        self._added = False  # content added since BEGIN: the span's attributes need it at END

    def begin(self) -> DurationSpan:
        """Emit BEGIN with the content so far; a Duration already begun emits nothing."""
        if self._is_begin:
            return self
        self._is_begin = True
        self.emitter.begin(self._event_id, self.name, dict(self.content))
        span = getattr(self.emitter, "_span", None)
        if span is not None:
            self._span = span(self.name, self.content)
            self._added = False
        return self

    def end(self) -> None:
        """Emit END with the content; before begin or after end nothing is emitted."""
        if self._is_end or not self._is_begin:
            return
        self._is_end = True
        self.emitter.end(self._event_id, self.name, dict(self.content))
        self._end_span()

    @contained(default=None)
    def _end_span(self) -> None:
        span, self._span = self._span, None
        if span is None:
            return
        if self._added:
            renames = _SPANS.get(self.name, _PLAIN)[2] if isinstance(self.name, str) else {}
            span.span.set_attributes(_span_attributes(self.content, renames, _OUTCOME))
        outcome = self.content.get("success")
        if outcome is True:
            span.success()
        elif outcome is False:
            span.fail(self._error if self._error is not None else self.content.get("error"))
        else:
            span.end()

    def stage(self, stage: str, content: Mapping[str, Any] | None = None) -> DurationSpan:
        """A Duration ``<name>#<stage>`` with this one's content plus ``content``; only while this one is open."""
        if self._is_end or not self._is_begin:
            log_once(f"dlrover-compat:stage:{text(self.name)}", "otel_training: a stage of %s, which is not open, "
                     "is ignored", text(self.name), exc_info=False)
            return SafeCallable()  # type: ignore[return-value]  # the no-op stands in for a DurationSpan: any method call chains
        merged = dict(self.content)
        merged.update(_as_dict(content))
        return DurationSpan(self.emitter, f"{self.name}#{stage}", merged)

    def extra_args(self, **kwargs: Any) -> DurationSpan:
        """Add content for the next BEGIN or END; refused after the end."""
        return self.extra_dict(kwargs)

    def extra_dict(self, content: Mapping[str, Any]) -> DurationSpan:
        """Add content (a dict) for the next BEGIN or END; refused after the end."""
        if self._is_end:
            log_once(f"dlrover-compat:extra:{text(self.name)}", "otel_training: content added to the ended %s "
                     "is ignored", text(self.name), exc_info=False)
            return self
        self.content.update(_as_dict(content))
        self._added = True
        return self

    def success(self, **kwargs: Any) -> None:
        """End with ``"success": true`` and ``kwargs`` in the END content (span status OK)."""
        self.content["success"] = True
        if kwargs:
            self.content.update(kwargs)
            self._added = True
        self.end()

    def fail(self, error: str, **kwargs: Any) -> None:
        """End with ``"success": false, "error": error`` in the END content (span status ERROR)."""
        self.content["success"] = False
        self.content["error"] = error
        if kwargs:
            self.content.update(kwargs)
            self._added = True
        self.end()

    def __enter__(self) -> DurationSpan:
        return self.begin()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        # Never replace the user's exception, nor raise one.
        with contain("dlrover-compat:exit", "otel_training: could not end a DLRover Duration"):
            if exc_type is None:
                self.success()
            else:
                self._error = exc
                message = text(exc)
                if tb is not None:
                    message += "\n" + "".join(traceback.format_tb(tb))
                self.fail(message)
        return False

    def __repr__(self) -> str:
        state = "ended" if self._is_end else "open" if self._is_begin else "new"
        return f"<DurationSpan {self.name!r} {state}>"


#: DLRover calls its Duration ``DurationSpan``; otel-training users know it as ``Duration``.
Duration = DurationSpan


class Process(_SafeAttributes, metaclass=_SafeCalls):
    """A target's events: ``instant``, ``duration``, ``custom_duration`` (subclass it for your own events)."""

    def __init__(self, target: str, exporter: EventExporter | None = None) -> None:
        if exporter is None:
            exporter = get_default_exporter()
        self._emitter = EventEmitter(target, exporter)

    @property
    def target(self) -> str:
        return self._emitter.target

    def instant(self, name: str, content: Mapping[str, Any] | None = None) -> None:
        """An INSTANT line, written now, and an event on the current span."""
        self._emitter.instant(name, content)

    def duration(self, name: str, content: Mapping[str, Any] | None = None) -> DurationSpan:
        return DurationSpan(self._emitter, name, content)

    def custom_duration(self, clzz: type[D], name: str, content: Mapping[str, Any] | None = None) -> D:
        """A Duration of your ``DurationSpan`` subclass (methods for the stages of your event)."""
        return clzz(self._emitter, name, content)

    def error(self, msg: str) -> None:
        """Logged (not an event, as in DLRover), and an error event on the current span."""
        logger.error(msg)
        self._emitter.spans.error(msg)

    def info(self, msg: str) -> None:
        logger.info(msg)
        self._emitter.spans.info(msg)
