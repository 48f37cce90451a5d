"""AReaL's session tracer: one record per rollout session, written as ``sessions-r<rank>.jsonl``.

The records' lifecycle (phases, counters, finalisation, the flush threshold)
is AReaL's; each finished task is handed to ``session_spans`` for its span tree,
and sessions still open at the pipeline's shutdown become spans too.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

from otel_training._contain import call_contained, contained
from otel_training.compat.areal.config import SessionTraceEvent, _at_least_one, _setting
from otel_training.compat.areal.output import _append_lines
from otel_training.compat.areal.session_spans import _emit_task, _TaskSpans
from otel_training.events.attributes import to_attributes
from otel_training.events.runtime import runtime


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
        tracer.span_open_sessions()


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
        call_contained(_watch_shutdown)
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
            elif name.endswith(("_start", "_end")):
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

    def span_open_sessions(self) -> None:
        """The sessions still open become spans now, status as recorded (the pipeline's shutdown calls it)."""
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
