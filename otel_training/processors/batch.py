"""The SDK's batch span processor, with an account of its spans and a policy for a full queue.

The SDK's ``BatchSpanProcessor`` drops the oldest span when its queue is full.
A step loop that makes spans faster than the exporter sends them (OTLP encodes
about 100 µs of Python per span, holding the GIL the loop also needs) then
loses a share of every run: 29% of a 50 000-step loop at 8 400 steps/s against
a local collector. Waiting for the exporter instead delivers everything, at the
exporter's pace. It is what the default does, but only while the exporter is
making progress: against a collector that is gone or hangs, waiting would stall
training and deliver nothing, so there the queue drops as before, counted.

The wait is bounded (``max_wait_s`` per span), the time waited is counted
(``waited_s``), and a loop of real steps (milliseconds each) never waits.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from otel_training._contain import log_once
from otel_training._sdk_compat import batch_queue_length

#: What ``policy`` takes: wait for a progressing exporter when the queue is full, or drop the oldest span.
POLICIES = ("wait", "drop")
#: The specification's default for ``OTEL_BSP_MAX_QUEUE_SIZE``.
_DEFAULT_MAX_QUEUE_SIZE = 2048
#: How often a waiting thread looks at the queue again; sleeping also lets the exporter's thread run.
_POLL_S = 0.0002


class CountingBatchSpanProcessor(BatchSpanProcessor):
    """The SDK's batch processor counting the spans it is given, waiting for the exporter when full."""

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_queue_size: int | None = None,
        policy: str = "wait",
        max_wait_s: float = 0.5,
        exporter_progressing: Callable[[], bool] = lambda: True,
        schedule_delay_millis: float | None = None,
        max_export_batch_size: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy {policy!r}: expected one of {', '.join(POLICIES)}")
        if max_queue_size is None:  # the SDK's default and variable, resolved here to know when it is full
            max_queue_size = int(os.environ.get("OTEL_BSP_MAX_QUEUE_SIZE", "") or _DEFAULT_MAX_QUEUE_SIZE)
        super().__init__(exporter, max_queue_size=max_queue_size, schedule_delay_millis=schedule_delay_millis,
                         max_export_batch_size=max_export_batch_size)
        self.accepted = 0
        #: Seconds the threads ending spans waited for room in the queue, and how many waits.
        self.waited_s = 0.0
        self.waits = 0
        self._max_queue_size = max_queue_size
        self._wait = policy == "wait"
        self._max_wait_s = max_wait_s
        self._progressing = exporter_progressing
        self._clock = clock
        self._sleep = sleep

    def on_end(self, span: ReadableSpan) -> None:
        if not (span.context is not None and span.context.trace_flags.sampled):
            return
        self.accepted += 1
        if self._wait:
            queued = batch_queue_length(self)
            if queued is not None and queued >= self._max_queue_size:
                self._wait_for_room()
        super().on_end(span)

    def _wait_for_room(self) -> None:
        if not self._progressing():
            return  # the exporter is failing or hanging: waiting would stall training for nothing
        start = self._clock()
        deadline = start + self._max_wait_s
        while True:
            self._sleep(_POLL_S)
            queued = batch_queue_length(self)
            now = self._clock()
            if queued is None or queued < self._max_queue_size or now >= deadline or not self._progressing():
                break
        self.waits += 1
        self.waited_s += now - start
        log_once("span-queue-wait",
                 "otel_training: the span queue is full (%d spans): spans are made faster than the exporter sends "
                 "them, so the threads ending them wait for it (at most %.3g s a span; counted in the metric "
                 "training.telemetry.span_queue.wait); see span_queue_policy in docs/configuration.md",
                 self._max_queue_size, self._max_wait_s, exc_info=False)

    def queued(self) -> int | None:
        """Spans in the queue; None where the SDK does not tell (then nothing pending is called dropped)."""
        return batch_queue_length(self)
