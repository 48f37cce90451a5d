"""The stuck detector on an injected clock, driven by ``tick()``: no watcher thread, no sleeps.

Every deadline, escalation and recovery below is decided by the fake clock's value,
so the same assertions hold on an idle laptop and a loaded CI box.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from clocks import FakeClock
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_training import semconv as sc
from otel_training.processors.stuck import StuckEvent, StuckSpanProcessor
from otel_training.processors.stuck_options import OPTION_FIELDS, StuckOptions


class Detector:
    """``kwargs``: the constructor's, and ``StuckOptions``' fields, which go into its ``options``."""

    def __init__(self, **kwargs) -> None:
        self.clock = FakeClock(1000.0)
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.events: list[StuckEvent] = []
        policy = {name: kwargs.pop(name) for name in list(kwargs) if name in OPTION_FIELDS}
        options = StuckOptions(on_stuck=self.events.append, stacks=False, **policy)
        self.processor = StuckSpanProcessor(options=options, clock=self.clock, watcher=False,
                                            meter_provider=MeterProvider(), **kwargs)
        self.provider.add_span_processor(self.processor)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("test")

    def alerts(self) -> list:
        return [span for span in self.exporter.get_finished_spans() if span.name == sc.SPAN_ALERT]


@pytest.fixture
def detector() -> Iterator[Detector]:
    made: list[Detector] = []

    def make(**kwargs) -> Detector:
        made.append(Detector(**kwargs))
        return made[-1]

    yield make  # type: ignore[misc]
    for d in made:
        d.provider.shutdown()


def test_nothing_is_due_before_the_threshold_and_the_alert_comes_at_it(detector) -> None:
    d = detector(threshold_s=30, first_threshold_s=30)
    step = d.tracer.start_span(sc.SPAN_STEP, attributes={sc.STEP: 7})
    d.clock.now += 29.999
    assert d.processor.tick() == 0 and not d.alerts()
    d.clock.now += 0.001
    assert d.processor.tick() == 1
    (alert,) = d.alerts()
    assert alert.attributes[sc.ALERT_KIND] == sc.ALERT_KIND_STUCK
    assert alert.attributes[sc.ALERT_ELAPSED_S] == pytest.approx(30.0)
    assert alert.attributes[sc.STEP] == 7 and alert.parent.span_id == step.get_span_context().span_id
    assert [e.kind for e in d.events] == [sc.ALERT_KIND_STUCK]
    step.end()


def test_escalation_repeats_at_its_interval_and_the_end_is_a_recovery(detector) -> None:
    d = detector(threshold_s=10, first_threshold_s=10, escalation_s=60)
    step = d.tracer.start_span(sc.SPAN_STEP)
    d.clock.now += 10
    assert d.processor.tick() == 1
    d.clock.now += 59
    assert d.processor.tick() == 0  # next at 10 + 60
    d.clock.now += 1
    assert d.processor.tick() == 1
    counts = [a.attributes[sc.ALERT_COUNT] for a in d.alerts()]
    assert counts == [1, 2] and d.alerts()[1].attributes[sc.ALERT_REPEAT] is True
    d.clock.now += 5
    step.end()
    d.processor.tick()  # the recovery's callbacks run where the scans run
    kinds = [a.attributes[sc.ALERT_KIND] for a in d.alerts()]
    assert kinds == [sc.ALERT_KIND_STUCK, sc.ALERT_KIND_STUCK, sc.ALERT_KIND_RECOVERED]
    assert d.alerts()[-1].attributes[sc.ALERT_ELAPSED_S] == pytest.approx(75.0)
    assert [e.kind for e in d.events][-1] == sc.ALERT_KIND_RECOVERED
    assert d.processor.open_count == 0


def test_a_late_scan_after_a_freeze_repeats_from_now_not_in_a_burst(detector) -> None:
    d = detector(threshold_s=10, first_threshold_s=10, escalation_s=10)
    step = d.tracer.start_span(sc.SPAN_STEP)
    d.clock.now += 100  # the process was frozen well past several escalations
    assert d.processor.tick() == 1
    assert d.processor.tick() == 0
    d.clock.now += 10
    assert d.processor.tick() == 1
    step.end()


def test_the_first_span_of_a_name_gets_the_first_threshold_then_the_name_its_own(detector) -> None:
    d = detector(threshold_s=5, first_threshold_s=50)
    first = d.tracer.start_span(sc.SPAN_STEP)
    d.clock.now += 49
    assert d.processor.tick() == 0  # compilation, warm-up: the first step may take longer
    d.clock.now += 1
    first.end()
    second = d.tracer.start_span(sc.SPAN_STEP)
    d.clock.now += 5
    assert d.processor.tick() == 1
    assert d.alerts()[0].attributes[sc.ALERT_THRESHOLD_S] == 5
    second.end()


def test_only_the_watched_names_are_watched_each_with_its_rule(detector) -> None:
    d = detector(span_names={"training.step": 10, "training.save_*": 100}, first_threshold_s=0.01)
    assert d.processor.threshold_for("training.save_checkpoint").seconds == 100
    assert d.processor.threshold_for("training.epoch") is None
    other = d.tracer.start_span("training.epoch")
    save = d.tracer.start_span("training.save_checkpoint")
    d.clock.now += 1000
    assert d.processor.tick() == 1
    (alert,) = d.alerts()
    assert alert.attributes[sc.ALERT_SPAN_NAME] == "training.save_checkpoint"
    assert alert.attributes[sc.ALERT_THRESHOLD_S] == 100  # the pattern's own threshold, not the step's
    save.end()
    other.end()


def test_spans_that_began_before_they_arrived_are_timed_from_their_own_start(detector) -> None:
    # The offload drain replays a step some time after it began (a backdated span is the same): the threshold
    # counts from its start, whoever runs the detector; a span started now is timed from now.
    d = detector(threshold_s=30, first_threshold_s=30)
    late = d.tracer.start_span(sc.SPAN_STEP, attributes={sc.STEP: 3}, start_time=time.time_ns() - 20 * 10**9)
    d.clock.now += 9.5
    assert d.processor.tick() == 0
    d.clock.now += 1.0  # 30.5 s after the step began, 10.5 s after it arrived
    assert d.processor.tick() == 1
    late.end()
    on_time = detector(threshold_s=30, first_threshold_s=30)
    on_time.tracer.start_span(sc.SPAN_STEP, attributes={sc.STEP: 3})
    on_time.clock.now += 29.5
    assert on_time.processor.tick() == 0
    on_time.clock.now += 1.0
    assert on_time.processor.tick() == 1


def test_a_span_that_was_stuck_but_arrived_ended_still_gets_its_alert_and_recovery(detector) -> None:
    d = detector(threshold_s=30, first_threshold_s=30)
    begun = time.time_ns() - 45 * 10**9
    d.tracer.start_span(sc.SPAN_STEP, attributes={sc.STEP: 9}, start_time=begun).end(end_time=begun + 40 * 10**9)
    d.processor.tick()  # callbacks run where the scans run
    kinds = [alert.attributes[sc.ALERT_KIND] for alert in d.alerts()]
    assert kinds == [sc.ALERT_KIND_STUCK, sc.ALERT_KIND_RECOVERED]
    assert d.alerts()[0].attributes[sc.ALERT_ELAPSED_S] == pytest.approx(40.0)
    assert [event.kind for event in d.events] == [sc.ALERT_KIND_STUCK, sc.ALERT_KIND_RECOVERED]
    quick = detector(threshold_s=30, first_threshold_s=30)
    quick.tracer.start_span(sc.SPAN_STEP, start_time=begun).end(end_time=begun + 29 * 10**9)
    quick.processor.tick()
    assert quick.alerts() == [] and quick.events == []


def test_a_long_hang_logs_its_repeats_at_doubling_counts_and_exports_every_one(
        detector, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    d = detector(threshold_s=3, first_threshold_s=3, escalation_s=3)
    step = d.tracer.start_span(sc.SPAN_STEP, attributes={sc.STEP: 4})
    with caplog.at_level(logging.INFO, logger="otel_training"):
        for _ in range(30):  # a 90 s hang, alerted every 3 s
            d.clock.now += 3
            d.processor.tick()
        step.end()
        d.processor.tick()
    stuck = [alert for alert in d.alerts() if alert.attributes[sc.ALERT_KIND] == sc.ALERT_KIND_STUCK]
    assert len(stuck) == 30  # every alert exported
    lines = [record.getMessage() for record in caplog.records if " stuck after " in record.getMessage()]
    assert len(lines) == 5, lines  # alerts 1, 2, 4, 8 and 16
    assert "alert 16, logged at 1, 2, 4, 8..." in lines[-1]
    assert sum(" recovered after " in record.getMessage() for record in caplog.records) == 1


class _WatchdogSlot:
    """The slot a watchdog already alerted on: ``alerts`` stuck alerts on ``span_id`` (issue 29)."""

    def __init__(self) -> None:
        self.span_id, self.alerts, self.marked = 0, 0, []

    def begin(self, span, parent_context, start_s, threshold_s) -> None:
        pass

    def end(self, span_id: int) -> None:
        pass

    def alerted(self, span_id: int) -> None:
        self.marked.append(span_id)

    def watchdog_alerts(self, span_id: int) -> int:
        return self.alerts if span_id == self.span_id else 0


def test_a_span_the_watchdog_alerted_on_while_frozen_is_one_episode_whoever_alerts_next(detector) -> None:
    """A rank frozen with the GIL held: the watchdog raised 3 alerts; when the process comes back its alerts
    continue that episode as repeats (no second first alert for the rules to count) and its action still
    runs once, and the span's end is the one recovery."""
    slot = _WatchdogSlot()
    d = detector(threshold_s=1, first_threshold_s=1, slot=slot)
    acted: list[str] = []
    d.processor._actions.act = acted.append
    step = d.tracer.start_span(sc.SPAN_STEP)
    other = d.tracer.start_span(sc.SPAN_STEP)
    slot.span_id, slot.alerts = step.get_span_context().span_id, 3
    d.clock.now += 5  # the process is back, 4 s past the threshold
    assert d.processor.tick() == 2
    by_span = {a.attributes[sc.ALERT_SPAN_ID]: a.attributes for a in d.alerts()}
    frozen = by_span[f"{step.get_span_context().span_id:016x}"]
    assert frozen[sc.ALERT_COUNT] == 4 and frozen[sc.ALERT_REPEAT] is True
    fresh = by_span[f"{other.get_span_context().span_id:016x}"]  # not the watchdog's: a first alert
    assert fresh[sc.ALERT_COUNT] == 1 and sc.ALERT_REPEAT not in fresh
    assert acted == [sc.SPAN_STEP, sc.SPAN_STEP]
    assert set(slot.marked) == {step.get_span_context().span_id, other.get_span_context().span_id}
    step.end()
    other.end()
    kinds = [a.attributes[sc.ALERT_KIND] for a in d.alerts()]
    assert kinds.count(sc.ALERT_KIND_RECOVERED) == 2
    first = [a for a in d.alerts() if a.attributes[sc.ALERT_KIND] == sc.ALERT_KIND_STUCK
             and not a.attributes.get(sc.ALERT_REPEAT)]
    assert len(first) == 1  # the watchdog's own first alert is the frozen span's episode
