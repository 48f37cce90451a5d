"""Live goodput: spans in, OTel metrics out, exported like the traces.

What a running job exports every metric interval, per process:

* ``training.step.duration`` (histogram, s), and per step
  ``training.step.tokens_per_second`` / ``training.step.samples_per_second``
  when the step span carries ``training.tokens`` / ``training.samples``
  (or ``training.batch.size``);
* ``training.step.ideal_duration`` (gauge, s) and ``training.step.deviation``
  (gauge, s: the latest step's actual − ideal), once the ideal is configured or derived from
  at least 10 steps;
* ``training.goodput`` (gauge, ratio) and ``training.goodput.time`` /
  ``training.badput`` by ``training.badput.bucket`` (counters, s).

The classification is ``otel_training.analysis`` — the same code the offline
report runs. Only what one process can know is live: downtime between runs and
progress lost to a failure are a job-level, after-the-fact view (the report).

Cost on the training thread: one dict insert per classified span start, and
at a span end a record appended to a bounded deque plus, for a step, the
histogram records. Classification runs in the metric reader's thread when it
collects, never on the training thread, and no lock is shared with it.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable

from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import StatusCode

from otel_training import semconv as sc
from otel_training._contain import contained
from otel_training.analysis import BUCKETS, MIN_STEPS, PRODUCTIVE, RunAccountant, RunKey, SpanRecord, span_label
from otel_training.analysis import ideal_step_time as derive_ideal

_RUN = RunKey("", 0, 0, "")
#: Steps kept for deriving the ideal step time (the most recent ones).
IDEAL_WINDOW = 1000
#: After the first derivation at MIN_STEPS, the ideal is re-derived every this many steps.
IDEAL_EVERY = 100


class GoodputSpanProcessor(SpanProcessor):
    """Turns spans into step-time and goodput metrics through ``meter_provider``."""

    def __init__(
        self,
        meter_provider: MeterProvider,
        *,
        evaluation_is_productive: bool = False,
        ideal_step_time_s: float | None = None,
        after_restart: bool = False,
        max_pending: int = 100_000,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self._evaluation_is_productive = evaluation_is_productive
        self._configured_ideal = ideal_step_time_s
        self.ideal_step_time_s: float | None = ideal_step_time_s
        self._clock = clock  # wall clock, like span timestamps
        self.origin_ns = clock()
        self.dropped = 0
        self._accountant = RunAccountant(
            self.origin_ns, evaluation_is_productive=evaluation_is_productive, after_failure=after_restart
        )
        # Training thread -> collector: deque appends and pops are thread-safe.
        self._ended: collections.deque[SpanRecord] = collections.deque()
        self._max_pending = max_pending
        self._open: dict[int, int] = {}
        self._durations: collections.deque[float] = collections.deque(maxlen=IDEAL_WINDOW)
        self._steps = 0
        self._settle_lock = threading.Lock()  # between collector callbacks only

        meter = meter_provider.get_meter(sc.INSTRUMENTATION_SCOPE, schema_url=sc.SCHEMA_URL)
        self._step_duration = meter.create_histogram(
            sc.METRIC_STEP_DURATION, unit="s", description="Duration of training steps.")
        self._tokens_rate = meter.create_histogram(
            sc.METRIC_STEP_TOKENS_RATE, unit="{token}/s", description="Tokens per second of each step.")
        self._samples_rate = meter.create_histogram(
            sc.METRIC_STEP_SAMPLES_RATE, unit="{sample}/s", description="Samples per second of each step.")
        # A gauge, not a histogram: deviations are negative too, which OTel histograms refuse.
        self._deviation = meter.create_gauge(
            sc.METRIC_STEP_DEVIATION, unit="s", description="Duration of the latest step minus the ideal step time.")
        meter.create_observable_gauge(
            sc.METRIC_STEP_IDEAL_DURATION, callbacks=[self._observe_ideal], unit="s",
            description="Ideal step time: configured, or the mean of normal steps (<= median + 3 MAD).")
        meter.create_observable_gauge(
            sc.METRIC_GOODPUT, callbacks=[self._observe_goodput], unit="1",
            description="Productive share of this process's time so far.")
        meter.create_observable_counter(
            sc.METRIC_GOODPUT_TIME, callbacks=[self._observe_productive], unit="s",
            description="Productive (goodput) time so far.")
        meter.create_observable_counter(
            sc.METRIC_BADPUT, callbacks=[self._observe_badput], unit="s",
            description="Unproductive time so far, by training.badput.bucket.")

    # -- training thread --------------------------------------------------------
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if span_label(span.name) is not None and span.start_time is not None:
            self._open[span.context.span_id] = span.start_time

    @contained()
    def on_end(self, span: ReadableSpan) -> None:
        name = span.name
        is_alert = name == sc.SPAN_ALERT
        if (span_label(name) is None and not is_alert) or span.start_time is None or span.end_time is None:
            return
        if len(self._ended) < self._max_pending:
            self._ended.append(SpanRecord(
                name, span.start_time, span.end_time, _RUN,
                attributes=dict(span.attributes or {}) if is_alert else {},
                span_id=format(span.context.span_id, "016x"),
                error=span.status.status_code is StatusCode.ERROR,
            ))
        else:
            self.dropped += 1
        # Only after the record is queued: the collector folds up to the earliest open start.
        self._open.pop(span.context.span_id, None)
        if name == sc.SPAN_STEP:
            self._record_step(span)

    def _record_step(self, span: ReadableSpan) -> None:
        duration = (span.end_time - span.start_time) / 1e9  # type: ignore[operator]
        self._step_duration.record(duration)
        attributes = span.attributes or {}
        if duration > 0:
            tokens = attributes.get(sc.TOKENS)
            samples = attributes.get(sc.SAMPLES, attributes.get(sc.BATCH_SIZE))
            if isinstance(tokens, (int, float)) and not isinstance(tokens, bool):
                self._tokens_rate.record(tokens / duration)
            if isinstance(samples, (int, float)) and not isinstance(samples, bool):
                self._samples_rate.record(samples / duration)
        self._durations.append(duration)
        self._steps += 1
        if self._configured_ideal is None and (self._steps == MIN_STEPS or self._steps % IDEAL_EVERY == 0):
            self.ideal_step_time_s = derive_ideal(list(self._durations))
        if self.ideal_step_time_s is not None:
            self._deviation.set(duration - self.ideal_step_time_s)

    # -- metric collection (reader thread) ------------------------------------------
    def settle(self) -> dict[str, int]:
        """Classify the time that can no longer change; nanoseconds by label so far."""
        with self._settle_lock:
            # Earliest start of a classified span still open: time after it may still change.
            until = min(list(self._open.values()), default=None)
            now = self._clock()
            until = now if until is None else min(until, now)
            while True:
                try:
                    record = self._ended.popleft()
                except IndexError:
                    break
                self._accountant.add(record)
            self._accountant.fold(until)
            return dict(self._accountant.timeline.totals)

    @property
    def elapsed_ns(self) -> int:
        return self._accountant.timeline.folded_until - self.origin_ns

    @contained(default=())
    def _observe_goodput(self, options: CallbackOptions) -> Iterable[Observation]:
        totals = self.settle()
        elapsed = self.elapsed_ns
        return [Observation(totals.get(PRODUCTIVE, 0) / elapsed)] if elapsed > 0 else []

    @contained(default=())
    def _observe_productive(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(self.settle().get(PRODUCTIVE, 0) / 1e9)]

    @contained(default=())
    def _observe_badput(self, options: CallbackOptions) -> Iterable[Observation]:
        totals = self.settle()
        return [Observation(totals.get(bucket, 0) / 1e9, {sc.BADPUT_BUCKET: bucket}) for bucket in BUCKETS]

    @contained(default=())
    def _observe_ideal(self, options: CallbackOptions) -> Iterable[Observation]:
        ideal = self.ideal_step_time_s
        return [] if ideal is None else [Observation(ideal)]

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
