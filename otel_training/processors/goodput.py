"""Live goodput: spans in, OTel metrics out, exported like the traces.

What a running job exports every metric interval, per process:

* ``training.step.duration`` (histogram, s: the device execution where a step
  has one, see ``events/device.py``), and per step
  ``training.step.tokens_per_second`` / ``training.step.samples_per_second``
  when the step span carries ``training.tokens`` / ``training.samples``
  (or ``training.batch.size``);
* ``training.step.ideal_duration`` (gauge, s) and ``training.step.deviation``
  (gauge, s: the latest step's actual − ideal), once the ideal is configured or derived from
  at least 10 steps;
* ``training.step.straggler.individual`` (gauge, 1): the rank's best window's median
  step time over its current window's (analysis/stragglers.py), so a rank that
  became slower than it was shows while it is slow;
* ``training.goodput`` (gauge, ratio) and ``training.goodput.time`` /
  ``training.badput`` by ``training.badput.bucket`` (counters, s).

The classification is ``otel_training.analysis`` — the same code the offline
report runs. Only what one process can know is live: downtime between runs and
progress lost to a failure are a job-level, after-the-fact view (the report).

A hang ends no span: while a watched span is stuck, each collection counts the
time since its threshold crossing as ``stuck`` (``goodput_stuck.py``); its
recovery or end settles it as the report does, and ``finish()`` at shutdown ends
the life as the report ends a run, so their figures agree.

Cost on the training thread, well under 1 µs a span (measured by
``bench/bench_events.py --default-pipeline``): when a span this processor
classifies (or an alert) starts, a name lookup and the live span appended to a
bounded deque; at its end, nothing — ``on_end`` is given a fresh copy of the
span, while the live one already queued shows the collector when it has ended
(end time set, attributes and status frozen). No metric call, no record built,
no lock on the training thread.

Everything else — the histogram records, rates, ideal step time, deviation
gauge and badput classification — runs in the metric reader's thread, in the
callbacks of the observable instruments: the SDK (``SynchronousMeasurementConsumer
.collect``) runs every callback of a collection before it collects the
synchronous instruments' storage, so histogram values recorded from a callback
land in that same collection. The work is moved, not removed: about as much
CPU per step as before, once per metric interval, off the training thread.

The deque holds the spans started since the last settling, at most
``max_pending`` (about 3 KB each while queued). A collection settles it, and so
does a settling thread of the processor's own, woken when the deque passes half
of ``max_pending``: the default metric interval is a minute, and a loop faster
than ``max_pending`` steps a minute (333 a second) would otherwise overflow it
between two collections and leave steps out of goodput. The wake-up is one
length comparison on the training thread. Beyond ``max_pending`` (the settling
thread could not keep up) a span is left out of the metrics, counted in
``dropped`` and logged once.
"""

from __future__ import annotations

import array
import collections
import os
import threading
import time
from collections.abc import Callable, Iterable

from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import NonRecordingSpan, StatusCode, set_span_in_context

from otel_training import semconv as sc
from otel_training._contain import contain, contained, log_once
from otel_training.analysis import (
    BUCKETS,
    LABELLED_SPAN_NAMES,
    PRODUCTIVE,
    RunAccountant,
    RunKey,
    SpanRecord,
    times_step,
)
from otel_training.analysis import ideal_step_time as derive_ideal
from otel_training.analysis.goodput import with_compilation
from otel_training.analysis.stragglers import LiveIndividual
from otel_training.processors.goodput_stuck import LiveStuck

_STEP_NAMES = frozenset({sc.SPAN_STEP, sc.SPAN_DEVICE_STEP})
#: A measurement's context with no span in it: no exemplar (a trace-based filter samples none).
_NO_SPAN = Context()

_RUN = RunKey("", 0, 0, "")
#: Spans the processor queues: those whose time gets a label, alerts (stuck/recovered), and the
#: training loop (uncovered time after it is "other", before it "host_outside_steps").
_QUEUED = LABELLED_SPAN_NAMES | {sc.SPAN_ALERT, sc.SPAN_TRAIN}
#: A host step whose device span has not started holds the settled time back for at most this
#: long (a device span is started, backdated, once the device begins the step).
MAX_DEVICE_LAG_NS = 60_000_000_000
#: ``on_start``'s containment, built once: it runs for every span, on the training thread.
_ON_START_FAILED = contain("GoodputSpanProcessor.on_start", "otel_training: internal error in goodput on_start")


class GoodputSpanProcessor(SpanProcessor):
    """Turns spans into step-time and goodput metrics through ``meter_provider``."""

    def __init__(
        self,
        meter_provider: MeterProvider,
        *,
        evaluation_is_productive: bool = False,
        ideal_step_time_s: float | None = None,
        after_restart: bool = False,
        max_pending: int = 20_000,
        settle_in_background: bool = True,
        clock: Callable[[], int] = time.time_ns,
        origin_ns: int | None = None,
    ) -> None:
        self._evaluation_is_productive = evaluation_is_productive
        self._configured_ideal = ideal_step_time_s
        self.ideal_step_time_s: float | None = ideal_step_time_s
        self._clock = clock  # wall clock, like span timestamps
        #: Where this life's time starts: the process's creation where known (``origin_ns``), so
        #: start-up before ``configure()`` counts, as it does in the report.
        self.origin_ns = clock() if origin_ns is None else origin_ns
        self.dropped = 0
        self._accountant = RunAccountant(
            self.origin_ns, evaluation_is_productive=evaluation_is_productive, after_restart=after_restart
        )
        # Training thread -> collector: deque appends and pops are thread-safe.
        self._started: collections.deque[ReadableSpan] = collections.deque()
        self._max_pending = max_pending
        # The deque's length at which the settling thread is woken (None: only collections settle).
        self._high_water = max(1, max_pending // 2) if settle_in_background else None
        self._settler: threading.Thread | None = None
        self._settler_pid = 0
        self._wake = threading.Event()
        self._stopped = False
        self._tracked: list[ReadableSpan] = []  # collector only: started spans not yet seen ended
        # collector only: host steps timed on the device whose device span has not started yet,
        # by span id: their device time may still land after what would otherwise be settled.
        self._awaiting_device: dict[int, int] = {}
        # Every step time of this life (8 bytes each): the ideal is derived from all of them at each
        # collection, exactly as the report derives it from the same spans.
        self._durations = array.array("d")
        self._individual = LiveIndividual()
        self._settle_lock = threading.Lock()  # between collector callbacks only
        self._stuck = LiveStuck()  # an open stuck stretch, counted at each settling
        #: The life's figures once ``finish()`` ended it (at shutdown).
        self._final: dict[str, int] | None = None

        meter = meter_provider.get_meter(sc.INSTRUMENTATION_SCOPE, schema_url=sc.SCHEMA_URL)
        self._step_duration = meter.create_histogram(
            sc.METRIC_STEP_DURATION, unit="s", description="Duration of training steps.")
        self._tokens_rate = meter.create_histogram(
            sc.METRIC_STEP_TOKENS_RATE, unit="{token}/s", description="Tokens per second of each step.")
        self._samples_rate = meter.create_histogram(
            sc.METRIC_STEP_SAMPLES_RATE, unit="{sample}/s", description="Samples per second of each step.")
        self._straggler = meter.create_gauge(
            sc.METRIC_STEP_STRAGGLER_INDIVIDUAL, unit="1",
            description="Best window median step time over the current window's (< 0.75: slower than it was).")
        # A gauge, not a histogram: deviations are negative too, which OTel histograms refuse.
        self._deviation = meter.create_gauge(
            sc.METRIC_STEP_DEVIATION, unit="s", description="Duration of the latest step minus the ideal step time.")
        meter.create_observable_gauge(
            sc.METRIC_STEP_IDEAL_DURATION, callbacks=[self._observe_ideal], unit="s",
            description="Ideal step time: configured, or the mean of normal steps (<= median + 3 MAD).")
        meter.create_observable_counter(
            sc.METRIC_GOODPUT_SPANS_DROPPED, callbacks=[self._observe_dropped], unit="{span}",
            description="Spans left out of the goodput and step-time metrics (the settling could not keep up).")
        meter.create_observable_gauge(
            sc.METRIC_GOODPUT, callbacks=[self._observe_goodput], unit="1",
            description="Productive share of this process's time so far.")
        meter.create_observable_counter(
            sc.METRIC_GOODPUT_TIME, callbacks=[self._observe_productive], unit="s",
            description="Productive (goodput) time so far.")
        meter.create_observable_counter(
            sc.METRIC_BADPUT, callbacks=[self._observe_badput], unit="s",
            description="Unproductive time so far, by training.badput.bucket.")

    # -- training thread: O(1), no metric work ------------------------------------
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        # The live span, not the copy on_end gets: the collector sees from it when it has
        # ended (end time set, attributes and status frozen), so nothing is left for on_end.
        try:
            if span.name in _QUEUED:
                started = self._started
                if len(started) < self._max_pending:
                    started.append(span)
                    if len(started) == self._high_water:
                        self._wake_settler()
                else:
                    self._drop()
        except Exception:  # noqa: BLE001 - every span, inline (_contain.contain.failed): never raised into its start
            _ON_START_FAILED.failed()

    def on_end(self, span: ReadableSpan) -> None:
        """Nothing: the span has been queued at its start."""

    def _wake_settler(self) -> None:
        # Started lazily, and again in a forked child (threads do not survive a fork).
        if self._settler is None or self._settler_pid != os.getpid():
            self._settler_pid = os.getpid()
            self._wake = threading.Event()
            self._settler = threading.Thread(target=self._settle_when_woken, name="otel-training-goodput-settle",
                                             daemon=True)
            self._settler.start()
        self._wake.set()

    def _settle_when_woken(self) -> None:
        wake = self._wake
        while True:
            wake.wait()
            wake.clear()
            if self._stopped:
                return
            self._settle_contained()

    def _drop(self) -> None:
        self.dropped += 1
        log_once(
            "GoodputSpanProcessor.queue-full",
            "otel_training: goodput queue full (%d spans started since the last metric collection); spans are left "
            "out of the goodput and step-time metrics until they are settled (the settling thread could not keep up "
            "with this loop); counted in GoodputSpanProcessor.dropped",
            self._max_pending, exc_info=False,
        )

    # -- metric collection (reader thread) ------------------------------------------
    def settle(self) -> dict[str, int]:
        """Take in the ended spans and classify the time that can no longer change; nanoseconds by label.

        An open stuck stretch counts up to now (``goodput_stuck``); after ``finish()``, the
        life's final figures.
        """
        with self._settle_lock:
            if self._final is not None:
                return dict(self._final)
            now = self._clock()
            accountant = self._accountant
            accountant.fold(self._take_in(now))
            totals = with_compilation(dict(accountant.timeline.totals), accountant.first_step,
                                      self.ideal_step_time_s)
            return self._stuck.add_open(totals, accountant, now)

    def finish(self) -> dict[str, int]:
        """End this life's accounting now, as the report ends a run, and keep its figures from then on.

        Called at shutdown, before the metric reader's last collection: a span still open is
        never exported, so the report counts its time as if it had not been there, and a stuck
        stretch still open as stuck until the run's end; the last export says the same.
        """
        with self._settle_lock:
            if self._final is None:
                now = self._clock()
                self._take_in(now)
                accountant = self._accountant
                totals = accountant.finish(max(now, accountant.timeline.folded_until), failed=False)
                totals = with_compilation(totals, accountant.first_step, self.ideal_step_time_s)
                self._final = self._stuck.never_back(totals)
            return dict(self._final)

    def _take_in(self, now: int) -> int:
        """Feed the accountant the spans ended since the last call; returns how far time is settled."""
        awaiting = self._awaiting_device
        while True:
            try:
                span = self._started.popleft()
            except IndexError:
                break
            self._tracked.append(span)
            if span.name == sc.SPAN_STEP and (span.attributes or {}).get(sc.STEP_DEVICE_TIMED):
                awaiting[span.context.span_id] = span.start_time  # type: ignore[assignment]  # a started span has its start time
            elif span.name == sc.SPAN_DEVICE_STEP and span.parent is not None:
                awaiting.pop(span.parent.span_id, None)
        for span_id, started in list(awaiting.items()):
            if now - started > MAX_DEVICE_LAG_NS:
                del awaiting[span_id]  # its device span is not coming (a dead device, a failed timeline)
        ended: list[ReadableSpan] = []
        still_open: list[ReadableSpan] = []
        for span in self._tracked:
            (still_open if span.end_time is None else ended).append(span)
        self._tracked = still_open
        ended.sort(key=_end_time)  # the accountant takes spans in the order they ended
        steps: list[ReadableSpan] = []
        for span in ended:
            self._accountant.add(_record(span))
            if span.name in _STEP_NAMES and times_step(span.name, span.attributes or {}):
                steps.append(span)
        if steps:
            self._record_steps(steps)
        # Time after the earliest start of a classified span still open may still change, and so may
        # time after an open stuck stretch's start (a watched span no label covers).
        starts: list[int] = [span.start_time for span in still_open if span.name in LABELLED_SPAN_NAMES]  # type: ignore[misc]  # started spans: each has its start time
        stuck = self._accountant.stuck_since_ns
        return min([now, *starts, *awaiting.values(), *([] if stuck is None else [stuck])])

    def _record_steps(self, steps: list[ReadableSpan]) -> None:
        """Record the steps' histograms, the ideal and the gauges, in the order the steps ended.

        Each histogram measurement costs the metrics SDK several µs, and more with an exemplar
        (a trace-based filter offers every measurement made in a sampled span's context). So the
        step spans that exemplars point at are the ones a user follows from a dashboard: the
        slowest step of the batch and the latest. The gauges keep their last value, so they are
        set once, for the latest step, which exports the same as setting them for every step.
        """
        durations = [(span.end_time - span.start_time) / 1e9 for span in steps]  # type: ignore[operator]  # ended spans: both times are set
        slowest = max(range(len(steps)), key=durations.__getitem__)
        score = None
        for index, (span, duration) in enumerate(zip(steps, durations)):
            exemplar = index == slowest or index == len(steps) - 1
            context = set_span_in_context(NonRecordingSpan(span.context)) if exemplar else _NO_SPAN
            self._step_duration.record(duration, context=context)
            attributes = span.attributes or {}
            if duration > 0:
                tokens = attributes.get(sc.TOKENS)
                samples = attributes.get(sc.SAMPLES, attributes.get(sc.BATCH_SIZE))
                if isinstance(tokens, (int, float)) and not isinstance(tokens, bool):
                    self._tokens_rate.record(tokens / duration, context=context)
                if isinstance(samples, (int, float)) and not isinstance(samples, bool):
                    self._samples_rate.record(samples / duration, context=context)
            self._durations.append(duration)
            scored = self._individual.add(duration)
            if scored is not None:
                score = scored
        latest = set_span_in_context(NonRecordingSpan(steps[-1].context))
        if score is not None:
            self._straggler.set(score, context=latest)
        if self._configured_ideal is None:
            self.ideal_step_time_s = derive_ideal(self._durations)
        if self.ideal_step_time_s is not None:
            self._deviation.set(durations[-1] - self.ideal_step_time_s, context=latest)

    @contained()
    def _settle_contained(self) -> None:
        self.settle()

    @property
    def elapsed_ns(self) -> int:
        """The time the last settling counted: settled, plus an open stuck stretch up to then."""
        return self._accountant.timeline.folded_until - self.origin_ns + self._stuck.open_ns

    @contained(default=())
    def _observe_goodput(self, options: CallbackOptions) -> Iterable[Observation]:
        totals = self.settle()
        elapsed = sum(totals.values())  # every counted nanosecond has exactly one label
        return [Observation(totals.get(PRODUCTIVE, 0) / elapsed)] if elapsed > 0 else []

    @contained(default=())
    def _observe_productive(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(self.settle().get(PRODUCTIVE, 0) / 1e9)]

    @contained(default=())
    def _observe_badput(self, options: CallbackOptions) -> Iterable[Observation]:
        totals = self.settle()
        return [Observation(totals.get(bucket, 0) / 1e9, {sc.BADPUT_BUCKET: bucket}) for bucket in BUCKETS]

    def _observe_dropped(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(self.dropped)]

    @contained(default=())
    def _observe_ideal(self, options: CallbackOptions) -> Iterable[Observation]:
        self.settle()  # the first callback of a collection: takes in the steps ended since the last one
        ideal = self.ideal_step_time_s
        return [] if ideal is None else [Observation(ideal)]

    def shutdown(self) -> None:
        self._stopped = True
        self._wake.set()
        self._finish_contained()  # before the meter provider's shutdown collects a last time

    @contained()
    def _finish_contained(self) -> None:
        self.finish()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _end_time(span: ReadableSpan) -> int:
    return span.end_time  # type: ignore[return-value]  # the sort key of ended spans only


#: Attributes the accountant reads, by span name (alerts: all of them).
_KEPT_ATTRIBUTES = {
    sc.SPAN_STEP: (sc.STEP_DEVICE_TIMED,),
    sc.SPAN_SAVE_CHECKPOINT: (sc.CHECKPOINT_STEP,),
    sc.SPAN_LOAD_CHECKPOINT: (sc.CHECKPOINT_STEP,),
}


def _record(span: ReadableSpan) -> SpanRecord:
    """What the accountant needs of an ended span (built on the collector's thread)."""
    attributes = span.attributes or {}
    if span.name == sc.SPAN_ALERT:
        kept = dict(attributes)
    else:
        kept = {key: attributes[key] for key in _KEPT_ATTRIBUTES.get(span.name, ()) if key in attributes}
    return SpanRecord(
        span.name, span.start_time, span.end_time, _RUN,  # type: ignore[arg-type]  # an ended span has both times
        attributes=kept,
        span_id=format(span.context.span_id, "016x"),
        error=span.status.status_code is StatusCode.ERROR,
    )
