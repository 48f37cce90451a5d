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

Depends on the OpenTelemetry SDK only, so it works with anyone's TracerProvider.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import math
import os
import signal as signal_module
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from opentelemetry import metrics as metrics_api
from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.context import get_current as get_current_context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext

from otel_training import semconv as sc
from otel_training._sdk_compat import span_pipeline, tracer_for_pipeline
from otel_training._stacks import thread_stacks
from otel_training.processors import alert_context
from otel_training.processors.thresholds import AdaptiveSettings, Threshold, ThresholdLearner

logger = logging.getLogger("otel_training")

DEFAULT_SPAN_NAMES = (sc.SPAN_STEP,)
#: Shortest threshold and escalation interval: below this a stuck span raises alerts every few
#: milliseconds (thousands of spans a second) and keeps a core busy doing it.
MIN_THRESHOLD_S = 0.01
#: The watcher wakes at least this often, however far the next deadline (a wait of 1e9 s overflows).
_MAX_WAIT_S = 3600.0
#: The first span of a name may take this many times the threshold (DLRover: 120 vs 10 minutes).
DEFAULT_FIRST_FACTOR = 10.0
_MAX_CACHED_NAMES = 4096
_PATTERN_CHARS = frozenset("*?[")
_ids = RandomIdGenerator()


@dataclasses.dataclass(frozen=True)
class StuckEvent:
    """What ``on_stuck`` callbacks receive, for stuck and recovered alerts alike."""

    kind: str
    span_name: str
    span_context: SpanContext
    attributes: Mapping[str, Any]
    elapsed_s: float
    threshold_s: float
    threshold_source: str
    threshold_rule: str
    count: int
    stacks: str | None = None


class Slot(Protocol):
    """Where the watchdog sidecar reads the open step (``otel_training.watchdog.slot``)."""

    def begin(self, span: Span, parent_context: Context | None, start_s: float, threshold_s: float) -> None: ...

    def end(self, span_id: int) -> None: ...

    def alerted(self, span_id: int) -> None: ...


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


def parse_span_names(span_names: Iterable[str] | Mapping[str, float | None]) -> dict[str, float | None]:
    """``{"name": seconds or None}`` from names, patterns or ``"name=seconds"`` strings.

    Raises ``ValueError`` for an empty name or a threshold that is not a number >= 0.
    """
    if isinstance(span_names, str):
        span_names = [span_names]
    items = (span_names.items() if isinstance(span_names, Mapping)
             else (str(item).partition("=")[::2] for item in span_names))
    rules: dict[str, float | None] = {}
    for name, seconds in items:
        name = str(name).strip()
        if not name:
            raise ValueError("a watched span name is empty")
        if seconds is None or (isinstance(seconds, str) and not seconds.strip()):
            rules[name] = None
            continue
        try:
            value = float(seconds)
        except (TypeError, ValueError):
            raise ValueError(f"threshold {seconds!r} of {name!r} is not a number of seconds") from None
        if not value >= MIN_THRESHOLD_S or value == float("inf"):
            raise ValueError(f"threshold {seconds!r} of {name!r} must be a finite number of seconds "
                             f">= {MIN_THRESHOLD_S}")
        rules[name] = value
    return rules


class StuckSpanProcessor(SpanProcessor):
    """Raises ``training.alert`` spans for watched spans open longer than their threshold.

    ``span_names`` are span names or fnmatch patterns, optionally with their own
    threshold (``{"training.step": 30, "training.save_checkpoint": 600}`` or
    ``"training.step=30"``). With ``adaptive=True`` each name's threshold is
    learned from its completed spans (see ``processors.thresholds``), and
    ``threshold_s`` is the warm-up threshold and the upper bound. ``flush`` is a
    bounded flush (``Telemetry.force_flush``) used to export alerts at once and
    before the ``"exit"`` action; without it the stuck span's own pipeline is
    flushed from a helper thread.
    """

    def __init__(
        self,
        threshold_s: float | None = None,
        span_names: Iterable[str] | Mapping[str, float | None] = DEFAULT_SPAN_NAMES,
        *,
        adaptive: bool = False,
        adaptive_settings: AdaptiveSettings | None = None,
        first_threshold_s: float | None = None,
        escalation_s: float | None = None,
        on_stuck: Callable[[StuckEvent], Any] | Iterable[Callable[[StuckEvent], Any]] = (),
        action: str = "none",
        exit_code: int = 75,
        signal: int | str = signal_module.SIGTERM,
        flush: Callable[[float], Any] | None = None,
        before_exit: Callable[[], Any] | None = None,
        exit_flush_timeout_s: float = 2.0,
        stacks: bool = True,
        tracer_provider: TracerProvider | None = None,
        meter_provider: metrics_api.MeterProvider | None = None,
        slot: Slot | None = None,
    ) -> None:
        self._rules = parse_span_names(span_names)
        if threshold_s is None and not adaptive and any(value is None for value in self._rules.values()):
            raise ValueError("StuckSpanProcessor needs threshold_s, per-name thresholds or adaptive=True")
        for label, value in (("threshold_s", threshold_s), ("first_threshold_s", first_threshold_s),
                             ("escalation_s", escalation_s)):
            if value is not None and not (MIN_THRESHOLD_S <= value < math.inf):
                raise ValueError(f"{label}={value!r}: expected a finite number of seconds >= {MIN_THRESHOLD_S}")
        if action not in ("none", "exit", "signal"):
            raise ValueError(f"action must be 'none', 'exit' or 'signal', not {action!r}")
        self._threshold_s = threshold_s
        self._adaptive = (adaptive_settings or AdaptiveSettings()) if adaptive else None
        self._first_threshold_s = first_threshold_s
        self._escalation_s = escalation_s
        self._callbacks = [on_stuck] if callable(on_stuck) else list(on_stuck)
        self._action = action
        self._exit_code = exit_code
        self._signal = signal_module.Signals[signal] if isinstance(signal, str) else signal_module.Signals(signal)
        self._flush = flush
        self._before_exit = before_exit
        self._exit_flush_timeout_s = exit_flush_timeout_s
        self._stacks = stacks
        self._tracer = (tracer_provider.get_tracer(sc.INSTRUMENTATION_SCOPE, schema_url=sc.SCHEMA_URL)
                        if tracer_provider is not None else None)
        self._tracer_provider = tracer_provider
        meter = (meter_provider or metrics_api.get_meter_provider()).get_meter(
            sc.INSTRUMENTATION_SCOPE, schema_url=sc.SCHEMA_URL)
        self._counter = meter.create_counter(sc.METRIC_ALERTS, unit="{alert}",
                                             description="Stuck-span alerts, by kind (stuck, recovered, died).")
        self._slot = slot
        self._pipeline_tracers: dict[int, SdkTracer] = {}
        self._learners: dict[str, ThresholdLearner | None] = {}
        self._learner_lock = threading.RLock()
        self._reset_runtime_state()
        _instances.add(self)

    @classmethod
    def from_options(cls, options: Mapping[str, Any], **kwargs: Any) -> StuckSpanProcessor:
        """Build from ``configure()`` options (``stuck_*``); ``kwargs`` as for the constructor."""
        return cls(
            options.get("stuck_threshold_s"),
            options.get("stuck_span_names") or DEFAULT_SPAN_NAMES,
            adaptive=bool(options.get("stuck_adaptive")) or options.get("stuck_threshold_s") is None,
            escalation_s=options.get("stuck_escalation_s"),
            action=options.get("stuck_action", "none"),
            exit_code=options.get("stuck_exit_code", 75),
            signal=options.get("stuck_signal", "SIGTERM"),
            **kwargs,
        )

    def _reset_runtime_state(self) -> None:
        self._open: dict[int, _Watched] = {}
        self._slot_lock = threading.Lock()
        self._cond = threading.Condition(threading.Lock())
        self._wake_at = math.inf
        self._recovered: deque[StuckEvent] = deque()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._flush_event = threading.Event()
        self._flush_target: Callable[[], Any] | None = None
        self._flusher: threading.Thread | None = None
        self._exiting = False

    def _after_fork_in_child(self) -> None:
        """A forked child (a DataLoader worker) watches only its own spans, with its own threads."""
        self._reset_runtime_state()
        self._learner_lock = threading.RLock()
        for learner in self._learners.values():
            if learner is not None:
                learner.after_fork()
        self._slot = None  # the parent's watchdog reads the parent's slot only

    # -- thresholds ---------------------------------------------------------
    def _learner_for(self, name: str) -> ThresholdLearner | None:
        learner = self._learners.get(name, _MISSING)
        if learner is not _MISSING:
            return learner  # type: ignore[return-value]
        with self._learner_lock:
            learner = self._learners.get(name, _MISSING)
            if learner is _MISSING:
                learner = self._match(name)
                if learner is not None or len(self._learners) < _MAX_CACHED_NAMES:
                    self._learners[name] = learner
        return learner  # type: ignore[return-value]

    def _match(self, name: str) -> ThresholdLearner | None:
        if name == sc.SPAN_BETWEEN_STEPS and name not in self._rules:
            # The host between steps is judged by the step's threshold (its learner is shared, never fed).
            return self._learner_for(sc.SPAN_DEVICE_STEP)
        learner = self._match_rule(name, name)
        if learner is None and name in _TIMED_AS:
            learner = self._match_rule(_TIMED_AS[name], name)
        return learner

    def _match_rule(self, rule_name: str, name: str) -> ThresholdLearner | None:
        """A learner for spans named ``name`` from the first rule matching ``rule_name``."""
        for rule, seconds in self._rules.items():
            if rule == rule_name or (_PATTERN_CHARS & set(rule) and fnmatch.fnmatchcase(rule_name, rule)):
                fixed = seconds if seconds is not None else self._threshold_s
                first = self._first_threshold_s
                if first is None:
                    first = DEFAULT_FIRST_FACTOR * fixed if fixed is not None else None
                elif fixed is not None:
                    first = max(first, fixed)  # an allowance, never stricter than the name's own threshold
                return ThresholdLearner(name, fixed, first, self._adaptive)
        return None

    def add_callback(self, callback: Callable[[StuckEvent], Any]) -> None:
        """Also call ``callback(event)`` on every alert (for code that did not build the processor)."""
        self._callbacks.append(callback)

    def threshold_for(self, name: str) -> Threshold | None:
        """The threshold the next span named ``name`` gets, or None if it is not watched."""
        learner = self._learner_for(name)
        return None if learner is None else learner.threshold

    # -- the training thread --------------------------------------------------
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        try:
            learner = self._learners.get(span.name, _MISSING)
            if learner is _MISSING:
                learner = self._learner_for(span.name)
            if learner is None or self._stopping:
                return
            attributes = span.attributes
            if attributes and attributes.get(sc.STEP_DEVICE_TIMED):
                return  # its training.device_step child is watched instead (events/device.py)
            threshold = learner.threshold
            if parent_context is None:  # the SDK passes None when the parent is the implicit current context
                parent_context = get_current_context()
            now = time.monotonic()
            entry = _Watched(span, learner, threshold, now, threading.get_ident(), parent_context)
            if span.name in _AFTER_THE_FACT:
                # Started by the device timeline once the device began the step (or once the gap was
                # long): watched from its own start time, with the training thread's stack first.
                entry.after_the_fact = True
                entry.start = now - max(0.0, (time.time_ns() - (span.start_time or 0)) / 1e9)
                entry.deadline = entry.start + threshold.seconds
                thread_id = attributes.get(sc.THREAD_ID) if attributes else None
                if isinstance(thread_id, int):
                    entry.thread_id = thread_id
            self._open[span.context.span_id] = entry
            if self._thread is None:
                self._start_watcher()
            if entry.deadline < self._wake_at:
                with self._cond:
                    self._cond.notify()
            if self._slot is not None:
                with self._slot_lock:  # the training thread and the device timeline's both write it
                    self._slot.begin(span, parent_context, entry.start, threshold.seconds)
        except Exception:  # noqa: BLE001 - never raise into training
            _log_internal("on_start")

    def on_end(self, span: ReadableSpan) -> None:
        try:
            entry = self._open.pop(span.context.span_id, None)  # type: ignore[union-attr]
            if entry is None:
                return
            elapsed = time.monotonic() - entry.start
            if entry.after_the_fact and span.start_time and span.end_time and span.end_time >= span.start_time:
                elapsed = (span.end_time - span.start_time) / 1e9  # its device times, not when we saw them
            if self._slot is not None:
                with self._slot_lock:
                    self._slot.end(span.context.span_id)  # type: ignore[union-attr]
            if entry.count:
                # The alert span is ended here, so it is queued before the stuck span's own export
                # and a shutdown right after cannot lose it; callbacks and the flush are left to
                # the watcher and flusher threads, so nothing waits here.
                self._recovered.append(self._alert(sc.ALERT_KIND_RECOVERED, entry, elapsed, None))
                with self._cond:
                    self._cond.notify()
            elif span.name != sc.SPAN_BETWEEN_STEPS:
                entry.learner.observe(elapsed)
        except Exception:  # noqa: BLE001
            _log_internal("on_end")

    # -- the watcher thread -------------------------------------------------
    def _start_watcher(self) -> None:
        with self._cond:
            if self._thread is not None or self._stopping:
                return
            self._thread = threading.Thread(target=self._watch, name="otel-training-stuck", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while True:
                    if self._stopping:
                        return
                    self._wake_at = math.inf  # anything started while scanning notifies
                    now = time.monotonic()
                    due = []
                    earliest = math.inf
                    for entry in list(self._open.values()):
                        if entry.deadline <= now:
                            due.append(entry)
                        elif entry.deadline < earliest:
                            earliest = entry.deadline
                    if due or self._recovered:
                        break
                    self._wake_at = earliest
                    cond.wait(min(earliest - now, _MAX_WAIT_S))
            for entry in due:
                self._guarded(self._stuck, entry, now)
            while self._recovered:
                self._call_back(self._recovered.popleft())
            self._request_flush()

    @staticmethod
    def _guarded(function: Callable[..., Any], *args: Any) -> None:
        try:
            function(*args)
        except Exception:  # noqa: BLE001 - the watcher must keep watching
            _log_internal(function.__name__)

    def _stuck(self, entry: _Watched, now: float) -> None:
        if self._open.get(entry.span.context.span_id) is not entry:
            return  # ended while we were scanning
        entry.count += 1
        escalation = self._escalation_s or entry.threshold.seconds
        entry.deadline = entry.start + entry.threshold.seconds + entry.count * escalation
        if entry.deadline <= now:  # we were late (a frozen process): next repeat from now
            entry.deadline = now + escalation
        elapsed = now - entry.start
        if self._slot is not None:
            self._slot.alerted(entry.span.context.span_id)
        stacks = thread_stacks(entry.thread_id) if self._stacks else None
        event = self._alert(sc.ALERT_KIND_STUCK, entry, elapsed, stacks)
        if entry.span.is_recording():
            entry.span.add_event(sc.EVENT_ALERT, {
                sc.ALERT_KIND: sc.ALERT_KIND_STUCK, sc.ALERT_ELAPSED_S: elapsed,
                sc.ALERT_THRESHOLD_S: entry.threshold.seconds, sc.ALERT_COUNT: entry.count,
            })
        self._call_back(event)
        if entry.count == 1:
            self._act(entry)

    def _alert(self, kind: str, entry: _Watched, elapsed: float, stacks: str | None) -> StuckEvent:
        span = entry.span
        context = span.get_span_context()
        attributes: dict[str, Any] = {}
        parent = trace_api.get_current_span(entry.parent_context) if entry.parent_context is not None else None
        parent_attributes = getattr(parent, "attributes", None)
        if parent_attributes and sc.EPOCH in parent_attributes:
            attributes[sc.EPOCH] = parent_attributes[sc.EPOCH]
        attributes.update(span.attributes or {})
        if kind == sc.ALERT_KIND_STUCK:
            attributes.update(alert_context.collect())  # e.g. the collective this rank is inside
        attributes.update({
            sc.ALERT_KIND: kind,
            sc.ALERT_SOURCE: sc.ALERT_SOURCE_PROCESSOR,
            sc.ALERT_SPAN_NAME: span.name,
            sc.ALERT_SPAN_ID: f"{context.span_id:016x}",
            sc.ALERT_ELAPSED_S: round(elapsed, 6),
            sc.ALERT_THRESHOLD_S: entry.threshold.seconds,
            sc.ALERT_THRESHOLD_SOURCE: entry.threshold.source,
            sc.ALERT_THRESHOLD_RULE: entry.threshold.rule,
            sc.ALERT_COUNT: entry.count,
        })
        if stacks is not None:
            attributes[sc.ALERT_STACKS] = stacks
        if kind == sc.ALERT_KIND_STUCK and self._action != "none":
            attributes[sc.ALERT_ACTION] = self._action
        if kind == sc.ALERT_KIND_STUCK and entry.count > 1:
            attributes[sc.ALERT_REPEAT] = True  # one episode, one recovery: rules count first alerts only
        self._export(span, context, attributes)
        self._counter.add(1, {sc.ALERT_KIND: kind, sc.ALERT_SPAN_NAME: span.name})
        level = logging.WARNING if kind == sc.ALERT_KIND_STUCK else logging.INFO
        logger.log(level, "otel_training: %s %s (span %016x) %s after %.3f s (threshold %.3f s, %s)",
                   span.name, _describe(span.attributes), context.span_id, kind, elapsed,
                   entry.threshold.seconds, entry.threshold.source)
        return StuckEvent(kind, span.name, context, attributes, elapsed, entry.threshold.seconds,
                          entry.threshold.source, entry.threshold.rule, entry.count, stacks)

    def _export(self, span: Span, context: SpanContext, attributes: dict[str, Any]) -> None:
        """End an alert span at once, in the watched span's trace, and schedule a flush."""
        links = [Link(context, {sc.LINK_TYPE: sc.LINK_ALERTED})]
        if self._tracer is not None:
            parent = trace_api.set_span_in_context(NonRecordingSpan(context))
            self._tracer.start_span(sc.SPAN_ALERT, context=parent, attributes=attributes, links=links).end()
            self._flush_target = self._tracer_provider.force_flush  # type: ignore[union-attr]
            return
        # No provider given: use the stuck span's own pipeline (resource, processors, exporter).
        pipeline = span_pipeline(span)
        if pipeline is None:
            return  # not an SDK span: there is no pipeline to put the alert in
        tracer = self._pipeline_tracers.get(id(pipeline))
        if tracer is None:
            tracer = tracer_for_pipeline(span.resource, pipeline, ALWAYS_ON, _ids,
                                         InstrumentationScope(sc.INSTRUMENTATION_SCOPE, schema_url=sc.SCHEMA_URL))
            self._pipeline_tracers = {id(pipeline): tracer}  # one pipeline in practice; keep it bounded
        parent = trace_api.set_span_in_context(NonRecordingSpan(context))
        tracer.start_span(sc.SPAN_ALERT, context=parent, attributes=attributes, links=links).end()
        self._flush_target = pipeline.force_flush

    def _call_back(self, event: StuckEvent) -> None:
        for callback in self._callbacks:
            try:
                callback(event)
            except Exception:  # noqa: BLE001 - a user's callback must not stop detection
                _log_internal(f"on_stuck callback {getattr(callback, '__qualname__', callback)!r}")

    # -- actions and flushing -----------------------------------------------
    def _flush_now(self, timeout_s: float) -> None:
        if self._flush is not None:
            self._flush(timeout_s)
        elif self._flush_target is not None:
            self._flush_target()

    def _request_flush(self) -> None:
        """Wake the flusher thread; never waits (an exporter may hang for its whole retry budget)."""
        if self._flusher is None:
            self._flusher = threading.Thread(target=self._flush_loop, name="otel-training-stuck-flush", daemon=True)
            self._flusher.start()
        self._flush_event.set()

    def _flush_loop(self) -> None:
        while not self._stopping:
            self._flush_event.wait()
            self._flush_event.clear()
            if self._stopping:
                return
            self._guarded(self._flush_now, self._exit_flush_timeout_s)

    def _act(self, entry: _Watched) -> None:
        if self._action == "signal":
            logger.warning("otel_training: sending %s to this process (stuck %s)", self._signal.name, entry.span.name)
            os.kill(os.getpid(), self._signal)
        elif self._action == "exit" and not self._exiting:
            self._exiting = True
            logger.warning("otel_training: exiting with code %d (stuck %s) so the launcher restarts this rank",
                           self._exit_code, entry.span.name)
            if self._before_exit is not None:
                # e.g. end the open spans (the stuck step, its epoch) so the trace holds them
                self._guarded(self._before_exit)
            flusher = threading.Thread(target=self._guarded, args=(self._flush_now, self._exit_flush_timeout_s),
                                       name="otel-training-stuck-exit-flush", daemon=True)
            flusher.start()
            flusher.join(self._exit_flush_timeout_s)
            os._exit(self._exit_code)

    # -- lifecycle ----------------------------------------------------------
    @property
    def open_count(self) -> int:
        """Watched spans open right now."""
        return len(self._open)

    def shutdown(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._flush_event.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2.0)
        self._open.clear()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


_MISSING = object()
#: Spans judged by the rule of the span they time, when no rule names them: a step's device
#: execution by the step's threshold (each keeps its own learned history).
_TIMED_AS = {sc.SPAN_DEVICE_STEP: sc.SPAN_STEP}
#: Spans the device timeline starts after the fact, backdated (events/device.py).
_AFTER_THE_FACT = frozenset({sc.SPAN_DEVICE_STEP, sc.SPAN_BETWEEN_STEPS})
_instances: weakref.WeakSet[StuckSpanProcessor] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for processor in list(_instances):
        processor._after_fork_in_child()  # noqa: SLF001


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def _log_internal(where: str) -> None:
    from otel_training._contain import log_once

    log_once(f"stuck:{where}", "otel_training: internal error in the stuck detector (%s); training continues", where)


def _describe(attributes: Mapping[str, Any] | None) -> str:
    if not attributes:
        return ""
    parts = [f"{key.rsplit('.', 1)[-1]} {attributes[key]}" for key in (sc.EPOCH, sc.STEP) if key in attributes]
    return ", ".join(parts)
