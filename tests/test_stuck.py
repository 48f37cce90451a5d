"""StuckSpanProcessor with the real SDK: alerts, escalation, recovery, thresholds, actions, fork."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from clocks import FakeClock
from environ import child_environ
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otlp_json import read_spans
from waiting import wait_until

from otel_training import StuckEvent, StuckOptions, StuckSpanProcessor
from otel_training import semconv as sc
from otel_training._stacks import thread_stacks
from otel_training.processors.stuck_options import OPTION_FIELDS
from otel_training.processors.thresholds import (
    SOURCE_ADAPTIVE,
    SOURCE_CAPPED,
    SOURCE_FIRST,
    SOURCE_WARMUP,
    AdaptiveSettings,
    ThresholdLearner,
)

REPO = Path(__file__).resolve().parent.parent


def wait_for(condition: Callable[[], object], timeout_s: float = 5.0) -> None:
    assert wait_until(condition, timeout_s), "condition not met within %.1f s" % timeout_s


class Pipeline:
    """A TracerProvider with the processor under test and an in-memory exporter.

    ``kwargs``: the constructor's, and ``StuckOptions``' fields, which go into its ``options``."""

    def __init__(self, **kwargs: object) -> None:
        self.exporter = InMemorySpanExporter()
        self.reader = InMemoryMetricReader()
        self.events: list[StuckEvent] = []
        self.provider = TracerProvider()
        kwargs.setdefault("on_stuck", self.events.append)
        policy = {name: kwargs.pop(name) for name in list(kwargs) if name in OPTION_FIELDS}
        self.processor = StuckSpanProcessor(options=StuckOptions(**policy),
                                            meter_provider=MeterProvider(metric_readers=[self.reader]), **kwargs)
        self.provider.add_span_processor(self.processor)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("test")

    def alerts(self, kind: str | None = None) -> list:
        return [span for span in self.exporter.get_finished_spans()
                if span.name == sc.SPAN_ALERT and (kind is None or span.attributes[sc.ALERT_KIND] == kind)]

    def alert_counts(self) -> dict[str, int]:
        data = self.reader.get_metrics_data()
        counts: dict[str, int] = {}
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == sc.METRIC_ALERTS:
                        for point in metric.data.data_points:
                            counts[point.attributes[sc.ALERT_KIND]] = point.value
        return counts


@pytest.fixture
def pipeline() -> Iterator[Callable[..., Pipeline]]:
    made: list[Pipeline] = []

    def make(**kwargs: object) -> Pipeline:
        made.append(Pipeline(**kwargs))
        return made[-1]

    yield make
    for item in made:
        item.provider.shutdown()


def test_fires_once_per_threshold_then_escalates_then_recovers(pipeline: Callable[..., Pipeline]) -> None:
    clock = FakeClock()  # times in binary fractions: deadlines compare exactly
    p = pipeline(threshold_s=0.25, first_threshold_s=0.25, escalation_s=0.5, clock=clock, watcher=False)
    with p.tracer.start_as_current_span(sc.SPAN_EPOCH, attributes={sc.EPOCH: 2}) as epoch:
        with p.tracer.start_as_current_span(sc.SPAN_STEP, attributes={sc.STEP: 17}) as step:
            clock.now += 0.125
            assert p.processor.tick() == 0 and not p.events  # not before the threshold
            clock.now += 0.125
            assert p.processor.tick() == 1 and len(p.events) == 1
            clock.now += 0.25
            assert p.processor.tick() == 0 and len(p.events) == 1  # once, not again before the escalation
            clock.now += 0.25
            assert p.processor.tick() == 1 and len(p.events) == 2  # threshold + escalation
            clock.now += 0.125  # then the step ends
    p.processor.tick()  # the recovery's callbacks run where the scans run
    assert [event.kind for event in p.events] == [sc.ALERT_KIND_STUCK, sc.ALERT_KIND_STUCK, sc.ALERT_KIND_RECOVERED]
    assert [event.elapsed_s for event in p.events] == [0.25, 0.75, 0.875]
    stuck = p.alerts(sc.ALERT_KIND_STUCK)
    assert [span.attributes[sc.ALERT_COUNT] for span in stuck] == [1, 2]
    # Only the repeat says so: a paging rule counts one episode against the one recovery.
    assert [span.attributes.get(sc.ALERT_REPEAT) for span in stuck] == [None, True]
    first = stuck[0]
    step_context = step.get_span_context()
    assert first.parent.span_id == step_context.span_id
    assert first.context.trace_id == step_context.trace_id
    assert [link.context.span_id for link in first.links] == [step_context.span_id]
    assert first.attributes[sc.STEP] == 17
    assert first.attributes[sc.EPOCH] == 2
    assert first.attributes[sc.ALERT_SPAN_NAME] == sc.SPAN_STEP
    assert first.attributes[sc.ALERT_SPAN_ID] == f"{step_context.span_id:016x}"
    assert first.attributes[sc.ALERT_THRESHOLD_S] == 0.25
    assert first.attributes[sc.ALERT_ELAPSED_S] == 0.25
    assert first.attributes[sc.ALERT_SOURCE] == sc.ALERT_SOURCE_PROCESSOR
    assert "test_fires_once_per_threshold" in first.attributes[sc.ALERT_STACKS]  # the stuck thread's stack
    recovered = p.alerts(sc.ALERT_KIND_RECOVERED)[0]
    assert recovered.attributes[sc.ALERT_ELAPSED_S] > stuck[1].attributes[sc.ALERT_ELAPSED_S]
    assert recovered.parent.span_id == step_context.span_id
    # The open span got an event per alert; the metric counted them by kind.
    ended_step = next(span for span in p.exporter.get_finished_spans() if span.name == sc.SPAN_STEP)
    assert [event.name for event in ended_step.events] == [sc.EVENT_ALERT, sc.EVENT_ALERT]
    assert p.alert_counts() == {sc.ALERT_KIND_STUCK: 2, sc.ALERT_KIND_RECOVERED: 1}
    assert epoch.get_span_context().span_id not in {span.parent.span_id for span in stuck}


def test_unwatched_and_fast_spans_raise_nothing(pipeline: Callable[..., Pipeline]) -> None:
    p = pipeline(threshold_s=0.1, first_threshold_s=0.1, span_names={sc.SPAN_STEP: None, "training.save_*": 0.5})
    with p.tracer.start_as_current_span(sc.SPAN_EPOCH):
        time.sleep(0.2)  # not watched
    for _ in range(50):
        with p.tracer.start_as_current_span(sc.SPAN_STEP):
            pass
    with p.tracer.start_as_current_span("training.save_checkpoint"):
        time.sleep(0.2)  # watched by pattern, with its own 0.5 s threshold
    assert p.processor.open_count == 0
    assert p.processor.threshold_for("training.save_checkpoint").seconds == 0.5
    assert p.processor.threshold_for(sc.SPAN_EPOCH) is None
    with p.tracer.start_as_current_span("training.save_checkpoint"):
        wait_for(lambda: p.events)
    assert p.events[0].span_name == "training.save_checkpoint"
    assert p.events[0].threshold_s == 0.5


def test_first_span_allowance_then_adaptive_threshold(pipeline: Callable[..., Pipeline]) -> None:
    settings = AdaptiveSettings(min_samples=10, min_threshold_s=0.05, recompute_every=4)
    p = pipeline(threshold_s=5.0, first_threshold_s=20.0, adaptive=True, adaptive_settings=settings)
    assert p.processor.threshold_for(sc.SPAN_STEP).source == SOURCE_FIRST
    assert p.processor.threshold_for(sc.SPAN_STEP).seconds == 20.0
    for index in range(12):
        with p.tracer.start_as_current_span(sc.SPAN_STEP):
            time.sleep(0.01 if index else 0.05)
        if index == 0:
            assert p.processor.threshold_for(sc.SPAN_STEP).source == SOURCE_WARMUP
            assert p.processor.threshold_for(sc.SPAN_STEP).seconds == 5.0
    learned = p.processor.threshold_for(sc.SPAN_STEP)
    assert learned.source == SOURCE_ADAPTIVE
    # 2 x the slow first step (0.05 s) is the largest term.
    assert 0.09 < learned.seconds < 0.5, learned
    with p.tracer.start_as_current_span(sc.SPAN_STEP):
        wait_for(lambda: p.events)
    event = p.events[0]
    assert event.threshold_source == SOURCE_ADAPTIVE
    assert "median" in event.threshold_rule and "MAD" in event.threshold_rule
    assert event.attributes[sc.ALERT_THRESHOLD_RULE] == event.threshold_rule


def test_learner_is_robust_to_jitter_and_periodic_spikes() -> None:
    import random

    rng = random.Random(1)
    learner = ThresholdLearner("s", None, 60.0, AdaptiveSettings(min_threshold_s=0.0))
    assert learner.threshold.seconds == 60.0 and learner.threshold.source == SOURCE_FIRST
    learner.observe(30.0)  # compilation
    for step in range(1, 3000):
        duration = 1.0 + rng.uniform(-0.2, 0.2)
        if step % 100 == 0:
            duration *= 5  # checkpoint
        assert duration < learner.threshold.seconds, (step, duration, learner.threshold)
        learner.observe(duration)
    # Learned, not stuck at the warm-up value; a 30 s hang is far past it.
    assert learner.threshold.source == SOURCE_ADAPTIVE
    assert 10 < learner.threshold.seconds < 15
    capped = ThresholdLearner("s", 2.0, None, AdaptiveSettings(min_threshold_s=0.0))
    for _ in range(20):
        capped.observe(1.0)
    assert capped.threshold.seconds == 2.0 and capped.threshold.source == SOURCE_CAPPED


def test_a_recovered_hang_is_not_learned(pipeline: Callable[..., Pipeline]) -> None:
    settings = AdaptiveSettings(min_samples=3, min_threshold_s=0.05, recompute_every=1)
    p = pipeline(threshold_s=0.2, first_threshold_s=0.2, adaptive=True, adaptive_settings=settings)
    for _ in range(3):
        with p.tracer.start_as_current_span(sc.SPAN_STEP):
            pass
    before = p.processor.threshold_for(sc.SPAN_STEP)
    with p.tracer.start_as_current_span(sc.SPAN_STEP):
        wait_for(lambda: p.events)
        time.sleep(0.1)
    assert p.processor.threshold_for(sc.SPAN_STEP) == before


def test_callbacks_are_contained(pipeline: Callable[..., Pipeline]) -> None:
    seen: list[StuckEvent] = []

    def broken(event: StuckEvent) -> None:
        raise RuntimeError("user bug")

    p = pipeline(threshold_s=0.1, first_threshold_s=0.1, escalation_s=0.1, on_stuck=[broken, seen.append])
    with p.tracer.start_as_current_span(sc.SPAN_STEP):
        wait_for(lambda: len(seen) >= 2)  # the watcher survived the broken callback and escalated
    wait_for(lambda: p.alerts(sc.ALERT_KIND_RECOVERED))


def test_shutdown_joins_the_watcher_promptly(pipeline: Callable[..., Pipeline]) -> None:
    p = pipeline(threshold_s=3600.0)
    span = p.tracer.start_span(sc.SPAN_STEP)
    watcher = p.processor._thread
    assert watcher is not None and watcher.is_alive()
    started = time.monotonic()
    p.processor.shutdown()
    assert time.monotonic() - started < 0.5
    assert not watcher.is_alive()
    span.end()


def test_thread_stacks_are_bounded() -> None:
    stop = threading.Event()
    threads = [threading.Thread(target=stop.wait, name=f"worker-{i}") for i in range(20)]
    for thread in threads:
        thread.start()
    try:
        text = thread_stacks(threading.get_ident(), max_chars=2000)
        assert len(text) <= 2000 and text.endswith("[truncated]")
        assert text.startswith("Thread MainThread")
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def test_configure_exports_the_alert_to_the_file_at_once(configure: Callable[..., object], tmp_path: Path) -> None:
    from otel_training import TrainerProcess

    telemetry = configure(stuck_threshold_s=0.2, exporter="file", offload=False)
    telemetry.stuck.rules.first_threshold_s = None  # the first step gets no longer allowance
    trainer = TrainerProcess()
    with trainer.epoch(epoch=1):
        with trainer.step(global_step=5):
            pass
        with trainer.step(global_step=6):
            # The batch processor would wait 5 s; the alert must be in the file while the step is still open.
            def alert_in_file() -> bool:
                path = telemetry.trace_path
                return path is not None and path.exists() and any(
                    span["name"] == sc.SPAN_ALERT for span in read_spans(path))
            started = time.monotonic()
            wait_for(alert_in_file, timeout_s=4.0)
            assert time.monotonic() - started < 2.0
    telemetry.shutdown(timeout_s=2)
    spans = read_spans(telemetry.trace_path)
    alerts = [span for span in spans if span["name"] == sc.SPAN_ALERT]
    step = next(span for span in spans if span["name"] == sc.SPAN_STEP and span["attributes"][sc.STEP] == 6)
    assert {alert["attributes"][sc.ALERT_KIND] for alert in alerts} == {"stuck", "recovered"}
    for alert in alerts:
        assert alert["parent_id"] == step["span_id"]
        assert alert["links"][0]["span_id"] == step["span_id"]
        assert alert["attributes"][sc.EPOCH] == 1 and alert["attributes"][sc.STEP] == 6
        assert alert["resource"] == step["resource"]


def run_script(script: str, tmp_path: Path, timeout: float = 30, **environ: str) -> subprocess.CompletedProcess[str]:
    """``tests/scripts/<script>``, in ``tmp_path``, with ``environ`` added."""
    env = {**child_environ(), **environ}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, str(REPO / "tests" / "scripts" / script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)


OFFLOADED = pytest.mark.parametrize("environ", [{}, {"OTEL_TRAINING_OFFLOAD": "true"}], ids=["in-process", "offload"])


@OFFLOADED
def test_exit_action_flushes_and_exits_with_the_code(tmp_path: Path, environ: dict[str, str]) -> None:
    """Offloaded, the drain's detector asks the training process to do the same (pipeline/responder.py)."""
    result = run_script("stuck_exit_action.py", tmp_path, **environ)
    assert result.returncode == 42, result.stderr
    assert "not reached" not in result.stdout
    spans = read_spans(tmp_path / "traces" / "traces-r0.jsonl")
    alert = next(span for span in spans if span["name"] == sc.SPAN_ALERT)
    assert alert["attributes"][sc.ALERT_ACTION] == "exit"
    assert alert["attributes"][sc.STEP] == 2
    # The open spans were ended before the exit, so the trace holds the stuck step itself.
    stuck_step = next(span for span in spans if span["name"] == sc.SPAN_STEP and span["attributes"][sc.STEP] == 2)
    assert stuck_step["status"]["code"] == 2
    assert alert["parent_id"] == stuck_step["span_id"]
    assert next(span for span in spans if span["name"] == sc.SPAN_EPOCH)["status"]["code"] == 2


@OFFLOADED
def test_signal_action_signals_the_process(tmp_path: Path, environ: dict[str, str]) -> None:
    result = run_script("stuck_signal_action.py", tmp_path, **environ)
    assert result.returncode == 0, result.stderr
    assert "signalled [10]" in result.stdout


def test_fork_child_neither_inherits_the_watcher_nor_duplicates_alerts(tmp_path: Path) -> None:
    result = run_script("stuck_fork_child.py", tmp_path)
    assert result.returncode == 0, result.stderr
    assert "child 0 parent 1" in result.stdout, result.stdout + result.stderr


def test_a_huge_threshold_does_not_kill_the_watcher(pipeline: Callable[..., Pipeline]) -> None:
    # Issue 13 item 7: a deadline 1e9 s away made the watcher's wait overflow and die, silencing every name.
    p = pipeline(threshold_s=1e9, span_names={sc.SPAN_STEP: None, "fast": 0.1})  # "fast": 1 s at first
    slow = p.tracer.start_span(sc.SPAN_STEP)
    wait_for(lambda: p.processor._wake_at != float("inf"))  # the watcher now sleeps towards that deadline
    fast = p.tracer.start_span("fast")
    wait_for(lambda: p.alerts(sc.ALERT_KIND_STUCK))
    assert [span.attributes[sc.ALERT_SPAN_NAME] for span in p.alerts(sc.ALERT_KIND_STUCK)] == ["fast"]
    fast.end()
    slow.end()


def test_thresholds_below_the_floor_are_refused() -> None:
    for make in (lambda: StuckSpanProcessor(threshold_s=0.0),
                 lambda: StuckSpanProcessor(1.0, options=StuckOptions(escalation_s=0.001)),
                 lambda: StuckSpanProcessor(span_names={"training.step": 0.0})):
        with pytest.raises(ValueError, match="0.01"):
            make()


def test_an_alert_being_raised_when_shutdown_begins_is_delivered(configure, monkeypatch: pytest.MonkeyPatch) -> None:
    """The topology e2e test once lost one span of 1,570 this way on a loaded machine: the watcher
    had checked that a step was still open and was descheduled before ending its alert span; the
    step ended, training finished, and shutdown closed the batch processor before the detector, so
    the alert ended after it and was counted as dropped."""
    from otel_training.processors import stuck as stuck_module

    telemetry = configure(stuck_threshold_s=0.05, exporter="file", metrics=False, offload=False)
    detector = telemetry.stuck
    in_alert, resume = threading.Event(), threading.Event()

    def descheduled(thread_id: int, **kwargs: object) -> str:
        in_alert.set()  # past the "still open?" check, before the alert span ends
        resume.wait(10)
        return ""

    monkeypatch.setattr(stuck_module, "thread_stacks", descheduled)
    stop = detector.shutdown

    def resume_then_stop() -> None:  # the watcher gets the CPU back once the detector is told to stop
        resume.set()
        stop()

    monkeypatch.setattr(detector, "shutdown", resume_then_stop)
    step = telemetry.tracer.start_span(sc.SPAN_STEP, attributes={sc.STEP: 460})
    assert in_alert.wait(10), "the watcher never raised the alert"
    step.end()  # the step recovers while its alert is being raised
    result = telemetry.shutdown(timeout_s=5)
    assert result.completed and result.dropped == 0, result
    kinds = [span["attributes"][sc.ALERT_KIND] for span in read_spans(telemetry.trace_path)
             if span["name"] == sc.SPAN_ALERT]
    assert sorted(kinds) == [sc.ALERT_KIND_RECOVERED, sc.ALERT_KIND_STUCK]


def test_a_stop_right_after_the_watcher_found_an_alert_due_still_raises_it() -> None:
    """The watcher found a span past its threshold and let go of its lock; a shutdown took the
    lock at that instant and set the stop. The alert already due is still raised."""
    seen: list[StuckEvent] = []
    exporter = InMemorySpanExporter()
    processor = StuckSpanProcessor(0.05, [sc.SPAN_STEP], StuckOptions(on_stuck=seen.append, stacks=False))
    stopped_after_due = threading.Event()

    class StopOnRelease(threading.Condition):  # what shutdown() does, the moment the watcher releases the lock
        def __exit__(self, *exc: object) -> None:
            super().__exit__(*exc)
            if threading.current_thread().name == "otel-training-stuck" and not stopped_after_due.is_set():
                if processor._scan(processor._clock())[0]:
                    stopped_after_due.set()
                    with self:
                        processor._stopping = True
                        self.notify_all()

    processor._cond = StopOnRelease(threading.Lock())
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(processor)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    span = provider.get_tracer("test").start_span(sc.SPAN_STEP)
    assert stopped_after_due.wait(10), "the watcher never found the span due"
    processor.shutdown()
    assert [event.kind for event in seen] == [sc.ALERT_KIND_STUCK]
    assert [s.attributes[sc.ALERT_KIND] for s in exporter.get_finished_spans() if s.name == sc.SPAN_ALERT] \
        == [sc.ALERT_KIND_STUCK]
    span.end()


def test_a_detector_a_user_added_is_stopped_before_the_last_flush_too(configure) -> None:
    telemetry = configure(exporter="file", metrics=False, offload=False)
    mine = StuckSpanProcessor(3600.0, [sc.SPAN_STEP])
    telemetry.add_span_processor(mine)
    order: list[str] = []
    stop, flush = mine.shutdown, telemetry.tracer_provider.force_flush
    mine.shutdown = lambda: order.append("detector") or stop()  # type: ignore[method-assign]
    telemetry.tracer_provider.force_flush = lambda *a, **k: order.append("flush") or flush(*a, **k)  # type: ignore[method-assign]
    telemetry.shutdown(timeout_s=5)
    assert order[:2] == ["detector", "flush"]
