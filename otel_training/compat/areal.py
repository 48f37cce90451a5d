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
"""

from __future__ import annotations

import atexit
import contextvars
import functools
import getpass
import inspect
import json
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from opentelemetry import trace as trace_api
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext

from otel_training import semconv as sc
from otel_training._contain import contained, log_once
from otel_training.events.attributes import readable, text, to_attributes
from otel_training.events.duration import Duration
from otel_training.events.process import Process
from otel_training.events.runtime import current_recording_span, runtime
from otel_training.integrations.spans import record_span

F = TypeVar("F", bound=Callable[..., Any])

STATUSES = ("accepted", "rejected", "failed", "dropped")
_TARGET = "PerfTracer"
_PROCESS = Process(_TARGET)


class PerfTraceCategory(str, Enum):
    """AReaL's scope categories: the Chrome-trace ``cat`` and the span's ``perf.category``."""

    COMPUTE = "compute"
    COMM = "comm"
    IO = "io"
    SYNC = "sync"
    SCHEDULER = "scheduler"
    INSTR = "instr"
    MISC = "misc"


Category = PerfTraceCategory
CategoryLike = PerfTraceCategory | str | None

_ALIASES = {"communication": "comm", "synchronization": "sync", "scheduling": "scheduler",
            "instrumentation": "instr"}


def _category(category: CategoryLike) -> str:
    """AReaL keeps an unknown category as given (``session.sess-0``) and folds the long names."""
    if isinstance(category, PerfTraceCategory):
        return category.value
    if isinstance(category, str) and category.strip():
        low = category.strip().lower()
        if low in _ALIASES:
            return _ALIASES[low]
        return low if low in PerfTraceCategory._value2member_map_ else category
    return PerfTraceCategory.MISC.value


class SessionTraceEvent(str, Enum):
    """The lifecycle events of a session record (``SessionTracer.record_event``)."""

    FINALIZED = "finalized"
    GENERATE_START = "generate_start"
    GENERATE_END = "generate_end"
    REWARD_START = "reward_start"
    REWARD_END = "reward_end"
    TOOLCALL_START = "toolcall_start"
    TOOLCALL_END = "toolcall_end"


# -- configuration -------------------------------------------------------------


@dataclass
class SessionTracerConfig:
    """AReaL's ``SessionTracerConfig``, for programs that do not import AReaL's own."""

    enabled: bool = False
    flush_threshold: int = 256


@dataclass
class PerfTracerConfig:
    """AReaL's ``PerfTracerConfig``; ``configure`` accepts AReaL's own (or any object with these fields)."""

    experiment_name: str = "default"
    trial_name: str = "default"
    fileroot: str = "/tmp/areal"
    enabled: bool = False
    save_interval: int = 1
    profile_steps: list[int] | None = None
    session_tracer: SessionTracerConfig | None = None


def _setting(config: Any, name: str, default: Any) -> Any:
    if isinstance(config, Mapping):
        return config.get(name, default)
    return getattr(config, name, default)


def _at_least_one(value: Any) -> int:
    try:
        return max(int(value), 1)
    except (TypeError, ValueError):
        return 1


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in a container: AReaL would raise here
        return str(os.getuid()) if hasattr(os, "getuid") else "user"


def _output_path(config: Any, rank: int, role: str | None, subdir: str, stem: str) -> str | None:
    """AReaL's layout, so its converter and plotting tools find the files; None where it cannot be built."""
    try:
        parts = [_setting(config, name, None) for name in ("fileroot", "experiment_name", "trial_name")]
        # Unset (None, OmegaConf's "???"): AReaL fails on these; a directory named "None" is no better.
        if any(not isinstance(part, str | os.PathLike) or str(part) in ("", "???") for part in parts):
            raise ValueError(f"fileroot, experiment_name and trial_name must be set, not {parts!r}")
        base = os.path.join(os.path.expanduser(os.path.expandvars(str(parts[0]))), "logs", _user(), str(parts[1]),
                            str(parts[2]), subdir)
        if role:
            base = os.path.join(base, role)
        return os.path.join(base, f"{stem}-r{rank}.jsonl")
    except Exception:  # noqa: BLE001
        log_once("areal.output_path", "otel_training: cannot build the AReaL trace path from the config; "
                 "no AReaL trace files are written")
        return None


def _append_lines(path: str | None, items: list[dict[str, Any]]) -> bool:
    """Append JSON lines (fsynced, as AReaL does); an unserialisable value is written as its text."""
    if path is None:
        return True
    try:
        lines = [json.dumps(item, ensure_ascii=False, default=text) for item in items]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a", encoding="utf-8") as out:
            out.write("".join(line + "\n" for line in lines))
            out.flush()
            os.fsync(out.fileno())
        return True
    except Exception:  # noqa: BLE001 - a full disk must not stop training; kept for the next save
        log_once(f"areal.write:{path}", "otel_training: cannot append to %s; kept for the next save", path)
        return False


# -- context ---------------------------------------------------------------------

_task_id: contextvars.ContextVar[int | None] = contextvars.ContextVar("otel_training_areal_task", default=None)
_session_id: contextvars.ContextVar[int | None] = contextvars.ContextVar("otel_training_areal_session",
                                                                         default=None)
_global_step: contextvars.ContextVar[Any] = contextvars.ContextVar("otel_training_areal_step", default=None)
_profiling: contextvars.ContextVar[bool] = contextvars.ContextVar("otel_training_areal_profiling", default=False)


def set_task_id(task_id: int | None) -> None:
    """Make ``task_id`` the task of this context (it follows ``await`` and ``asyncio`` tasks)."""
    _task_id.set(task_id)


def get_task_id() -> int | None:
    return _task_id.get()


def set_session_id(session_id: int | None) -> None:
    """Make ``session_id`` the session of this context; phases and scopes find it here."""
    _session_id.set(session_id)


def get_session_id() -> int | None:
    return _session_id.get()


# -- session records -------------------------------------------------------------


class _Phase:
    """One execution of a phase; the payloads go to its span only, not to AReaL's record."""

    __slots__ = ("start_ts", "end_ts", "attributes")

    def __init__(self, start_ts: float, end_ts: float | None = None) -> None:
        self.start_ts = start_ts
        self.end_ts = end_ts
        self.attributes: dict[str, Any] = {}

    def to_dict(self) -> dict[str, float | None]:
        return {"start_ts": self.start_ts, "end_ts": self.end_ts}


_RECORD_KEYS = ("task_id", "session_id", "rank", "role", "status", "reason", "submit_ts", "finalized_ts",
                "total_s", "phases", "counters")
_DEFAULT_PHASES = ("generate", "reward", "toolcall")


class _Record:
    """A session's lifecycle, serialised as AReaL's ``sessions-r<rank>.jsonl`` line."""

    __slots__ = ("task_id", "session_id", "rank", "role", "submit_ts", "status", "reason", "finalized_ts",
                 "phases", "active", "counters", "task", "spanned")

    def __init__(self, task_id: int, session_id: int, rank: int, role: str | None, task: _TaskSpans) -> None:
        self.task_id = task_id
        self.session_id = session_id
        self.rank = rank
        self.role = role
        self.submit_ts = time.time()
        self.status = "pending"
        self.reason: Any = None
        self.finalized_ts: float | None = None
        self.phases: dict[str, list[_Phase]] = {}
        self.active: dict[str, _Phase | None] = {}
        self.counters: dict[str, int] = {}
        self.task = task
        self.spanned = False

    def ready(self) -> bool:
        return self.status in ("rejected", "failed", "dropped") or (
            self.status == "accepted" and self.finalized_ts is not None)

    def phase_event(self, phase: str, role: str, now: float, payload: Mapping[str, Any]) -> None:
        """AReaL's pairing: a start opens a new execution; an end closes the open one, or is an instant one."""
        entries = self.phases.setdefault(phase, [])
        current = self.active.get(phase)
        if role == "start":
            entry = _Phase(now)
            entries.append(entry)
            self.active[phase] = entry
        else:
            if current is None or current.end_ts is not None:
                entry = _Phase(now)
                entries.append(entry)
            else:
                entry = current
            entry.end_ts = now
            self.active[phase] = None
        entry.attributes.update(to_attributes(payload))

    def phase_seconds(self, phase: str) -> float | None:
        done = [p.end_ts - p.start_ts for p in self.phases.get(phase, ()) if p.end_ts is not None]
        return sum(done) if done else None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"task_id": self.task_id, "session_id": self.session_id, "rank": self.rank}
        if self.role is not None:
            data["role"] = self.role
        data["status"] = self.status
        if self.reason is not None:
            data["reason"] = self.reason
        data["submit_ts"] = self.submit_ts
        if self.finalized_ts is not None:
            data["finalized_ts"] = self.finalized_ts
            data["total_s"] = self.finalized_ts - self.submit_ts
        # AReaL's three phases first, in its order; other phases (ours only) after them.
        names = [p for p in _DEFAULT_PHASES if p in self.phases]
        names += [p for p in self.phases if p not in _DEFAULT_PHASES and f"{p}_s" not in _RECORD_KEYS]
        for phase in names:
            seconds = self.phase_seconds(phase)
            if seconds is not None:
                data[f"{phase}_s"] = seconds
        if any(self.phases.values()):
            data["phases"] = {name: [p.to_dict() for p in entries] for name, entries in self.phases.items() if entries}
        if any(self.counters.values()):
            data["counters"] = {k: v for k, v in self.counters.items() if v}
        return data


class _TaskSpans:
    """A task's sessions waiting for their span tree, emitted when the last one is over.

    The tree is recorded after the fact (``record_span``) from the records' own
    timestamps, so a session's span and its line in ``sessions-r<rank>.jsonl``
    agree, and no span is left open across the rollout.
    """

    __slots__ = ("task_id", "start_ns", "parent", "open", "done")

    def __init__(self, task_id: int) -> None:
        self.task_id = task_id
        self.start_ns = time.time_ns()
        span = trace_api.get_current_span()
        self.parent: SpanContext | None = span.get_span_context() if span.is_recording() else None
        self.open = 0
        self.done: list[tuple[dict[str, Any], dict[str, list[tuple[float, float | None, dict[str, Any]]]],
                              dict[str, int], float]] = []


def _emit_task(task: _TaskSpans) -> None:
    try:
        parent = NonRecordingSpan(task.parent) if task.parent is not None else None
        end_ns = max(int(end * 1e9) for *_, end in task.done)
        start_ns = min([task.start_ns] + [int(d[0]["submit_ts"] * 1e9) for d in task.done])
        task_span = record_span(sc.SPAN_ROLLOUT_TASK, "#task", start_ns, end_ns,
                                {sc.ROLLOUT_TASK_ID: task.task_id, sc.ROLLOUT_TASK_SESSIONS: len(task.done)},
                                parent=parent or trace_api.INVALID_SPAN, target=_TARGET)
        for data, phases, counters, end in task.done:
            _emit_session(task_span, data, phases, counters, end)
    except Exception:  # noqa: BLE001 - the records are written regardless; only their spans are lost
        log_once("areal.emit_task", "otel_training: internal error emitting a rollout task's spans; "
                 "training continues")


def _emit_session(parent: Span, data: dict[str, Any], phases: dict[str, list[tuple[float, float | None,
                  dict[str, Any]]]], counters: dict[str, int], end: float) -> None:
    ids = {sc.ROLLOUT_TASK_ID: data["task_id"], sc.ROLLOUT_SESSION_ID: data["session_id"]}
    attributes = dict(ids)
    attributes[sc.ROLLOUT_SESSION_STATUS] = data["status"]
    if data.get("reason") is not None:
        attributes[sc.ROLLOUT_SESSION_REASON] = text(data["reason"])[:1024]
    if "total_s" in data:
        attributes[sc.ROLLOUT_SESSION_TOTAL_S] = data["total_s"]
    for phase in phases:
        if f"{phase}_s" in data:
            attributes[sc.ROLLOUT_SESSION_PHASE_S_PREFIX + phase] = data[f"{phase}_s"]
    attributes.update(to_attributes(counters))
    error = None
    if data["status"] == "failed":
        error = text(data.get("reason") or "failed")
    session_span = record_span(sc.SPAN_ROLLOUT_SESSION, "#session", int(data["submit_ts"] * 1e9), int(end * 1e9),
                               attributes, parent=parent, target=_TARGET, error=error)
    for phase, executions in phases.items():
        for start, stop, payload in executions:
            phase_attributes = {sc.ROLLOUT_PHASE_NAME: phase, **ids, **payload}
            record_span(sc.SPAN_ROLLOUT_PHASE, phase, int(start * 1e9), int((end if stop is None else stop) * 1e9),
                        phase_attributes, parent=session_span, target=_TARGET)


_session_tracers: weakref.WeakSet[SessionTracer] = weakref.WeakSet()
_watched_telemetry: list[Any] = [None]


def _watch_shutdown() -> None:
    """At the pipeline's shutdown, sessions still open become spans (status as recorded) rather than nothing."""
    rt = runtime()
    if rt.telemetry is not _watched_telemetry[0]:
        _watched_telemetry[0] = rt.telemetry
        rt.telemetry.on_shutdown(_span_open_sessions)


def _span_open_sessions() -> None:
    for tracer in list(_session_tracers):
        tracer._span_all()


class SessionTracer:
    """AReaL's per-session lifecycle tracker: records, derived ``*_s`` metrics, and their spans."""

    def __init__(self, config: Any, *, output_path: str | None, rank: int, role: str | None = None) -> None:
        self._config = config
        self._rank = rank
        self._role = role
        self._lock = threading.Lock()
        self._next_session_id = 0
        self._task_sessions: dict[int, set[int]] = {}
        self._records: dict[int, _Record] = {}
        self._ready: set[int] = set()
        self._tasks: dict[int, _TaskSpans] = {}
        self._flush_threshold = _at_least_one(_setting(config, "flush_threshold", 256))
        self._output_path = output_path
        _session_tracers.add(self)

    @property
    def output_path(self) -> str | None:
        return self._output_path

    @contained(default=None)
    def register_task(self, task_id: int) -> None:
        """A task (one dataset item) whose sessions follow; its span starts now."""
        with self._lock:
            self._task_sessions.setdefault(task_id, set())
            if task_id not in self._tasks:
                self._tasks[task_id] = _TaskSpans(task_id)

    @contained(default=None)
    def register_session(self, task_id: int) -> int | None:
        """A new session (one sample) of ``task_id``; ids count from 0 per tracer, as AReaL's do."""
        contained()(_watch_shutdown)()
        with self._lock:
            session_id = self._next_session_id
            self._next_session_id += 1
            task = self._tasks.get(task_id)
            if task is None:
                task = self._tasks[task_id] = _TaskSpans(task_id)
            task.open += 1
            self._records[session_id] = _Record(task_id, session_id, self._rank, self._role, task)
            self._task_sessions.setdefault(task_id, set()).add(session_id)
        return session_id

    def get_session_ids(self, task_id: int) -> list[int]:
        """The task's sessions not yet written (AReaL lists written ones too; they take no events)."""
        with self._lock:
            return sorted(self._task_sessions.get(task_id, ()))

    @contained(default=None)
    def record_event(self, session_id: int, event: SessionTraceEvent | str, **payload: Any) -> None:
        """Apply a lifecycle event: ``finalized`` (``status=``, ``reason=``) or ``<phase>_start`` / ``_end``."""
        name = event.value if isinstance(event, SessionTraceEvent) else str(event)
        emit: _TaskSpans | None = None
        with self._lock:
            record = self._records.get(session_id)
            if record is None:
                return
            now = time.time()
            if name == SessionTraceEvent.FINALIZED.value:
                record.finalized_ts = now
                if payload.get("status") is not None:
                    record.status = str(payload["status"])
                if "reason" in payload:
                    record.reason = payload["reason"]
                self._ready.add(session_id)
                emit = self._close_span(record)
            elif name == "dropped":
                record.status = "dropped"
                record.finalized_ts = now
                if "reason" in payload:
                    record.reason = payload["reason"]
                self._ready.add(session_id)
                emit = self._close_span(record)
            elif name.endswith("_start") or name.endswith("_end"):
                phase, _, role = name.rpartition("_")
                if not phase:
                    return
                record.phase_event(phase, role, now, payload)
                if record.ready():
                    self._ready.add(session_id)
            else:
                return
            flush = len(self._ready) >= self._flush_threshold
        if emit is not None:
            _emit_task(emit)
        if flush:
            self.flush()

    @contained(default=None)
    def increment_counter(self, session_id: int, name: str, value: int = 1) -> None:
        with self._lock:
            record = self._records.get(session_id)
            if record is None:
                return
            record.counters[name] = record.counters.get(name, 0) + value
            if record.ready():
                self._ready.add(session_id)

    def _close_span(self, record: _Record) -> _TaskSpans | None:
        """Under the lock: hand the session to its task; the task, if this was its last open session."""
        if record.spanned:
            return None
        record.spanned = True
        phases = {name: [(p.start_ts, p.end_ts, dict(p.attributes)) for p in entries]
                  for name, entries in record.phases.items() if entries}
        end = record.finalized_ts if record.finalized_ts is not None else time.time()
        task = record.task
        task.done.append((record.to_dict(), phases, dict(record.counters), end))
        task.open -= 1
        if task.open > 0:
            return None
        if self._tasks.get(task.task_id) is task:
            del self._tasks[task.task_id]
        return task

    def _span_all(self) -> None:
        with self._lock:
            tasks = [t for t in (self._close_span(r) for r in list(self._records.values())) if t is not None]
        for task in tasks:
            _emit_task(task)

    @contained(default=None)
    def flush(self, force: bool = False) -> None:
        """Write the finished sessions (every session with ``force``) to ``sessions-r<rank>.jsonl``."""
        tasks: list[_TaskSpans] = []
        with self._lock:
            ids = list(self._records) if force else list(self._ready)
            records = []
            for session_id in ids:
                record = self._records.get(session_id)
                if record is None:
                    self._ready.discard(session_id)
                elif force or record.ready():
                    records.append(record)
            for record in records:
                self._records.pop(record.session_id, None)
                self._ready.discard(record.session_id)
                task = self._close_span(record)
                if task is not None:
                    tasks.append(task)
                sessions = self._task_sessions.get(record.task_id)
                if sessions is not None:
                    sessions.discard(record.session_id)
                    if not sessions and record.task_id not in self._tasks:
                        del self._task_sessions[record.task_id]  # AReaL keeps every task's ids for the whole run
        for task in tasks:
            _emit_task(task)
        if records and not _append_lines(self._output_path, [r.to_dict() for r in records]):
            with self._lock:
                for record in records:
                    self._records.setdefault(record.session_id, record)
                    if record.ready():
                        self._ready.add(record.session_id)

    @contained(default=None)
    def reset(self) -> None:
        """Write every session (AReaL's reset does), then start again from session id 0."""
        self.flush(force=True)
        with self._lock:
            self._records.clear()
            self._ready.clear()
            self._task_sessions.clear()
            self._tasks.clear()
            self._next_session_id = 0
            self._flush_threshold = _at_least_one(_setting(self._config, "flush_threshold", 256))


# -- the Chrome-trace tracer -------------------------------------------------------

_thread_local = threading.local()


def _thread_id() -> int:
    tid = getattr(_thread_local, "tid", None)
    if tid is None:
        tid = _thread_local.tid = threading.get_native_id()
    return tid


class _NoProfiler:
    """Stands for ``torch.profiler`` where torch is not installed: profiling is skipped."""

    profile = None
    ProfilerActivity = None


def _load_profiler() -> Any:
    try:
        from torch import profiler as torch_profiler
    except Exception:  # noqa: BLE001 - no torch: scopes still trace, without kernels
        torch_profiler = _NoProfiler()
    globals()["profiler"] = torch_profiler
    return torch_profiler


def __getattr__(name: str) -> Any:
    """``profiler`` is torch.profiler, imported on first use: importing this module never imports torch."""
    if name == "profiler":
        return _load_profiler()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _profiler_module() -> Any:
    return globals().get("profiler") or _load_profiler()


class PerfTracer:
    """AReaL's tracer: Chrome-trace events in memory, appended to ``traces-r<rank>.jsonl`` at ``save``."""

    def __init__(self, config: Any, *, rank: int, role: str | None = None) -> None:
        if rank < 0:
            raise ValueError("rank must be a non-negative integer")
        self._config = config
        self._rank = rank
        self._role = role
        self._enabled = bool(_setting(config, "enabled", False))
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._thread_meta_emitted: set[int] = set()
        self._process_meta_emitted: set[int] = set()
        self._virtual_tids: dict[tuple[int, int], int] = {}
        self._output_path = _output_path(config, rank, role, "perf_tracer", "traces")
        self._save_interval = _at_least_one(_setting(config, "save_interval", 1))
        self._profile_steps = self._steps(_setting(config, "profile_steps", None))
        self._session_tracer: SessionTracer | None = None
        session_config = _setting(config, "session_tracer", None)
        if session_config is not None and _setting(session_config, "enabled", False):
            self._session_tracer = SessionTracer(
                session_config, output_path=_output_path(config, rank, role, "session_tracer", "sessions"),
                rank=rank, role=role)

    @staticmethod
    def _steps(steps: Any) -> frozenset[int]:
        out: set[int] = set()
        for step in steps or ():
            try:
                out.add(int(step))
            except (TypeError, ValueError):
                log_once("areal.profile_steps", "otel_training: ignoring profile_steps entry %r", step,
                         exc_info=False)
        return frozenset(out)

    @property
    def enabled(self) -> bool:
        return self._enabled

    def set_enabled(self, flag: bool) -> None:
        self._enabled = bool(flag)

    @property
    def session_tracer(self) -> SessionTracer | None:
        return self._session_tracer

    @property
    def output_path(self) -> str | None:
        return self._output_path

    def trace_scope(self, name: str, *, category: CategoryLike = None, enable_profiler: bool = False,
                    profiler_args: dict[str, Any] | None = None, args: dict[str, Any] | None = None) -> _Scope:
        """A scope: a Chrome-trace complete event (when enabled) and an OpenTelemetry span."""
        return _Scope(self, name, category, enable_profiler, profiler_args, args)

    def atrace_scope(self, name: str, *, category: CategoryLike = None, enable_profiler: bool = False,
                     profiler_args: dict[str, Any] | None = None, args: dict[str, Any] | None = None) -> _Scope:
        """``trace_scope`` for ``async with`` (the same object serves both)."""
        return _Scope(self, name, category, enable_profiler, profiler_args, args)

    @contained(default=None)
    def instant(self, name: str, *, category: CategoryLike = None, args: dict[str, Any] | None = None) -> None:
        _span_event(name, category, args)
        if self._enabled:
            self._record({"name": name, "ph": "i", "ts": _now_us(), "pid": self._pid, "tid": _thread_id(),
                          "cat": _category(category), "args": dict(args or {}), "s": "t"})

    def _wants_profiler(self, requested: bool, args: Mapping[str, Any] | None) -> bool:
        if not (requested and self._enabled and self._profile_steps) or _profiling.get():
            return False
        step = args.get("global_step") if args and "global_step" in args else _global_step.get()
        try:
            return step is not None and int(step) in self._profile_steps
        except (TypeError, ValueError):
            return False

    def _complete(self, name: str, start_us: int, duration_ns: int, category: str, args: dict[str, Any]) -> None:
        # A viewer drops a complete event that rounds to 0 µs: AReaL keeps at least 1.
        self._record({"name": name, "ph": "X", "ts": start_us, "dur": max(duration_ns // 1000, 1), "pid": self._pid,
                      "tid": _thread_id(), "cat": category, "args": args})

    def _record(self, event: dict[str, Any]) -> None:
        if not self._enabled:
            return
        pid = self._pid
        meta: list[dict[str, Any]] = []
        tid = event.get("tid")
        if isinstance(tid, int) and tid not in self._thread_meta_emitted:
            self._thread_meta_emitted.add(tid)
            meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                         "args": {"name": threading.current_thread().name}})
        if pid not in self._process_meta_emitted:
            self._process_meta_emitted.add(pid)
            label = f"Rank {self._rank}, Process" if self._role is None else f"[{self._role}] Rank {self._rank}, Process"
            meta.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": label}})
            meta.append({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": self._rank}})
        event["pid"] = pid
        if event.get("ph") != "M":
            args = event.setdefault("args", {})
            args.setdefault("rank", self._rank)
            if self._role is not None:
                args.setdefault("role", self._role)
        with self._lock:
            self._events.extend(meta)
            self._events.append(event)

    @contained(default=None)
    def merge_profiler_trace(self, profiler_traces: Any, base_time_ns: int, *,
                             args: dict[str, Any] | None = None) -> None:
        """Fold a torch profiler Chrome trace into this rank's stream, starting where its scope started.

        ``base_time_ns`` is the scope's start (wall clock, ns). The profiler's
        threads and streams become negative thread ids of this process, named
        ``[Profiler Thread n]`` / ``[Profiler Stream n]``, so they sort below the
        host threads and never collide with them.
        """
        if not self._enabled or not isinstance(profiler_traces, Mapping):
            return
        events = [e for e in profiler_traces.get("traceEvents") or () if isinstance(e, dict)]
        stamps = [e["ts"] for e in events if isinstance(e.get("ts"), int | float)]
        if not stamps:
            return
        shift = base_time_ns / 1000.0 - min(stamps)
        names: dict[tuple[int, int], str] = {}
        for event in events:
            if event.get("ph") == "M" and event.get("name") == "thread_name":
                try:
                    names[(int(event["pid"]), int(event["tid"]))] = str(event["args"]["name"])
                except (KeyError, TypeError, ValueError):
                    pass
        merged: list[dict[str, Any]] = []
        skip_meta = {"process_name", "process_sort_index", "process_labels", "thread_name", "thread_sort_index"}
        with self._lock:
            for event in events:
                if event.get("ph") == "M" and event.get("name") in skip_meta:
                    continue
                try:
                    pid, tid = int(event.get("pid", -1)), int(event.get("tid", -1))
                except (TypeError, ValueError):
                    continue  # the profiler's own "Spans"/"Traces" rows
                if pid < 0:
                    continue
                virtual = self._virtual_tids.get((pid, tid))
                if virtual is None:
                    virtual = self._virtual_tids[(pid, tid)] = -1 - len(self._virtual_tids)
                    words = names.get((pid, tid), "").strip().lower().split()
                    label = (f"[Profiler Stream {words[1]}]" if len(words) >= 2 and words[0] == "stream"
                             and words[1].isdigit() else f"[Profiler Thread {tid}]")
                    merged.append({"name": "thread_name", "ph": "M", "pid": self._pid, "tid": virtual,
                                   "args": {"name": label, "rank": self._rank}})
                copy = dict(event, pid=self._pid, tid=virtual)
                if isinstance(copy.get("ts"), int | float):
                    copy["ts"] = copy["ts"] + shift
                copy["args"] = dict(copy["args"]) if isinstance(copy.get("args"), dict) else {}
                copy["args"]["rank"] = self._rank
                if self._role is not None:
                    copy["args"]["role"] = self._role
                merged.append(copy)
            self._events.extend(merged)

    @contained(default=None)
    def save(self, *, step: int | None = None, force: bool = False) -> None:
        """Append the buffered events; with ``save_interval`` n, only at steps n-1, 2n-1... unless ``force``."""
        if self._session_tracer is not None and force:
            self._session_tracer.flush(force=True)
        if not self._enabled:
            return
        if not force and step is not None and self._save_interval > 1 and (step + 1) % self._save_interval:
            return
        with self._lock:
            events, self._events = self._events, []
        if events and not _append_lines(self._output_path, events):
            with self._lock:
                self._events[0:0] = events

    @contained(default=None)
    def reset(self) -> None:
        """Write the sessions, drop unsaved events, and start over with the configured settings."""
        if self._session_tracer is not None:
            self._session_tracer.reset()
        with self._lock:
            self._events = []
            self._thread_meta_emitted = set()
            self._process_meta_emitted = set()
            self._enabled = bool(_setting(self._config, "enabled", False))
            self._save_interval = _at_least_one(_setting(self._config, "save_interval", 1))


def _now_us() -> int:
    """Microseconds since the epoch: ranks' files line up when merged, and with the spans' times."""
    return time.time_ns() // 1000


# -- scopes -------------------------------------------------------------------------


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

    def __init__(self, tracer: PerfTracer | None, name: str, category: CategoryLike, enable_profiler: bool,
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
        try:
            self._category = _category(self._category)
            self._duration = Duration(_PROCESS, self._name, readable(self._args), attributes=_scope_attributes(self._category))
            self._duration.begin()
            tracer = self._tracer
            if tracer is not None:
                if self._args and self._args.get("global_step") is not None:
                    self._tokens.append((_global_step, _global_step.set(self._args["global_step"])))
                if tracer._wants_profiler(self._profile, self._args):
                    self._start_profiler()
        except Exception:  # noqa: BLE001
            log_once("areal.scope.enter", "otel_training: internal error entering a perf_tracer scope; "
                     "training continues")
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

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        duration_ns = time.perf_counter_ns() - self._start_ns
        try:
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
                tracer._complete(self._name, self._start_us, duration_ns, str(self._category), args)
        except Exception:  # noqa: BLE001
            log_once("areal.scope.exit", "otel_training: internal error leaving a perf_tracer scope; "
                     "training continues")
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
    except Exception:  # noqa: BLE001
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

    def __exit__(self, *exc: Any) -> bool:
        return False

    async def __aenter__(self) -> _NullScope:
        return self

    async def __aexit__(self, *exc: Any) -> bool:
        return False


_NULL = _NullScope()


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

        return async_wrapper  # type: ignore[return-value]

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with scope():
            return function(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


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
        try:
            task_id = _task_id.get()
            _session_id.set(register_session(task_id) if task_id is not None else None)
        except Exception:  # noqa: BLE001
            log_once("areal.session_context", "otel_training: internal error registering a session; "
                     "training continues")
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

    def __exit__(self, *exc: Any) -> bool:
        trace_session_event(f"mark_{self._phase}_end", session_id=self._session_id, **self._end_payload)
        return False

    async def __aenter__(self) -> _PhaseScope:
        return self.__enter__()

    async def __aexit__(self, *exc: Any) -> bool:
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
