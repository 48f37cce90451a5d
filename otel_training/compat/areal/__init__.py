"""AReaL's ``perf_tracer`` module, so an AReaL program switches by changing one import.

    from otel_training.compat import areal as perf_tracer   # was: from areal.utils import perf_tracer

AReaL's trainers and rollout workflows call this module by name (``configure``,
``save``, ``trace_perf``, ``session_context``, ``trace_session_event``...), and its
tools read what it writes. So the API and the files are AReaL's: Chrome-trace
lines in ``<fileroot>/logs/<user>/<experiment>/<trial>/perf_tracer[/<role>]/traces-r<rank>.jsonl``
and one record per rollout session in ``.../session_tracer[/<role>]/sessions-r<rank>.jsonl``,
written when AReaL would write them (``save``, the flush threshold, exit).

On top, every scope is also an OpenTelemetry span of the configured pipeline
(through the events API, so trace budgets, error attributes and containment
apply), whether or not the AReaL tracer is configured or enabled; and every
session of a configured session tracer becomes a ``rollout.task`` ->
``rollout.session`` -> ``rollout.phase`` span tree with the same timestamps as
its record. Sessions exist only where AReaL has them: with no session tracer,
``register_session`` gives None and a phase makes no span.

Nothing here raises into training code except AReaL's own contract errors
(``get_tracer()`` before ``configure()``, ``configure()`` twice, a negative
rank) and the user's exception leaving a scope. docs/compat-areal.md lists
what is identical and what differs, with reasons.

This package is that one module for AReaL's callers: the process-wide tracer
(``GLOBAL_TRACER``) and the module-level functions live here; the parts
behind them are modules of their own (``config``, ``output``, ``context``,
``sessions`` and ``session_spans``, ``tracer``, ``scope``).
"""

from __future__ import annotations

import atexit
import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any, Literal, TypeVar, cast

from otel_training._contain import contain, contained
from otel_training.compat.areal.config import (
    STATUSES,
    Category,
    CategoryLike,
    PerfTraceCategory,
    PerfTracerConfig,
    SessionTraceEvent,
    SessionTracerConfig,
)
from otel_training.compat.areal.context import (
    _session_id,
    _task_id,
    get_session_id,
    get_task_id,
    set_session_id,
    set_task_id,
)
from otel_training.compat.areal.scope import _NULL, _NullScope, _profiler_module, _Scope, _span_event
from otel_training.compat.areal.sessions import SessionTracer
from otel_training.compat.areal.tracer import PerfTracer

F = TypeVar("F", bound=Callable[..., Any])


def __getattr__(name: str) -> Any:
    """``profiler`` is torch.profiler, imported on first use: importing this module never imports torch."""
    if name == "profiler":
        return _profiler_module()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- the module-level API ---------------------------------------------------------------

GLOBAL_TRACER: PerfTracer | None = None
_global_lock = threading.Lock()


def configure(config: Any, *, rank: int, role: str | None = None) -> PerfTracer:
    """Install the process's tracer (AReaL's ``PerfTracerConfig`` or any object with its fields).

    Raises RuntimeError when one is already installed, as AReaL does: its
    engines check ``is_configured()`` first.
    """
    global GLOBAL_TRACER
    with _global_lock:
        if GLOBAL_TRACER is not None:
            raise RuntimeError("PerfTracer has already been configured; call reset() before configuring again")
        GLOBAL_TRACER = PerfTracer(config, rank=rank, role=role)
        return GLOBAL_TRACER


def is_configured() -> bool:
    with _global_lock:
        return GLOBAL_TRACER is not None


@contained(default=None)
def reset() -> None:
    """Uninstall the tracer (writing its sessions) so that ``configure`` may run again."""
    global GLOBAL_TRACER
    with _global_lock:
        tracer, GLOBAL_TRACER = GLOBAL_TRACER, None
    if tracer is not None:
        tracer.reset()


def get_tracer() -> PerfTracer:
    """The installed tracer; RuntimeError before ``configure``, as in AReaL."""
    tracer = GLOBAL_TRACER
    if tracer is None:
        raise RuntimeError("PerfTracer is not configured. Call perf_tracer.configure(...) first.")
    return tracer


def get_session_tracer() -> SessionTracer | None:
    tracer = GLOBAL_TRACER
    return tracer.session_tracer if tracer is not None else None


def save(*, step: int | None = None, force: bool = False) -> None:
    tracer = GLOBAL_TRACER
    if tracer is not None:
        tracer.save(step=step, force=force)


def trace_scope(name: str, *, category: CategoryLike = None, enable_profiler: bool = False,
                profiler_args: dict[str, Any] | None = None, args: dict[str, Any] | None = None) -> _Scope:
    """A traced block: always a span; a Chrome-trace event too when the tracer is configured and enabled."""
    return _Scope(GLOBAL_TRACER, name, category, enable_profiler, profiler_args, args)


def atrace_scope(name: str, *, category: CategoryLike = None, enable_profiler: bool = False,
                 profiler_args: dict[str, Any] | None = None, args: dict[str, Any] | None = None) -> _Scope:
    """``trace_scope`` for ``async with``."""
    return _Scope(GLOBAL_TRACER, name, category, enable_profiler, profiler_args, args)


@contained(default=None)
def instant(name: str, *, category: CategoryLike = None, args: dict[str, Any] | None = None) -> None:
    """A point in time: a span event always; a Chrome-trace instant when the tracer is enabled."""
    tracer = GLOBAL_TRACER
    if tracer is not None:
        tracer.instant(name, category=category, args=args)
    else:
        _span_event(name, category, args)


def _wrap(function: F, scope: Callable[[], Any]) -> F:
    """Run each call of a sync or async function inside ``scope()``, made at call time."""
    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            async with scope():
                return await function(*args, **kwargs)

        return cast(F, async_wrapper)

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with scope():
            return function(*args, **kwargs)

    return cast(F, wrapper)


def trace_perf(name: str, *, category: CategoryLike = None) -> Callable[[F], F]:
    """Decorate a sync or async function: each call is a scope named ``name``."""
    return lambda function: _wrap(function, lambda: trace_scope(name, category=category))


# -- tasks, sessions, phases --------------------------------------------------------------


def register_task(task_id: int) -> int:
    """Register ``task_id`` with the session tracer (if any) and return it."""
    tracer = get_session_tracer()
    if tracer is not None:
        tracer.register_task(task_id)
    return task_id


def register_session(task_id: int) -> int | None:
    """A new session of ``task_id``: its id, or None when session tracing is off (as in AReaL)."""
    tracer = get_session_tracer()
    return tracer.register_session(task_id) if tracer is not None else None


def session_context() -> Callable[[F], F]:
    """Decorate the function handling one sample: each call registers a session of the current task.

    As in AReaL, the id is set in the caller's context and not restored: an
    ``asyncio`` task has its own copy, so concurrent samples do not mix.
    """

    def activate() -> _NullScope:
        # The user's sample runs whether or not its session could be registered.
        with contain("areal.session_context", "otel_training: internal error registering a session; "
                     "training continues"):
            task_id = _task_id.get()
            _session_id.set(register_session(task_id) if task_id is not None else None)
        return _NULL

    return lambda function: _wrap(function, activate)


@contained(default=None)
def trace_session_event(method: str, session_id: int | None = None, task_id: int | None = None,
                        **payload: Any) -> None:
    """A lifecycle event for one session, or for every unwritten session of a task.

    ``mark_finalized`` (``status=``, ``reason=``), ``mark_<phase>_start`` /
    ``mark_<phase>_end``, ``increment_counter`` (``name=``, ``value=``), and
    ``mark_dropped`` (``reason=``). Without an id, or without a session tracer,
    nothing happens, as in AReaL.
    """
    tracer = get_session_tracer()
    if tracer is None:
        return
    if session_id is not None:
        ids = [session_id]
    elif task_id is not None:
        ids = tracer.get_session_ids(task_id)
    else:
        return
    if method == "increment_counter":
        if payload.get("name"):
            for sid in ids:
                tracer.increment_counter(sid, payload["name"], payload.get("value", 1))
        return
    if not method.startswith("mark_"):
        return
    event = method[len("mark_"):]
    if event != "finalized" and event != "dropped" and not event.endswith(("_start", "_end")):
        return
    for sid in ids:
        tracer.record_event(sid, event, **payload)


class _PhaseScope:
    """A phase of the session current when it was made: ``mark_<phase>_start`` / ``_end`` around the block."""

    __slots__ = ("_session_id", "_phase", "_start_payload", "_end_payload")

    def __init__(self, session_id: int, phase: str, start_payload: dict[str, Any] | None,
                 end_payload: dict[str, Any] | None) -> None:
        self._session_id = session_id
        self._phase = phase
        self._start_payload = start_payload or {}
        self._end_payload = end_payload or {}

    def __enter__(self) -> _PhaseScope:
        trace_session_event(f"mark_{self._phase}_start", session_id=self._session_id, **self._start_payload)
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        trace_session_event(f"mark_{self._phase}_end", session_id=self._session_id, **self._end_payload)
        return False

    async def __aenter__(self) -> _PhaseScope:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> bool:
        return self.__exit__(*exc)


def trace_session_phase(phase: str, *, start_payload: dict[str, Any] | None = None,
                        end_payload: dict[str, Any] | None = None) -> _PhaseScope | _NullScope:
    """A phase of the current session (``generate``, ``reward``, ``toolcall`` or any name); no session: nothing."""
    session_id = _session_id.get()
    if session_id is None:
        return _NULL
    return _PhaseScope(session_id, phase, start_payload, end_payload)


def atrace_session_phase(phase: str, *, start_payload: dict[str, Any] | None = None,
                         end_payload: dict[str, Any] | None = None) -> _PhaseScope | _NullScope:
    """``trace_session_phase`` for ``async with``."""
    return trace_session_phase(phase, start_payload=start_payload, end_payload=end_payload)


def trace_session(phase: str) -> Callable[[F], F]:
    """Decorate a sync or async function: each call is a ``phase`` of the session current at the call."""
    return lambda function: _wrap(function, lambda: trace_session_phase(phase))


@atexit.register
def _save_at_exit() -> None:
    """AReaL writes what is buffered at exit; so do we."""
    tracer = GLOBAL_TRACER
    if tracer is not None and tracer.enabled:
        tracer.save(force=True)


__all__ = [
    "GLOBAL_TRACER",
    "STATUSES",
    "Category",
    "CategoryLike",
    "PerfTraceCategory",
    "PerfTracer",
    "PerfTracerConfig",
    "SessionTraceEvent",
    "SessionTracer",
    "SessionTracerConfig",
    "atrace_scope",
    "atrace_session_phase",
    "configure",
    "get_session_id",
    "get_session_tracer",
    "get_task_id",
    "get_tracer",
    "instant",
    "is_configured",
    "register_session",
    "register_task",
    "reset",
    "save",
    "session_context",
    "set_session_id",
    "set_task_id",
    "trace_perf",
    "trace_scope",
    "trace_session",
    "trace_session_event",
    "trace_session_phase",
]
