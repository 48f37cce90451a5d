"""A full span queue: wait for a progressing exporter, drop (counted) for a failing or hung one.

The queue and the exporter are real (the SDK's batch processor, a gated
exporter); the waiting thread's clock and sleep are injected, so the bounds
are exact and nothing depends on how fast this machine is.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from waiting import wait_until

from otel_training.exporters.guarded import STALLED_S, GuardedSpanExporter
from otel_training.processors.batch import CountingBatchSpanProcessor


class _Gated(SpanExporter):
    """Delivers a batch only once the test opens the gate."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.delivered: list[str] = []
        self.result = SpanExportResult.SUCCESS

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.entered.set()
        self.gate.wait(30)
        self.delivered += [span.name for span in spans]
        return self.result


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept = 0

    def __call__(self) -> float:
        return self.now


def _pipeline(exporter: SpanExporter, clock: _Clock, on_sleep=None, **options) -> tuple[CountingBatchSpanProcessor,
                                                                                         TracerProvider]:
    def sleep(seconds: float) -> None:
        clock.now += seconds
        clock.slept += 1
        if on_sleep is not None:
            on_sleep(clock)

    processor = CountingBatchSpanProcessor(exporter, max_queue_size=4, max_export_batch_size=2,
                                           schedule_delay_millis=3_600_000, clock=clock, sleep=sleep, **options)
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(processor)
    return processor, provider


def _fill(provider: TracerProvider, exporter: _Gated, processor: CountingBatchSpanProcessor) -> None:
    """Two spans out to the (gated) exporter, four more filling the queue."""
    tracer = provider.get_tracer("test")
    tracer.start_span("s0").end()
    tracer.start_span("s1").end()  # the batch size: wakes the worker, which blocks in the exporter
    assert exporter.entered.wait(30)
    for index in range(2, 6):
        tracer.start_span(f"s{index}").end()
    assert processor.queued() == 4


def test_a_full_queue_waits_for_a_progressing_exporter_and_loses_nothing() -> None:
    exporter, clock = _Gated(), _Clock()
    guard = GuardedSpanExporter(exporter, clock=clock)

    def release_after_a_while(clock: _Clock) -> None:
        if clock.slept == 5:
            exporter.gate.set()  # the export finishes while the thread waits; the worker takes a batch
            wait_until(lambda: processor.queued() < 4, timeout_s=30, interval_s=0.001)
    processor, provider = _pipeline(guard, clock, release_after_a_while, exporter_progressing=guard.progressing)
    _fill(provider, exporter, processor)

    provider.get_tracer("test").start_span("s6").end()  # the queue is full: waits until the worker made room
    assert processor.waits == 1 and processor.waited_s >= 5 * 0.0002
    provider.force_flush()
    assert sorted(exporter.delivered) == sorted(f"s{index}" for index in range(7))
    assert processor.accepted == guard.exported == 7
    provider.shutdown()


def test_a_wait_is_bounded_by_max_wait() -> None:
    exporter, clock = _Gated(), _Clock()
    processor, provider = _pipeline(exporter, clock, max_wait_s=0.01)
    _fill(provider, exporter, processor)
    provider.get_tracer("test").start_span("s6").end()
    assert processor.waits == 1 and processor.waited_s == pytest.approx(0.01, abs=0.0002)
    assert processor.queued() == 4  # gave up: the SDK dropped the oldest to take it
    exporter.gate.set()
    provider.shutdown()


@pytest.mark.parametrize("why", ["stalled", "failed", "closed"])
def test_a_failing_stalled_or_closed_exporter_is_not_waited_for(why: str) -> None:
    exporter, clock = _Gated(), _Clock()
    guard = GuardedSpanExporter(exporter, clock=clock)
    processor, provider = _pipeline(guard, clock, exporter_progressing=guard.progressing)
    _fill(provider, exporter, processor)
    assert guard.progressing()
    if why == "stalled":
        clock.now += STALLED_S  # the export under way has run for as long as a hung collector's
    elif why == "failed":
        guard._last_failed = True  # what a failed export leaves (the next test goes through it for real)
    else:
        guard._closed.set()
    assert not guard.progressing()
    provider.get_tracer("test").start_span("s6").end()
    assert (processor.waits, clock.slept) == (0, 0)  # dropped at once, as the SDK does
    exporter.gate.set()
    provider.shutdown()


def test_an_export_that_failed_stops_the_waits_until_one_succeeds() -> None:
    exporter, clock = _Gated(), _Clock()
    exporter.gate.set()
    exporter.result = SpanExportResult.FAILURE
    guard = GuardedSpanExporter(exporter, clock=clock)
    assert guard.export([]) is SpanExportResult.FAILURE and not guard.progressing()
    exporter.result = SpanExportResult.SUCCESS
    assert guard.export([]) is SpanExportResult.SUCCESS and guard.progressing()


def test_drop_is_the_sdks_behaviour() -> None:
    exporter, clock = _Gated(), _Clock()
    processor, provider = _pipeline(exporter, clock, policy="drop")
    _fill(provider, exporter, processor)
    provider.get_tracer("test").start_span("s6").end()
    assert (processor.waits, clock.slept, processor.queued()) == (0, 0, 4)
    exporter.gate.set()
    provider.shutdown()


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="policy 'block'"):
        CountingBatchSpanProcessor(_Gated(), policy="block")
