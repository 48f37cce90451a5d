"""The live goodput processor, through a real SDK pipeline, against the hand-computed crafted job."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import goodput_traces as crafted
import pytest
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Status, StatusCode
from waiting import wait_until

from otel_training import _contain
from otel_training import semconv as sc
from otel_training.processors import goodput
from otel_training.processors.goodput import GoodputSpanProcessor


class Pipeline:
    def __init__(self, origin_s: float, now_s: float, reader: InMemoryMetricReader | None = None,
                 **options: Any) -> None:
        self.now_ns = crafted._s(now_s)
        self.reader = reader or InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        origin = crafted._s(origin_s)
        self.processor = GoodputSpanProcessor(self.meter_provider, clock=lambda: origin, **options)
        self.processor._clock = lambda: self.now_ns  # origin fixed above; collections see "now"
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(self.processor)
        self.tracer = self.tracer_provider.get_tracer("test")

    def replay(self, spans: list[dict[str, Any]]) -> None:
        """Start every span at its start time, then end them in end-time order (as a run would)."""
        started = {}
        for span in sorted(spans, key=lambda span: span["start"]):
            attributes = dict(span["attributes"])
            if sc.ALERT_SPAN_ID in attributes:
                attributes[sc.ALERT_SPAN_ID] = format(started[attributes[sc.ALERT_SPAN_ID]].context.span_id, "016x")
            started[span["span_id"]] = self.tracer.start_span(
                span["name"], attributes=attributes, start_time=crafted._s(span["start"]))
        for span in sorted(spans, key=lambda span: span["end"]):
            sdk_span = started[span["span_id"]]
            if span["error"]:
                sdk_span.set_status(Status(StatusCode.ERROR))
            sdk_span.end(end_time=crafted._s(span["end"]))

    def metrics(self) -> dict[str, list[Any]]:
        data = self.reader.get_metrics_data()
        found: dict[str, list[Any]] = {}
        for resource_metrics in data.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    found[metric.name] = list(metric.data.data_points)
        return found


    def steps(self, count: int, start_s: float = 0.0, duration_s: float = 2.0) -> list[Any]:
        """``count`` back-to-back step spans of ``duration_s``, carrying samples; the ended SDK spans."""
        spans = []
        for index in range(count):
            start_s_of_step = start_s + index * duration_s
            span = self.tracer.start_span(sc.SPAN_STEP, attributes={sc.SAMPLES: 8},
                                          start_time=crafted._s(start_s_of_step))
            span.end(end_time=crafted._s(start_s_of_step + duration_s))
            spans.append(span)
        return spans


def _run(rank: int, restart: int) -> list[dict[str, Any]]:
    return [span for span in crafted.SPANS if span["rank"] == rank and span["restart"] == restart]


def _badput(points: list[Any]) -> dict[str, float]:
    return {point.attributes[sc.BADPUT_BUCKET]: point.value for point in points}


def test_live_metrics_of_a_restarted_run_match_the_hand_computation() -> None:
    pipeline = Pipeline(80, 120, after_restart=True)
    pipeline.replay(_run(0, 1))
    metrics = pipeline.metrics()

    assert metrics[sc.METRIC_GOODPUT][0].value == pytest.approx(20 / 40)
    assert metrics[sc.METRIC_GOODPUT_TIME][0].value == pytest.approx(20)
    badput = _badput(metrics[sc.METRIC_BADPUT])
    assert badput[sc.BADPUT_RECOVERY] == pytest.approx(2)
    assert badput[sc.BADPUT_CHECKPOINT_RESTORE] == pytest.approx(3)
    assert badput[sc.BADPUT_CHECKPOINT_SAVE] == pytest.approx(1)
    assert badput[sc.BADPUT_HOST_OUTSIDE_STEPS] == pytest.approx(1)  # 106-107: training.train ends at 107
    assert badput[sc.BADPUT_OTHER] == pytest.approx(13)
    assert badput[sc.BADPUT_PROGRAM_STARTUP] == 0

    (steps,) = metrics[sc.METRIC_STEP_DURATION]
    assert (steps.count, steps.sum) == (10, pytest.approx(20.0))
    (samples,) = metrics[sc.METRIC_STEP_SAMPLES_RATE]
    assert samples.sum / samples.count == pytest.approx(8 / 2.0)
    (tokens,) = metrics[sc.METRIC_STEP_TOKENS_RATE]
    assert tokens.sum / tokens.count == pytest.approx(1024 / 2.0)
    # The ideal exists from the 10th step on; the 10th step took exactly the ideal.
    assert metrics[sc.METRIC_STEP_IDEAL_DURATION][0].value == pytest.approx(2.0)
    assert metrics[sc.METRIC_STEP_DEVIATION][0].value == pytest.approx(0.0)


def test_live_stuck_time_and_buckets_of_a_failing_run() -> None:
    pipeline = Pipeline(0, 70)
    pipeline.replay(_run(0, 0))
    metrics = pipeline.metrics()
    badput = _badput(metrics[sc.METRIC_BADPUT])
    expected = {sc.BADPUT_INITIALIZATION: 5, sc.BADPUT_TRAINING_PREP: 5, sc.BADPUT_PROGRAM_STARTUP: 2,
                sc.BADPUT_DATA_LOADING: 1, sc.BADPUT_EVALUATION: 4, sc.BADPUT_CHECKPOINT_SAVE: 2,
                sc.BADPUT_STUCK: 7, sc.BADPUT_HOST_OUTSIDE_STEPS: 6, sc.BADPUT_OTHER: 0,
                # Only the report, seeing the restart, knows progress was lost.
                sc.BADPUT_WASTED_PROGRESS: 0}
    for bucket, seconds in expected.items():
        assert badput[bucket] == pytest.approx(seconds), bucket
    assert metrics[sc.METRIC_GOODPUT_TIME][0].value == pytest.approx(23 + 15)


def test_configured_ideal_gives_deviations_from_the_first_step_either_sign() -> None:
    pipeline = Pipeline(80, 120, ideal_step_time_s=2.5)
    pipeline.replay(_run(0, 1)[:3])  # process, restore, train: no step yet
    assert sc.METRIC_STEP_DEVIATION not in pipeline.metrics()
    pipeline.replay([span for span in _run(0, 1) if span["name"] == sc.SPAN_STEP][:1])
    assert pipeline.metrics()[sc.METRIC_STEP_DEVIATION][0].value == pytest.approx(-0.5)
    assert pipeline.metrics()[sc.METRIC_STEP_IDEAL_DURATION][0].value == pytest.approx(2.5)


def test_an_open_span_holds_back_classification_until_it_ends() -> None:
    pipeline = Pipeline(0, 15)
    step = pipeline.tracer.start_span(sc.SPAN_STEP, start_time=crafted._s(10))
    pipeline.processor.settle()
    assert pipeline.processor.elapsed_ns == 10 * 10**9  # not past the open step's start
    step.end(end_time=crafted._s(12))
    totals = pipeline.processor.settle()
    assert totals == {sc.BADPUT_PROGRAM_STARTUP: 10 * 10**9, "productive": 2 * 10**9,
                      sc.BADPUT_HOST_OUTSIDE_STEPS: 3 * 10**9}


def test_configure_installs_it_and_the_file_exporter_writes_the_metrics(configure) -> None:
    import otel_training

    telemetry = configure(exporter="file", offload=False)
    trainer = otel_training.TrainerProcess()
    with trainer.train():
        for step in range(12):
            with trainer.step(global_step=step, samples=4, tokens=64):
                pass
    telemetry.shutdown(timeout_s=5)
    assert telemetry.metrics_path is not None
    names = set()
    for line in telemetry.metrics_path.read_text().splitlines():
        for resource_metrics in json.loads(line)["resourceMetrics"]:
            for scope_metrics in resource_metrics["scopeMetrics"]:
                names.update(metric["name"] for metric in scope_metrics["metrics"])
    assert {sc.METRIC_STEP_DURATION, sc.METRIC_GOODPUT, sc.METRIC_BADPUT, sc.METRIC_STEP_DEVIATION,
            sc.METRIC_STEP_TOKENS_RATE, sc.METRIC_STEP_SAMPLES_RATE, sc.METRIC_STEP_IDEAL_DURATION} <= names


def test_goodput_option_off_installs_nothing(configure) -> None:
    telemetry = configure(exporter="none", goodput=False, offload=False)
    processors = telemetry.tracer_provider._active_span_processor._span_processors
    assert not any(isinstance(processor, GoodputSpanProcessor) for processor in processors)


class _Spy:
    """Stands in for a synchronous instrument: counts calls and the threads they came from."""

    def __init__(self, instrument: Any, calls: list[str]) -> None:
        self._instrument, self._calls = instrument, calls

    def __getattr__(self, method: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self._calls.append(threading.current_thread().name)
            return getattr(self._instrument, method)(*args, **kwargs)

        return call


def test_the_training_thread_does_no_metric_work(monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline = Pipeline(0, 100)
    processor = pipeline.processor
    calls: list[str] = []
    for name in ("_step_duration", "_tokens_rate", "_samples_rate", "_deviation"):
        monkeypatch.setattr(processor, name, _Spy(getattr(processor, name), calls))
    records: list[str] = []
    build = goodput._record
    monkeypatch.setattr(goodput, "_record", lambda span: records.append(threading.current_thread().name) or build(span))

    pipeline.steps(12)  # past MIN_STEPS: the ideal and the deviation exist
    assert calls == [] and records == []  # no instrument call and no record built while spans start and end

    collector = threading.Thread(target=pipeline.metrics, name="collector")
    collector.start()
    collector.join()
    assert calls and set(calls) == {"collector"}
    assert records == ["collector"] * 12


def test_steps_recorded_but_not_sampled_get_no_exemplar() -> None:
    """Exemplars point at spans that are exported: under a sampler that records a step span
    without sampling it, the trace-based filter offers no exemplar, as for a measurement made
    inside that span."""
    from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult

    class RecordOnly(Sampler):
        def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
            return SamplingResult(Decision.RECORD_ONLY)

        def get_description(self) -> str:
            return "record only"

    pipeline = Pipeline(0, 100)
    provider = TracerProvider(sampler=RecordOnly())
    provider.add_span_processor(pipeline.processor)
    pipeline.tracer = provider.get_tracer("test")
    pipeline.steps(3)
    (steps,) = pipeline.metrics()[sc.METRIC_STEP_DURATION]
    assert steps.count == 3
    assert not steps.exemplars


def test_values_recorded_in_the_callbacks_land_in_the_same_collection() -> None:
    # Delta temporality: a value recorded in a callback but collected a round late would show here.
    reader = InMemoryMetricReader(preferred_temporality={Histogram: AggregationTemporality.DELTA})
    pipeline = Pipeline(0, 100, reader=reader)
    spans = pipeline.steps(3)
    (steps,) = pipeline.metrics()[sc.METRIC_STEP_DURATION]
    assert (steps.count, steps.sum) == (3, pytest.approx(6.0))
    # Exemplars (trace-based filter) point at the step spans themselves.
    assert {exemplar.span_id for exemplar in steps.exemplars} <= {span.context.span_id for span in spans}
    assert steps.exemplars

    pipeline.steps(2, start_s=6)
    (steps,) = pipeline.metrics()[sc.METRIC_STEP_DURATION]
    assert steps.count == 2


def test_the_queue_is_bounded_and_what_it_drops_is_counted_and_logged_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(_contain, "_seen", set())
    pipeline = Pipeline(0, 100, max_pending=5, settle_in_background=False)
    with caplog.at_level(logging.WARNING, logger="otel_training"):
        pipeline.steps(8)
    assert pipeline.processor.dropped == 3
    warnings = [record for record in caplog.records if "goodput queue full" in record.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    metrics = pipeline.metrics()
    (steps,) = metrics[sc.METRIC_STEP_DURATION]
    assert steps.count == 5  # the first five; the other three are left out
    (dropped,) = metrics[sc.METRIC_GOODPUT_SPANS_DROPPED]
    assert dropped.value == 3  # and exported, so the collector's rules can alert on it

    pipeline.steps(5, start_s=16)  # a collection empties the queue
    assert pipeline.processor.dropped == 3
    (steps,) = pipeline.metrics()[sc.METRIC_STEP_DURATION]
    assert steps.count == 10


def test_a_fast_loop_is_settled_between_collections_by_the_processors_own_thread() -> None:
    # The default metric interval is a minute: a loop faster than max_pending steps a
    # minute overflowed the queue between two collections and left steps out of goodput.
    pipeline = Pipeline(0, 1000, max_pending=10)
    processor = pipeline.processor
    pipeline.steps(4)
    assert len(processor._started) == 4  # below half of max_pending: nothing woken yet
    pipeline.steps(1, start_s=8)  # the fifth: half of max_pending wakes the settling thread
    assert wait_until(lambda: not processor._started and processor._durations)
    assert threading.current_thread().name != "otel-training-goodput-settle"
    for round_index in range(1, 20):  # 100 steps, 10x max_pending, with no collection in between
        pipeline.steps(5, start_s=10 * round_index)
        assert wait_until(lambda: not processor._started)
    assert processor.dropped == 0
    metrics = pipeline.metrics()
    (steps,) = metrics[sc.METRIC_STEP_DURATION]
    assert steps.count == 100  # every step, although no collection came before this one
    (dropped,) = metrics[sc.METRIC_GOODPUT_SPANS_DROPPED]
    assert dropped.value == 0
    processor.shutdown()
    assert wait_until(lambda: not processor._settler.is_alive())


def test_the_settling_thread_runs_only_on_its_own_thread() -> None:
    pipeline = Pipeline(0, 1000, max_pending=4)
    seen: list[str] = []
    settle = pipeline.processor.settle
    pipeline.processor.settle = lambda: seen.append(threading.current_thread().name) or settle()  # type: ignore[method-assign]
    pipeline.steps(2)
    assert wait_until(lambda: seen)
    assert seen == ["otel-training-goodput-settle"]
