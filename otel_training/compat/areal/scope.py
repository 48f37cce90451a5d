"""A traced block (``trace_scope``): always a span; a Chrome-trace event and torch profiling when configured.

The scope talks to its ``PerfTracer`` only through ``_Recorder`` (what it
needs of one), so the tracer can make scopes without the two modules importing
each other. ``torch.profiler`` is loaded here on first use, never at import.
"""

from __future__ import annotations

import contextvars
import json
import os
import tempfile
import time
from collections.abc import Mapping
from types import ModuleType
from typing import Any, Literal, Protocol

from opentelemetry import trace as trace_api
from opentelemetry.trace import Span

from otel_training import semconv as sc
from otel_training._contain import contain, contained, log_once
from otel_training._text import text
from otel_training.compat.areal.config import _TARGET, CategoryLike, _category
from otel_training.compat.areal.context import _global_step, _profiling, _session_id, _task_id
from otel_training.events.attributes import readable, to_attributes
from otel_training.events.duration import Duration
from otel_training.events.process import Process
from otel_training.events.runtime import current_recording_span, runtime

_PROCESS = Process(_TARGET)


class _Recorder(Protocol):
    """What a scope needs of its ``PerfTracer``."""

    @property
    def enabled(self) -> bool: ...

    def _wants_profiler(self, requested: bool, args: Mapping[str, Any] | None) -> bool: ...

    def _complete(self, name: str, start_us: int, duration_ns: int, category: str, args: dict[str, Any]) -> None: ...

    def merge_profiler_trace(self, profiler_traces: Any, base_time_ns: int, *,
                             args: dict[str, Any] | None = None) -> None: ...


class _NoProfiler:
    """Stands for ``torch.profiler`` where torch is not installed: profiling is skipped."""

    profile = None
    ProfilerActivity = None


def _load_profiler() -> Any:
    torch_profiler: ModuleType | _NoProfiler
    try:
        from torch import profiler as torch_profiler
    except Exception:  # noqa: BLE001 - no torch: scopes still trace, without kernels
        torch_profiler = _NoProfiler()
    globals()["profiler"] = torch_profiler
    return torch_profiler


def _profiler_module() -> Any:
    return globals().get("profiler") or _load_profiler()


def _now_us() -> int:
    """Microseconds since the epoch: ranks' files line up when merged, and with the spans' times."""
    return time.time_ns() // 1000


def _scope_attributes(category: str) -> dict[str, Any]:
    attributes: dict[str, Any] = {sc.PERF_CATEGORY: category}
    task_id, session_id = _task_id.get(), _session_id.get()
    if session_id is not None:
        attributes[sc.ROLLOUT_SESSION_ID] = session_id
    if task_id is not None:
        attributes[sc.ROLLOUT_TASK_ID] = task_id
    return attributes


class _Scope:
    """A traced block, sync or async: a span, plus a Chrome-trace event and profiling when configured.

    Everything but the block itself is contained: a failing pipeline, a bad
    argument or a broken profiler costs a log line, never the block.
    """

    __slots__ = ("_tracer", "_name", "_category", "_args", "_profile", "_profiler_args", "_duration", "_start_ns",
                 "_start_us", "_profiler", "_tokens")

    def __init__(self, tracer: _Recorder | None, name: str, category: CategoryLike, enable_profiler: bool,
                 profiler_args: dict[str, Any] | None, args: dict[str, Any] | None) -> None:
        self._tracer = tracer
        self._name = name
        self._category = category
        self._args = args
        self._profile = enable_profiler
        self._profiler_args = profiler_args
        self._duration: Duration | None = None
        self._start_ns = 0
        self._start_us = 0
        self._profiler: Any = None
        self._tokens: list[tuple[contextvars.ContextVar[Any], contextvars.Token[Any]]] = []

    @property
    def span(self) -> Span:
        """The scope's OpenTelemetry span (a non-recording one outside the block)."""
        return self._duration.span if self._duration is not None else trace_api.INVALID_SPAN

    def __enter__(self) -> _Scope:
        # The user's block runs even if its span or profiler cannot start.
        with contain("areal.scope.enter", "otel_training: internal error entering a perf_tracer scope; "
                     "training continues"):
            self._category = _category(self._category)
            self._duration = Duration(_PROCESS, self._name, readable(self._args), attributes=_scope_attributes(self._category))
            self._duration.begin()
            tracer = self._tracer
            if tracer is not None:
                if self._args and self._args.get("global_step") is not None:
                    self._tokens.append((_global_step, _global_step.set(self._args["global_step"])))
                if tracer._wants_profiler(self._profile, self._args):  # noqa: SLF001 - PerfTracer's, through this module's _Recorder protocol
                    self._start_profiler()
        self._start_us = _now_us()
        self._start_ns = time.perf_counter_ns()
        return self

    def _start_profiler(self) -> None:
        module = _profiler_module()
        if module.profile is None:
            log_once("areal.no_torch", "otel_training: enable_profiler needs torch; profiling skipped",
                     exc_info=False)
            return
        kwargs = dict(self._profiler_args or {})
        kwargs.setdefault("record_shapes", False)
        kwargs.setdefault("with_stack", False)
        activities = None
        if module.ProfilerActivity is not None:
            activities = [module.ProfilerActivity.CPU]
            if _cuda_available():
                activities.append(module.ProfilerActivity.CUDA)
        profile = module.profile(activities=activities, **kwargs)
        profile.__enter__()
        self._profiler = profile
        self._tokens.append((_profiling, _profiling.set(True)))

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        duration_ns = time.perf_counter_ns() - self._start_ns
        # Leaving the scope must not raise over the user's block or its exception.
        with contain("areal.scope.exit", "otel_training: internal error leaving a perf_tracer scope; "
                     "training continues"):
            tracer = self._tracer
            if self._profiler is not None:
                self._stop_profiler(exc_type, exc, tb)
            for var, token in reversed(self._tokens):
                var.reset(token)
            self._tokens.clear()
            if tracer is not None and tracer.enabled:
                args = dict(self._args or {})
                if exc_type is not None:
                    args.setdefault("exception", exc_type.__name__)
                tracer._complete(self._name, self._start_us, duration_ns, str(self._category), args)  # noqa: SLF001 - PerfTracer's recorder, through this module's _Recorder protocol
        if self._duration is not None:
            self._duration.__exit__(exc_type, exc, tb)  # contained; records the user's exception
        return False

    def _stop_profiler(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        profile, self._profiler = self._profiler, None
        profile.__exit__(exc_type, exc, tb)
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "profile.json")
            profile.export_chrome_trace(path)
            with open(path, encoding="utf-8") as source:
                trace = json.load(source)
        assert self._tracer is not None
        self._tracer.merge_profiler_trace(trace, self._start_us * 1000, args=self._args)

    async def __aenter__(self) -> _Scope:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        return self.__exit__(exc_type, exc, tb)


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a torch that fails to import or query CUDA: profile the CPU only
        return False


@contained(default=None)
def _span_event(name: str, category: CategoryLike, args: Mapping[str, Any] | None) -> None:
    """An instant: an event on the current span, or on the process span when none is current."""
    attributes = to_attributes(args)
    attributes[sc.PERF_CATEGORY] = _category(category)
    attributes[sc.EVENT_TARGET] = _TARGET
    attributes[sc.EVENT_NAME] = text(name)
    span = current_recording_span() or runtime().process_span(_TARGET)
    span.add_event(text(name), attributes)


class _NullScope:
    """What a phase is outside a session: nothing, as in AReaL."""

    def __enter__(self) -> _NullScope:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        return False

    async def __aenter__(self) -> _NullScope:
        return self

    async def __aexit__(self, *exc: object) -> bool:
        return False


_NULL = _NullScope()
