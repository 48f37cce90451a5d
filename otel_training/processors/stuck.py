"""``StuckSpanProcessor``: alerts for watched spans that stay open past a threshold.

An OpenTelemetry span is exported only when it ends, so a step that hangs never
reaches the collector. This processor remembers when each watched span began
and, from one watcher thread that sleeps until the earliest deadline, exports a
``training.alert`` span (parented to and linked to the stuck span) the moment a
deadline passes, adds an event to the open span, counts ``training.alerts``,
attaches every thread's stack, calls the user's callbacks and optionally ends
or signals the process, so an elastic launcher restarts the rank from its last
checkpoint (what KungFu does after 10 s, polling once a second over HTTP).

Costs on the training thread: ``on_start`` is a dict lookup of the span name, a
clock read and a dict insert; ``on_end`` a dict pop (plus an amortised O(1)
update of the learned threshold). The watcher is notified only when a new
deadline is earlier than the one it sleeps to, so it wakes about once per
threshold, not per span. Alerts are flushed by a separate flusher thread: the
watcher never waits for an exporter, and the training thread never waits at all.

Built from parts: the rules and per-name learners (``stuck_rules``), the alert
sink (``stuck_alerts``: the alert span, the counter, the log line), the watchdog
slot, and the actions here. The clock is injectable and ``tick()`` runs one
scan of the deadlines on the caller's thread, so tests drive the detector
deterministically (``watcher=False``: no thread of its own).

Depends on the OpenTelemetry SDK only, so it works with anyone's TracerProvider.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry import metrics as metrics_api
from opentelemetry.context import Context
from opentelemetry.context import get_current as get_current_context
from opentelemetry.sdk.trace import ReadableSpan, Span, TracerProvider

from otel_training import semconv as sc
from otel_training._fork import reset_in_child
from otel_training._stacks import thread_stacks
from otel_training.processors.stuck_actions import (
    Slot,
    StuckActions,
    callable_name,
    guarded,
    internal_error,
    log_internal,
)
from otel_training.processors.stuck_alerts import AlertSink, StuckEvent
from otel_training.processors.stuck_options import OPTION_FIELDS, StuckOptions, check_seconds, options_with_legacy
from otel_training.processors.stuck_rules import (
    DEFAULT_FIRST_FACTOR,
    DEFAULT_SPAN_NAMES,
    MIN_THRESHOLD_S,
    MISSING,
    StuckRules,
    parse_span_names,
)
from otel_training.processors.thresholds import AdaptiveSettings, Threshold, ThresholdLearner
from otel_training.processors.watching import WatchingSpanProcessor

logger = logging.getLogger("otel_training")

#: The watcher wakes at least this often, however far the next deadline (a wait of 1e9 s overflows).
_MAX_WAIT_S = 3600.0


class _Watched:
    __slots__ = ("span", "learner", "threshold", "start", "deadline", "thread_id", "parent_context", "count",
                 "after_the_fact")

    def __init__(self, span: Span, learner: ThresholdLearner, threshold: Threshold, start: float,
                 thread_id: int, parent_context: Context | None) -> None:
        self.span = span
        self.learner = learner
        self.threshold = threshold
        self.start = start
        self.deadline = start + threshold.seconds
        self.thread_id = thread_id
        self.parent_context = parent_context
        self.count = 0
        #: Started after the fact (a device step or the time between steps, by the device timeline).
        self.after_the_fact = False


class StuckSpanProcessor(WatchingSpanProcessor):
    """Raises ``training.alert`` spans for watched spans open longer than their threshold.

    ``span_names`` are span names or fnmatch patterns, optionally with their own
    threshold (``{"training.step": 30, "training.save_checkpoint": 600}`` or
    ``"training.step=30"``). ``options`` is the policy (``StuckOptions``: adaptive
    thresholds, escalation, callbacks, the action); with ``adaptive=True`` each
    name's threshold is learned from its completed spans (see
    ``processors.thresholds``), and ``threshold_s`` is the warm-up threshold and
    the upper bound. The keywords are what it is wired to: the providers its
    alerts go to, the watchdog's slot, the clock, and whether it runs a watcher
    thread. ``StuckOptions``' fields are still taken as keywords, deprecated.
    """

    def __init__(
        self,
        threshold_s: float | None = None,
        span_names: Iterable[str] | Mapping[str, float | None] = DEFAULT_SPAN_NAMES,
        options: StuckOptions | None = None,
        *,
        tracer_provider: TracerProvider | None = None,
        meter_provider: metrics_api.MeterProvider | None = None,
        slot: Slot | None = None,
        clock: Callable[[], float] = time.monotonic,
        watcher: bool = True,
        **legacy: Any,
    ) -> None:
        options = options_with_legacy(type(self).__name__, options, legacy)
        rules = parse_span_names(span_names)
        if threshold_s is None and not options.adaptive and any(value is None for value in rules.values()):
            raise ValueError("StuckSpanProcessor needs threshold_s, per-name thresholds or adaptive=True")
        check_seconds("threshold_s", threshold_s)
        #: The policy: thresholds, escalation, callbacks, the action.
        self.options = options
        #: Which spans are watched, and each name's threshold learner.
        self.rules = StuckRules(rules, threshold_s, options.first_threshold_s,
                                (options.adaptive_settings or AdaptiveSettings()) if options.adaptive else None)
        self._escalation_s = options.escalation_s
        on_stuck = options.on_stuck
        self._callbacks = [on_stuck] if callable(on_stuck) else list(on_stuck)
        self._stacks = options.stacks
        #: The process whose spans these are, when it is another one: its stacks, and where actions go.
        self._remote = options.remote
        self._sink = AlertSink(tracer_provider, meter_provider, options.action)
        self._actions = StuckActions(options, lambda: self._sink.flush_target)
        self._slot = slot
        #: Monotonic seconds; injected by tests, which then drive the scans with ``tick()``.
        self._clock = clock
        self._use_watcher = watcher
        self._reset_runtime_state()
        reset_in_child(self, StuckSpanProcessor._after_fork_in_child)

    @classmethod
    def from_options(cls, options: Mapping[str, Any], **kwargs: Any) -> StuckSpanProcessor:
        """Build from ``configure()`` options (``stuck_*``). ``kwargs``: the ``StuckOptions`` fields the options
        do not set (``flush``, ``stacks``, ``remote``...), and the constructor's keywords (``tracer_provider``...)."""
        fields = {name: kwargs.pop(name) for name in list(kwargs) if name in OPTION_FIELDS}
        return cls(options.get("stuck_threshold_s"), options.get("stuck_span_names") or DEFAULT_SPAN_NAMES,
                   StuckOptions.from_config(options, **fields), **kwargs)

    def _reset_runtime_state(self) -> None:
        self._open: dict[int, _Watched] = {}
        self._slot_lock = threading.Lock()
        self._cond = threading.Condition(threading.Lock())
        self._wake_at = math.inf
        #: Events whose callbacks are due, run where the scans run (recoveries, and late alerts of replayed spans).
        self._to_deliver: deque[StuckEvent] = deque()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._actions.reset()

    def _after_fork_in_child(self) -> None:
        """A forked child (a DataLoader worker) watches only its own spans, with its own threads."""
        self._reset_runtime_state()
        self.rules.after_fork()
        self._slot = None  # the parent's watchdog reads the parent's slot only

    def add_callback(self, callback: Callable[[StuckEvent], Any]) -> None:
        """Also call ``callback(event)`` on every alert (for code that did not build the processor)."""
        self._callbacks.append(callback)

    def threshold_for(self, name: str) -> Threshold | None:
        """The threshold the next span named ``name`` gets, or None if it is not watched."""
        learner = self.rules.learner_for(name)
        return None if learner is None else learner.threshold

    # -- the training thread --------------------------------------------------
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        try:
            learner: ThresholdLearner | None = self.rules.learners.get(span.name, MISSING)  # type: ignore[arg-type]  # the sentinel MISSING is replaced on the next line
            if learner is MISSING:
                learner = self.rules.learner_for(span.name)
            if learner is None or self._stopping:
                return
            attributes = span.attributes
            if attributes and attributes.get(sc.STEP_DEVICE_TIMED):
                return  # its training.device_step child is watched instead (events/device.py)
            threshold = learner.threshold
            if parent_context is None:  # the SDK passes None when the parent is the implicit current context
                parent_context = get_current_context()
            now = self._clock()
            entry = _Watched(span, learner, threshold, now, threading.get_ident(), parent_context)
            late_s = (time.time_ns() - span.start_time) / 1e9 if span.start_time else 0.0
            if late_s > _LATE_S or span.name in _AFTER_THE_FACT:
                # Begun before it reached us (the device timeline's, the drain's replay, a measured start):
                # watched from its own start time, and judged by its own times when it ends.
                entry.after_the_fact = True
                entry.start = now - max(0.0, late_s)
                entry.deadline = entry.start + threshold.seconds
            thread_id = attributes.get(sc.THREAD_ID) if attributes else None
            if isinstance(thread_id, int):  # the thread it runs on, when another one started it
                entry.thread_id = thread_id
            elif self._remote is not None:  # another process's span: this thread's id is not its thread's
                entry.thread_id = 0
            self._open[span.context.span_id] = entry
            if self._thread is None and self._use_watcher:
                self._start_watcher()
            if entry.deadline < self._wake_at:
                with self._cond:
                    self._cond.notify()
            if self._slot is not None:
                with self._slot_lock:  # the training thread and the device timeline's both write it
                    self._slot.begin(span, parent_context, entry.start, threshold.seconds)
        except Exception:  # noqa: BLE001 - never raise into the code that started the span
            log_internal("on_start")

    def on_end(self, span: ReadableSpan) -> None:
        try:
            entry = self._open.pop(span.context.span_id, None)
            if entry is None:
                return
            elapsed = self._clock() - entry.start
            if entry.after_the_fact and span.start_time and span.end_time and span.end_time >= span.start_time:
                elapsed = (span.end_time - span.start_time) / 1e9  # its device times, not when we saw them
            if self._slot is not None:
                with self._slot_lock:
                    self._slot.end(span.context.span_id)
            if entry.after_the_fact and not entry.count and elapsed >= entry.threshold.seconds:
                # Reached us too late to be caught open (the drain behind, a device step ending between two
                # scans): it was stuck all the same, so it gets its alert now, and its recovery below.
                entry.count = 1
                self._to_deliver.append(self._sink.emit(sc.ALERT_KIND_STUCK, entry.span, entry.parent_context,
                                                       entry.threshold, 1, elapsed, None))
            if entry.count:
                # The alert span is ended here, so it is queued before the stuck span's own export
                # and a shutdown right after cannot lose it; callbacks and the flush are left to
                # the watcher and flusher threads, so nothing waits here.
                self._to_deliver.append(self._sink.emit(sc.ALERT_KIND_RECOVERED, entry.span, entry.parent_context,
                                                       entry.threshold, entry.count, elapsed, None))
                with self._cond:
                    self._cond.notify()
            elif span.name != sc.SPAN_BETWEEN_STEPS:
                entry.learner.observe(elapsed)
        except Exception:  # noqa: BLE001 - never raise into the code that ended the span
            log_internal("on_end")

    # -- the watcher thread -------------------------------------------------
    def _start_watcher(self) -> None:
        with self._cond:
            if self._thread is not None or self._stopping:
                return
            self._thread = threading.Thread(target=self._watch, name="otel-training-stuck", daemon=True)
            self._thread.start()

    def _scan(self, now: float) -> tuple[list[_Watched], float]:
        """The watched spans past their deadline at ``now``, and the earliest deadline of the rest."""
        due = []
        earliest = math.inf
        for entry in list(self._open.values()):
            if entry.deadline <= now:
                due.append(entry)
            elif entry.deadline < earliest:
                earliest = entry.deadline
        return due, earliest

    def _handle(self, due: list[_Watched], now: float) -> None:
        for entry in due:
            guarded(self._stuck, entry, now)
        self._deliver_events()
        self._actions.request_flush()

    def _deliver_events(self) -> None:
        while self._to_deliver:
            self._call_back(self._to_deliver.popleft())

    def tick(self, now: float | None = None) -> int:
        """One scan on the caller's thread (at ``now`` on the injected clock): alert what is due.

        Returns the alerts raised. For tests and for callers that drive the detector
        themselves (``watcher=False``); the watcher thread does the same on its own.
        """
        now = self._clock() if now is None else now
        with self._cond:
            due, _ = self._scan(now)
        if due or self._to_deliver:
            self._handle(due, now)
        return len(due)

    def _watch(self) -> None:
        cond = self._cond
        while True:
            stopping = False
            with cond:
                while True:
                    if self._stopping:  # read under the lock: alerts found due before it are raised
                        stopping = True
                        break
                    self._wake_at = math.inf  # anything started while scanning notifies
                    now = self._clock()
                    due, earliest = self._scan(now)
                    if due or self._to_deliver:
                        break
                    self._wake_at = earliest
                    cond.wait(min(earliest - now, _MAX_WAIT_S))
            if stopping:
                # Recoveries that ended before the stop still reach the callbacks (their alert
                # spans were emitted when the spans ended).
                self._deliver_events()
                return
            self._handle(due, now)

    def _stuck(self, entry: _Watched, now: float) -> None:
        if self._open.get(entry.span.context.span_id) is not entry:
            return  # ended while we were scanning
        first, slot = entry.count == 0, self._slot
        if slot is not None:
            # Marked before the count changes: a span ended with a count has its mark, so the watchdog
            # leaves its recovery to us. A span the watchdog alerted on while we could not run (the GIL
            # held) is its episode: ours continue it as repeats.
            span_id = entry.span.context.span_id
            slot.alerted(span_id)
            if entry.count == 0:
                entry.count = slot.watchdog_alerts(span_id)
        entry.count += 1
        escalation = self._escalation_s or entry.threshold.seconds
        entry.deadline = entry.start + entry.threshold.seconds + entry.count * escalation
        if entry.deadline <= now:  # we were late (a frozen process): next repeat from now
            entry.deadline = now + escalation
        elapsed = now - entry.start
        remote = self._remote.stacks(entry.thread_id) if self._remote is not None else None
        stacks, source, missing, context = remote if remote is not None else (
            thread_stacks(entry.thread_id) if self._stacks else None, None, None, None)
        event = self._sink.emit(sc.ALERT_KIND_STUCK, entry.span, entry.parent_context, entry.threshold,
                                 entry.count, elapsed, stacks, missing, source, context)
        if entry.span.is_recording():
            entry.span.add_event(sc.EVENT_ALERT, {
                sc.ALERT_KIND: sc.ALERT_KIND_STUCK, sc.ALERT_ELAPSED_S: elapsed,
                sc.ALERT_THRESHOLD_S: entry.threshold.seconds, sc.ALERT_COUNT: entry.count,
            })
        self._call_back(event)
        if first:  # this detector's first alert on the span (the watchdog's, if any, came before)
            self._actions.act(entry.span.name)

    def _call_back(self, event: StuckEvent) -> None:
        for callback in self._callbacks:
            with internal_error(f"on_stuck callback {callable_name(callback)!r}"):
                callback(event)  # a user's callback must not stop detection

    # -- lifecycle ----------------------------------------------------------
    @property
    def open_count(self) -> int:
        """Watched spans open right now."""
        return len(self._open)

    def shutdown(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._actions.stop()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2.0)
        self._open.clear()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


#: Spans the device timeline starts after the fact, backdated (events/device.py).
_AFTER_THE_FACT = frozenset({sc.SPAN_DEVICE_STEP, sc.SPAN_BETWEEN_STEPS})
#: A span begun longer ago than this when it reaches the detector is timed from its own start (replayed, backdated).
_LATE_S = 0.05


__all__ = ["DEFAULT_FIRST_FACTOR", "DEFAULT_SPAN_NAMES", "MIN_THRESHOLD_S", "Slot", "StuckEvent", "StuckOptions",
           "StuckSpanProcessor", "parse_span_names"]
