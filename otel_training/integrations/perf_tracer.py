"""AReaL's ``perf_tracer`` API on OpenTelemetry: switch by changing one import.

    from otel_training.integrations import perf_tracer   # was: from areal.utils import perf_tracer

AReaL buffers Chrome-trace events and per-session records in memory and writes
them at ``save()``; here every scope is a span of the configured pipeline
(bounded queue, exported as it ends), and the rollout bookkeeping is a span tree:

- ``rollout.task`` (one dataset item) -> ``rollout.session`` (one sample) ->
  ``rollout.phase`` (generate, reward, toolcall...: any name);
- a session ends when it is finalized (``trace_session_event("mark_finalized",
  status=..., reason=...)``) with ``rollout.session.status`` accepted / rejected /
  failed / dropped, the reason, and derived durations: ``rollout.session.total_s``
  and ``rollout.session.phase_s.<phase>`` (the sum of that phase's spans);
- a task ends when its last open session is finalized;
- task and session ids live in context variables, so they follow ``await`` and
  ``asyncio`` tasks, and phases find their session without being passed it.

A session that raises out of ``session_context`` is finalized as failed; one
still open at shutdown is finalized as dropped, so no span is left open.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import itertools
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from enum import Enum
from typing import Any, TypeVar

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.trace import Span, Status, StatusCode

from otel_training import semconv as sc
from otel_training._contain import contained
from otel_training.events.attributes import to_attributes
from otel_training.events.runtime import runtime

F = TypeVar("F", bound=Callable[..., Any])

STATUSES = ("accepted", "rejected", "failed", "dropped")
_TARGET = "PerfTracer"


class Category(str, Enum):
    """AReaL's scope categories, recorded as ``perf.category``."""

    COMPUTE = "compute"
    COMM = "comm"
    IO = "io"
    SYNC = "sync"
    SCHEDULER = "scheduler"
    INSTR = "instr"
    MISC = "misc"


PerfTraceCategory = Category
_ALIASES = {"communication": "comm", "synchronization": "sync", "scheduling": "scheduler",
            "instrumentation": "instr"}


def _category(category: Category | str | None) -> str:
    if isinstance(category, Category):
        return category.value
    if isinstance(category, str) and category.strip():
        low = category.strip().lower()
        return _ALIASES.get(low, low)
    return Category.MISC.value


def _attributes(category: Category | str | None, args: Mapping[str, Any] | None) -> dict[str, Any]:
    attributes = {sc.PERF_CATEGORY: _category(category)}
    if args:
        attributes.update(to_attributes(args))
    return attributes


# -- scopes -------------------------------------------------------------------


@contextlib.contextmanager
def trace_scope(name: str, category: Category | str | None = None,
                args: Mapping[str, Any] | None = None) -> Iterator[Span]:
    """A span around a block; an exception is recorded and re-raised."""
    with runtime().tracer.start_as_current_span(name, attributes=_attributes(category, args)) as span:
        yield span


@contextlib.asynccontextmanager
async def atrace_scope(name: str, category: Category | str | None = None,
                       args: Mapping[str, Any] | None = None) -> AsyncIterator[Span]:
    """``trace_scope`` for ``async with``."""
    with trace_scope(name, category, args) as span:
        yield span


def _in_scope(scope: Callable[[], contextlib.AbstractContextManager[Any]]) -> Callable[[F], F]:
    """A decorator running each call of a sync or async function inside ``scope()``."""

    def decorate(function: F) -> F:
        if inspect.iscoroutinefunction(function):

            @functools.wraps(function)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with scope():
                    return await function(*args, **kwargs)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with scope():
                return function(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def trace_perf(name: str, category: Category | str | None = None) -> Callable[[F], F]:
    """Decorate a sync or async function: each call is a span named ``name``."""
    return _in_scope(lambda: trace_scope(name, category))


@contained(default=None)
def instant(name: str, category: Category | str | None = None, args: Mapping[str, Any] | None = None) -> None:
    """A point-in-time marker: an event on the current span (or the process span)."""
    span = trace_api.get_current_span()
    if not span.is_recording():
        span = runtime().process_span(_TARGET)
    span.add_event(name, _attributes(category, args))


# -- tasks and sessions ---------------------------------------------------------

_task_id: contextvars.ContextVar[int | None] = contextvars.ContextVar("otel_training_task_id", default=None)
_session_id: contextvars.ContextVar[int | None] = contextvars.ContextVar("otel_training_session_id", default=None)


class _Task:
    def __init__(self, task_id: int, span: Span) -> None:
        self.id = task_id
        self.span = span
        self.open_sessions = 0
        self.sessions = 0


class _Session:
    def __init__(self, session_id: int, task: _Task, span: Span) -> None:
        self.id = session_id
        self.task = task
        self.span = span
        self.started = time.monotonic()
        self.phase_s: dict[str, float] = {}
        self.manual_phases: dict[str, tuple[Span, float]] = {}


class _Registry:
    """Open tasks and sessions of this process, by id."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ids = itertools.count(1)
        self.tasks: dict[int, _Task] = {}
        self.sessions: dict[int, _Session] = {}
        self.telemetry: Any = None

    def watch_shutdown(self) -> None:
        rt = runtime()
        if rt.telemetry is not self.telemetry:
            self.telemetry = rt.telemetry
            rt.telemetry.on_shutdown(self.drop_all)

    def drop_all(self) -> None:
        for session in list(self.sessions.values()):
            _finalize(session, "dropped", "unfinalized at shutdown")
        for task in list(self.tasks.values()):
            _end_task(task)


_registry = _Registry()


def register_task(args: Mapping[str, Any] | None = None) -> int:
    """A new task (dataset item) span under the current span; returns its id."""
    _registry.watch_shutdown()
    with _registry.lock:
        task_id = next(_registry.ids)
    attributes = {sc.ROLLOUT_TASK_ID: task_id, sc.EVENT_TARGET: _TARGET, sc.EVENT_NAME: "#task"}
    attributes.update(to_attributes(args))
    span = runtime().tracer.start_span(sc.SPAN_ROLLOUT_TASK, attributes=attributes)
    with _registry.lock:
        _registry.tasks[task_id] = _Task(task_id, span)
    return task_id


def set_task_id(task_id: int | None = None) -> int:
    """Make ``task_id`` (a new task when None or unknown) the current task of this context."""
    if task_id is None or task_id not in _registry.tasks:
        task_id = register_task()
    _task_id.set(task_id)
    return task_id


def get_task_id() -> int | None:
    return _task_id.get()


def get_session_id() -> int | None:
    return _session_id.get()


def register_session(task_id: int | None = None) -> int:
    """A new session (sample) span under its task (the current one, or a new task)."""
    task_id = task_id if task_id is not None else _task_id.get()
    task = _registry.tasks.get(task_id) if task_id is not None else None
    if task is None:
        task = _registry.tasks[register_task()]
    with _registry.lock:
        session_id = next(_registry.ids)
        task.open_sessions += 1
        task.sessions += 1
    attributes = {sc.ROLLOUT_TASK_ID: task.id, sc.ROLLOUT_SESSION_ID: session_id,
                  sc.EVENT_TARGET: _TARGET, sc.EVENT_NAME: "#session"}
    span = runtime().tracer.start_span(sc.SPAN_ROLLOUT_SESSION, context=trace_api.set_span_in_context(task.span),
                                       attributes=attributes)
    with _registry.lock:
        _registry.sessions[session_id] = _Session(session_id, task, span)
    return session_id


@contextlib.contextmanager
def _session_scope() -> Iterator[_Session]:
    session = _registry.sessions[register_session()]
    tokens = (_task_id.set(session.task.id), _session_id.set(session.id))
    attached = context_api.attach(trace_api.set_span_in_context(session.span))
    try:
        yield session
    except BaseException as error:
        _finalize(session, "failed", f"{type(error).__name__}: {error}")
        raise
    finally:
        context_api.detach(attached)
        _session_id.reset(tokens[1])
        _task_id.reset(tokens[0])


def session_context() -> Callable[[F], F]:
    """Decorate the function handling one sample: each call registers a session of the current task."""
    return _in_scope(_session_scope)


# -- phases -------------------------------------------------------------------


def _phase_attributes(phase: str, session: _Session | None, payload: Mapping[str, Any] | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {sc.ROLLOUT_PHASE_NAME: phase, sc.EVENT_TARGET: _TARGET, sc.EVENT_NAME: phase}
    if session is not None:
        attributes[sc.ROLLOUT_SESSION_ID] = session.id
        attributes[sc.ROLLOUT_TASK_ID] = session.task.id
    attributes.update(to_attributes(payload))
    return attributes


def _current_session() -> _Session | None:
    session_id = _session_id.get()
    return _registry.sessions.get(session_id) if session_id is not None else None


@contextlib.contextmanager
def trace_session_phase(phase: str, start_payload: Mapping[str, Any] | None = None,
                        end_payload: Mapping[str, Any] | None = None) -> Iterator[Span]:
    """A ``rollout.phase`` span of the current session; its time adds to ``phase_s.<phase>``."""
    session = _current_session()
    started = time.monotonic()
    parent = trace_api.set_span_in_context(session.span) if session is not None else None
    with runtime().tracer.start_as_current_span(sc.SPAN_ROLLOUT_PHASE, context=parent,
                                                attributes=_phase_attributes(phase, session, start_payload)) as span:
        try:
            yield span
        finally:
            if end_payload:
                span.set_attributes(to_attributes(end_payload))
            if session is not None:
                session.phase_s[phase] = session.phase_s.get(phase, 0.0) + time.monotonic() - started


@contextlib.asynccontextmanager
async def atrace_session_phase(phase: str, start_payload: Mapping[str, Any] | None = None,
                               end_payload: Mapping[str, Any] | None = None) -> AsyncIterator[Span]:
    """``trace_session_phase`` for ``async with``."""
    with trace_session_phase(phase, start_payload, end_payload) as span:
        yield span


def trace_session(phase: str) -> Callable[[F], F]:
    """Decorate a sync or async function: each call is a ``phase`` of the current session."""
    return _in_scope(lambda: trace_session_phase(phase))


# -- lifecycle events -------------------------------------------------------------


@contained(default=None)
def trace_session_event(method: str, session_id: int | None = None, task_id: int | None = None,
                        **payload: Any) -> None:
    """AReaL's manual lifecycle events on one session, or every open session of a task.

    ``mark_finalized`` (``status=``, ``reason=``) ends sessions; ``mark_dropped``
    ends them as dropped; ``mark_<phase>_start`` / ``mark_<phase>_end`` bracket a
    phase by hand; anything else is an event on the session span.
    """
    for session in _targets(session_id, task_id):
        if method == "mark_finalized":
            _finalize(session, str(payload.get("status", "accepted")), payload.get("reason"))
        elif method == "mark_dropped":
            _finalize(session, "dropped", payload.get("reason"))
        elif method.startswith("mark_") and method.endswith("_start"):
            _manual_phase_start(session, method[len("mark_"):-len("_start")], payload)
        elif method.startswith("mark_") and method.endswith("_end"):
            _manual_phase_end(session, method[len("mark_"):-len("_end")], payload)
        else:
            attributes = to_attributes(payload)
            attributes[sc.EVENT_NAME] = method
            session.span.add_event(sc.EVENT_ROLLOUT_SESSION, attributes)


def _targets(session_id: int | None, task_id: int | None) -> list[_Session]:
    if session_id is not None:
        session = _registry.sessions.get(session_id)
        return [session] if session is not None else []
    if task_id is not None:
        return [s for s in list(_registry.sessions.values()) if s.task.id == task_id]
    session = _current_session()
    return [session] if session is not None else []


def _manual_phase_start(session: _Session, phase: str, payload: Mapping[str, Any]) -> None:
    span = runtime().tracer.start_span(sc.SPAN_ROLLOUT_PHASE, context=trace_api.set_span_in_context(session.span),
                                       attributes=_phase_attributes(phase, session, payload))
    previous = session.manual_phases.pop(phase, None)
    if previous is not None:
        _end_manual_phase(session, phase, *previous)
    session.manual_phases[phase] = (span, time.monotonic())


def _manual_phase_end(session: _Session, phase: str, payload: Mapping[str, Any]) -> None:
    entry = session.manual_phases.pop(phase, None)
    if entry is not None:
        entry[0].set_attributes(to_attributes(payload))
        _end_manual_phase(session, phase, *entry)


def _end_manual_phase(session: _Session, phase: str, span: Span, started: float) -> None:
    session.phase_s[phase] = session.phase_s.get(phase, 0.0) + time.monotonic() - started
    span.end()


def _finalize(session: _Session, status: str, reason: Any = None) -> None:
    with _registry.lock:
        if _registry.sessions.pop(session.id, None) is None:
            return  # already finalized
        session.task.open_sessions -= 1
        task_done = session.task.open_sessions <= 0
    for phase, (span, started) in list(session.manual_phases.items()):
        _end_manual_phase(session, phase, span, started)
    span = session.span
    span.set_attribute(sc.ROLLOUT_SESSION_STATUS, status)
    if reason is not None:
        span.set_attribute(sc.ROLLOUT_SESSION_REASON, str(reason)[:1024])
    span.set_attribute(sc.ROLLOUT_SESSION_TOTAL_S, time.monotonic() - session.started)
    for phase, seconds in session.phase_s.items():
        span.set_attribute(sc.ROLLOUT_SESSION_PHASE_S_PREFIX + phase, seconds)
    if status == "failed":
        span.set_status(Status(StatusCode.ERROR, None if reason is None else str(reason)[:512]))
    elif status == "accepted":
        span.set_status(Status(StatusCode.OK))
    span.end()
    if task_done:
        _end_task(session.task)


def _end_task(task: _Task) -> None:
    with _registry.lock:
        if _registry.tasks.pop(task.id, None) is None:
            return
    task.span.set_attribute(sc.ROLLOUT_TASK_SESSIONS, task.sessions)
    task.span.end()


__all__ = [
    "Category",
    "PerfTraceCategory",
    "STATUSES",
    "atrace_scope",
    "atrace_session_phase",
    "get_session_id",
    "get_task_id",
    "instant",
    "register_session",
    "register_task",
    "session_context",
    "set_task_id",
    "trace_perf",
    "trace_scope",
    "trace_session",
    "trace_session_event",
    "trace_session_phase",
]
