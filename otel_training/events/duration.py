"""``Duration``: DLRover's BEGIN/END event pair as one OpenTelemetry span.

A begun Duration is the current span, so durations begun inside it nest (substep under step under epoch under
train). Long-lived durations keep traces small: when the trace a child would join has reached ``trace_max_spans``
spans or ``trace_max_age_s`` seconds, the parent continues in a new trace (a span of the same name,
``training.trace.segment`` = n, linked to the original and to the previous segment), and children from then on
belong to the new trace. See docs/trace-layout.md.

Every method is contained: nothing here raises into training code, except the user's own exception leaving a
``with`` block, which is recorded and re-raised.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, Status, StatusCode

from otel_training import _native_loader
from otel_training import semconv as sc
from otel_training._contain import call_contained, contain, contained, log_once
from otel_training._sdk_compat import span_switch, trace_id_of
from otel_training.events.attributes import CACHED_KEYS as _PLAIN_KEYS
from otel_training.events.attributes import INT64_LIMIT as _INT64_LIMIT
from otel_training.events.attributes import MAX_KEYS, text, to_attributes
from otel_training.events.runtime import EventsRuntime
from otel_training.events.span_factory import begin_failed, end_failed, record_error, start_child, start_span
from otel_training.events.values import SPAN as SPAN_VALUES
from otel_training.events.values import defer_or_describe

if TYPE_CHECKING:
    from otel_training.events.process import Process

F = TypeVar("F", bound=Callable[..., Any])

#: The current span, read and switched in the fewest Python frames the runtime context allows.
_SWITCH = span_switch()

_STEP_END_FAILED = contain("StepDuration.end", "otel_training: internal error timing a step on the device; "
                           "training continues")


def _plain_attributes() -> Callable[..., dict[str, Any] | None] | None:
    """``native/attributes.c``'s PlainAttributes: ``Duration``'s inline content path as one C call (None: the
    Python path alone)."""
    extension = _native_loader.at_import()
    if extension is None:
        return None
    return extension.PlainAttributes(sc.EVENT_TARGET, sc.EVENT_NAME, _PLAIN_KEYS, MAX_KEYS)  # type: ignore[no-any-return]  # the C extension is untyped: this is its PlainAttributes callable


_PLAIN = _plain_attributes()

_CURRENT: contextvars.ContextVar[Duration | None] = contextvars.ContextVar("otel_training_duration", default=None)


def current_duration() -> Duration | None:
    """The innermost begun Duration of this context, if any."""
    return _CURRENT.get()


class Duration:
    """A span with DLRover's Duration API: ``with``, decorator, or begin()/end()."""

    __slots__ = (
        "_process",
        "name",
        "event_name",
        "_attributes",
        "_span",
        "_token",
        "_current_token",
        "_segment",
        "_segment_index",
        "_child_context",
        "_late",
        "_ended",
        "_runtime",
        "device_step",
    )

    def __init__(
        self,
        process: Process,
        name: str,
        content: Mapping[str, object] | None = None,
        *,
        event_name: str | None = None,
        attributes: dict[str, Any] | None = None,
    ) -> None:
        self._process = process
        # Names become span names and attributes: a lone surrogate would lose the span at export.
        self.name = name if type(name) is str and name.isascii() else text(name)
        self.event_name = event_name or self.name
        #: One-element device tensors in the content, read once computed (``values.py``); None: none.
        self._late: list[tuple[str, Any]] | None = None
        # The usual content (a step's batch size, a loss as a float: keys already seen, plain numbers) in one C
        # call where the extension loads; None: anything else, converted below.
        attrs = _PLAIN(process.target, self.event_name, attributes, content) if _PLAIN is not None else None
        if attrs is not None:
            content = None
        else:
            attrs = {sc.EVENT_TARGET: process.target, sc.EVENT_NAME: self.event_name}
            if attributes:
                attrs.update(attributes)
        if content:
            # The usual content (a step's batch size, a loss as a float) inline: keys already seen, plain
            # numbers. Anything else (or a user's odd mapping) is converted whole by to_attributes.
            plain: dict[str, Any] | None = {} if type(content) is dict and len(content) <= MAX_KEYS else None
            if plain is not None:
                value: Any  # anything the user logged; the checks below pick the plain numbers
                for key, value in content.items():
                    name = _PLAIN_KEYS.get(key) if type(key) is str else None  # type: ignore[assignment]  # the parameter, already kept in self.name, reused for the key's attribute name (None: not a cached key)
                    kind = type(value)
                    if name is None or not (kind is float or kind is bool
                                            or (kind is int and -_INT64_LIMIT <= value < _INT64_LIMIT)):
                        plain = None
                        break
                    plain[name] = value
            if plain is not None:
                attrs.update(plain)
            else:
                late: list[tuple[str, Any]] = []
                attrs.update(to_attributes(content, late=late))
                self._late = late or None
        self._attributes = attrs
        self._span: Span | None = None
        self._token: object | None = None
        self._current_token: contextvars.Token[Duration | None] | None = None
        self._segment: Span | None = None
        self._segment_index = 0
        self._child_context: Context | None = None
        self._ended = False
        #: The runtime its span was begun in (its process's: the pipeline's, or an injected provider's).
        self._runtime: EventsRuntime | None = None
        #: A step timed on the device's timeline (``StepDuration``): (timeline, its step), ended with the span;
        #: None otherwise. Read-only outside: the torch tracker asks it before ``input_ready()``.
        self.device_step: tuple[Any, Any] | None = None

    # -- the span -----------------------------------------------------------
    @property
    def span(self) -> Span:
        """The underlying span (a non-recording one before ``begin()``)."""
        return self._span if self._span is not None else trace_api.INVALID_SPAN

    @property
    def attributes(self) -> dict[str, Any]:
        return dict(self._attributes)

    def begin(self) -> Duration:
        """Start the span and make it current."""
        return self._begin(None)

    def begin_detached(self) -> Duration:
        """Start the span without making it the caller's current span (``context()`` gives one where it is):
        for an instrumentor that opens and closes spans at hook calls, which must not change the user's context."""
        return self._begin(None, detached=True)

    def _begin(self, rt: EventsRuntime | None, detached: bool = False, under: Duration | None = None) -> Duration:
        """``detached``: the span does not become the caller's current span (``context()`` makes one where it is).
        ``under``: the begun Duration current where this one begins, from a caller that knows it (the torch
        tracker's loop spans): its ``context()``'s parent and budget, without entering it and reading them back."""
        try:
            if self._span is not None:
                log_once(f"begin-twice:{self.name}", "otel_training: Duration %r begun twice; ignored", self.name,
                         exc_info=False)
                return self
            if rt is None:
                rt = self._process.events_runtime()
            self._runtime = rt
            under_span = under._span if under is not None else None  # noqa: SLF001 - another Duration's span: this class's own state
            if under_span is None:  # no parent given, or one whose own begin failed: the context's
                under = None
                parent = _CURRENT.get()
                current: Span = _SWITCH.current()
            else:
                parent, current = under, under_span
            # Only a trace with a parent Duration in it can outgrow its budget. The usual case: a child of the
            # current span, which is its parent's and within budget (counted here), in one read of the context.
            if parent is None or parent._span is not current:  # noqa: SLF001 - the parent Duration's span: this class's own state
                span = start_child(rt, self.name, current, self._attributes, parent is not None)
            elif rt.admit(trace_id_of((holder := parent._segment or current).get_span_context())):  # noqa: SLF001 - the parent Duration's trace segment: this class's own state
                # within budget: a child of the parent, or of the trace segment it continues in (counted above;
                # the offloaded tracer's start_child called here, a frame fewer than span_factory's)
                starter = rt.start_child
                span = (starter(self.name, holder, self._attributes) if starter is not None
                        else start_child(rt, self.name, holder, self._attributes, False,
                                         holder is current and under is None))
            else:  # the parent continues in a new trace segment, once its trace is over budget
                context = parent._context_for_child(rt)  # noqa: SLF001 - the parent Duration rolls its own trace segment: this class's own protocol
                if context is None:
                    span = start_child(rt, self.name, current, self._attributes, True, under is None)
                else:
                    span = start_span(rt, self.name, context=context, attributes=self._attributes, charge=True)
            self._span = span
            if not detached:
                self._token = _SWITCH.attach(span)
                self._current_token = _CURRENT.set(self)
            values = rt.values
            if values is not None and values.items:  # earlier steps' device values the device has computed
                values.poll()
            if self._late is not None:
                late, self._late = self._late, None
                self._defer(late)
        except Exception:  # noqa: BLE001 - contained inline (no wrapper frame on the hot path): begin_failed() logs it
            begin_failed()
        return self

    def context(self) -> contextvars.Context:
        """A copy of the caller's context in which this Duration is the current span.

        For a Duration begun detached (the torch instrumentor's steps): work inside it (a checkpoint, a
        collective) runs in this context to nest under it, while the caller's own context never changes.
        """
        ctx = contextvars.copy_context()
        ctx.run(self._make_current)
        return ctx

    def _make_current(self) -> None:
        if self._span is not None:
            _SWITCH.attach(self._span)
            _CURRENT.set(self)

    def _defer(self, late: list[tuple[str, Any]]) -> None:
        """Read ``late``'s device values once computed, for this (begun) span; described where they cannot be."""
        rt, span = self._runtime, self._span
        if span is None:
            return
        described = defer_or_describe(rt.values if rt is not None else None, span, SPAN_VALUES, late)
        if described:
            span.set_attributes(described)

    def _context_for_child(self, rt: EventsRuntime) -> Context | None:
        holder = self._segment or self._span
        if holder is not None and rt.over_budget(trace_id_of(holder.get_span_context())):
            self._roll(rt)
        return self._child_context

    def _roll(self, rt: EventsRuntime) -> None:
        """Continue this span in a new trace, linked to the original and the previous segment."""
        assert self._span is not None
        previous = self._segment
        links = [Link(self._span.get_span_context(), {sc.LINK_TYPE: sc.LINK_CONTINUES})]
        if previous is not None:
            links.append(Link(previous.get_span_context(), {sc.LINK_TYPE: sc.LINK_PREVIOUS}))
        self._segment_index += 1
        attributes = dict(self._attributes)
        attributes[sc.TRACE_SEGMENT] = self._segment_index
        segment = start_span(rt, self.name, context=Context(), attributes=attributes, links=links)
        rt.forget((previous or self._span).get_span_context().trace_id)
        self._segment = segment
        self._child_context = trace_api.set_span_in_context(segment)
        if previous is not None:
            previous.end()

    def end(self, attributes: Mapping[str, Any] | None = None) -> None:
        """End the span (status unset unless ``success``/``fail`` said otherwise).

        ``attributes``: valid attributes to set as it ends, as they are (an integration's counts: no conversion,
        the span's own ``set_attributes``), in the same call: the torch tracker ends every step so.
        """
        pending = self.device_step
        if pending is not None:  # a step timed on the device's timeline: its device end marker first
            self.device_step = None
            try:
                pending[0].end_step(pending[1])
            except Exception:  # noqa: BLE001 - per step, inline (_contain.contain.failed): the host span still ends
                _STEP_END_FAILED.failed()
        try:
            span = self._span
            if span is None or self._ended:
                return
            self._ended = True
            if self._current_token is not None and _CURRENT.get() is self:
                # Restore the context only where it was entered, in order; a Duration ended elsewhere (another
                # thread, out of order, inside its own context(): ValueError) just ends its span.
                with contextlib.suppress(ValueError):
                    _CURRENT.reset(self._current_token)
                    _SWITCH.detach(self._token)
            if self._segment is not None:
                self._end_segment()
            values = self._runtime.values if self._runtime is not None else None
            if values is not None and (values.items or values.converting):  # what is read now goes on the span
                waiting = values.ended(span)
                if waiting:
                    span.set_attribute(sc.VALUES_PENDING, waiting)
            if attributes:
                span.set_attributes(attributes)
            span.end()
            # A NonRecordingSpan (OTEL_SDK_DISABLED) has no parent attribute.
            if getattr(span, "parent", None) is None and self._runtime is not None:
                self._runtime.forget(span.get_span_context().trace_id)
        except Exception:  # noqa: BLE001 - contained inline (no wrapper frame on the hot path): end_failed() logs it
            end_failed()

    def _end_segment(self) -> None:
        status = getattr(self._span, "status", None)
        if status is not None and status.status_code is StatusCode.ERROR:
            self._segment.set_status(status)  # type: ignore[union-attr]  # not None: end() calls this only with a segment
        self._segment.end()  # type: ignore[union-attr]  # not None: end() calls this only with a segment

    # -- outcome ------------------------------------------------------------
    @contained(default=None)
    def extra_args(self, **content: object) -> Duration:
        """Add content (attributes) before or during the span (a one-element device tensor: read once computed)."""
        late: list[tuple[str, Any]] = []
        attributes = to_attributes(content, late=late)
        if self._span is None:
            self._attributes.update(attributes)
            if late:
                self._late = (self._late or []) + late
        else:
            self._span.set_attributes(attributes)
            if late:
                self._defer(late)
        return self

    @contained(default=None)
    def success(self, **content: object) -> None:
        """End with status OK and the given content."""
        if self._span is None:
            self.begin()
        if content:
            self.extra_args(**content)
        if self._span is not None:
            self._span.set_status(Status(StatusCode.OK))
        self.end()

    @contained(default=None)
    def fail(self, error: BaseException | str | None = None, **content: object) -> None:
        """End with status ERROR; an exception is recorded with its stack."""
        if self._span is None:
            self.begin()
        if content:
            self.extra_args(**content)
        if self._span is not None:
            record_error(self._span, error)
        self.end()

    #: The class of ``stage()``'s Durations: None for this one's own class.
    _STAGE_CLASS: type[Duration] | None = None

    def stage(self, name: str, content: Mapping[str, object] | None = None) -> Duration:
        """A child Duration ``<span name>.<stage>``, for the phases of a long event."""
        return (self._STAGE_CLASS or type(self))(self._process, f"{self.name}.{name}", content, event_name=name)

    # -- context manager and decorator -------------------------------------
    def __enter__(self) -> Duration:
        self._begin(None)  # begin()'s work, a frame fewer: ``with`` is how most spans begin
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        if exc is not None and self._span is not None:
            call_contained(record_error, self._span, exc)
        self.end()
        return False

    async def __aenter__(self) -> Duration:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        return self.__exit__(exc_type, exc, tb)

    def _fresh(self) -> Duration:
        clone = type(self).__new__(type(self))
        Duration.__init__(clone, self._process, self.name, event_name=self.event_name, attributes=self._attributes)
        clone._init_state()  # noqa: SLF001 - a subclass's own slots on a clone of the same class: Duration's own hook
        return clone

    def _init_state(self) -> None:
        """Set a subclass's own slots on a clone made by ``_fresh`` (which runs Duration's __init__ only)."""

    def __call__(self, function: F) -> F:
        """Use as a decorator: each call runs in a fresh Duration like this one."""
        if inspect.iscoroutinefunction(function):

            @functools.wraps(function)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                async with self._fresh():
                    return await function(*args, **kwargs)

            return async_wrapper  # type: ignore[return-value]  # functools.wraps: it takes function's arguments and returns its awaitable, as F

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self._fresh():
                return function(*args, **kwargs)

        return wrapper  # type: ignore[return-value]  # functools.wraps: it takes function's arguments and returns its result, as F

    def __repr__(self) -> str:
        state = "ended" if self._ended else "open" if self._span is not None else "new"
        return f"<Duration {self.name} {state}>"
