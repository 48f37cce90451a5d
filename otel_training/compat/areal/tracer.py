"""AReaL's ``PerfTracer``: Chrome-trace events in memory, appended to ``traces-r<rank>.jsonl`` at ``save``.

It owns the rank's event stream (metadata rows, complete events, instants,
merged torch-profiler traces) and the rank's session tracer; scopes are made
by ``scope`` and report back to it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from otel_training._contain import contained, log_once
from otel_training.compat.areal.config import CategoryLike, _at_least_one, _category, _setting
from otel_training.compat.areal.context import _global_step, _profiling
from otel_training.compat.areal.output import _append_lines, _output_path
from otel_training.compat.areal.scope import _now_us, _Scope, _span_event
from otel_training.compat.areal.sessions import SessionTracer

_thread_local = threading.local()


def _thread_id() -> int:
    tid = getattr(_thread_local, "tid", None)
    if tid is None:
        tid = _thread_local.tid = threading.get_native_id()
    return tid


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
