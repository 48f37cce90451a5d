"""Device values logged in a step: read once the device has computed them, never by the training thread waiting.

On CPU with the fake asynchronous device (``fake_device.py``): a "tensor" on it completes when the work queued
before it is done, which a test holds with a gate. The reader refuses to read a value before its marker has
completed, so a test that passes has not read one early; the training thread never waits on the device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from clocks import FakeClock
from fake_device import FakeDevice, Marker
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otlp_json import read_spans

import otel_training
from otel_training import _ring
from otel_training import semconv as sc
from otel_training.events import values as values_module
from otel_training.processors.late_values import SPAN, LateValuesSpanProcessor


class FakeScalar:
    """A one-element tensor on the fake device: its value exists once the work queued before it is done."""

    class device:
        type = "fake"

        def __str__(self) -> str:
            return "fake:0"

    device = device()  # type: ignore[assignment,misc]
    shape = ()
    dtype = "float32"

    def __init__(self, value: float) -> None:
        self.value = value

    def numel(self) -> int:
        return 1


class FakeReader:
    """``ValueReader`` on the fake device: a marker after the value's work; reading before it completes fails."""

    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        self.early_reads = 0

    def start(self, value: Any) -> Any:
        if not isinstance(value, FakeScalar):
            return None
        return self.device.record(), value.value

    def ready(self, handle: tuple[Marker, float]) -> bool:
        return self.device.completed_ns(handle[0]) is not None

    def read(self, handle: tuple[Marker, float]) -> float:
        if not self.ready(handle):
            self.early_reads += 1
            raise AssertionError("read before the device computed it")
        return handle[1]


@pytest.fixture
def device() -> Any:
    made = FakeDevice()
    reader = FakeReader(made)
    values_module.use_reader(lambda: reader)
    yield made, reader
    values_module.use_reader(None)
    made.stop()


def _wait_done(device: FakeDevice) -> None:
    device.synchronize()  # the test waits for the device; the code under test never does


@pytest.mark.parametrize("offload", [False, True], ids=["in-process", "offloaded"])
def test_a_device_loss_logged_in_a_step_arrives_on_the_step_without_the_training_thread_waiting(
        configure: Any, tmp_path: Path, device: Any, offload: bool) -> None:
    if offload and _ring.supported() is not None:
        pytest.skip(f"offload unavailable: {_ring.supported()}")
    fake, reader = device
    telemetry = configure(exporter="file", offload=offload, metrics=False)
    trainer = otel_training.TrainerProcess()
    gate = fake.launch_gate()  # the step's device work: held until the test opens it
    with trainer.epoch(epoch=0):
        with trainer.step(global_step=0) as step:
            loss = FakeScalar(0.75)
            trainer.log(loss=loss)  # an event on the step, its value not computed yet
            step.extra_args(loss=FakeScalar(0.5))  # the step's own attribute
        gate.set()  # the device catches up after the host ended the step
        _wait_done(fake)
        with trainer.step(global_step=1):  # the next step's begin reads what is ready: no wait
            pass
    assert telemetry.force_flush(timeout_s=10)
    spans = {(span["name"], span["attributes"].get(sc.STEP)): span for span in read_spans(telemetry.trace_path)}
    first = spans[(sc.SPAN_STEP, 0)]
    assert first["attributes"][sc.LOSS] == 0.5 and sc.VALUES_PENDING not in first["attributes"]
    log = next(event for event in first["events"] if event["name"] == "#log")
    assert log["attributes"][sc.LOSS] == 0.75 and sc.VALUES_PENDING not in log["attributes"]
    assert reader.early_reads == 0


def test_a_value_computed_before_the_step_ends_goes_on_the_span_at_once(configure: Any, device: Any) -> None:
    fake, _ = device
    telemetry = configure(exporter="file", offload=False, metrics=False)
    late = telemetry.late_values
    trainer = otel_training.TrainerProcess()
    with trainer.step(global_step=3) as step:
        step.extra_args(loss=FakeScalar(1.25))
        _wait_done(fake)
    assert late is not None and late.held == 0  # nothing to wait for: passed on at its end
    assert telemetry.force_flush(timeout_s=10)
    (span,) = [span for span in read_spans(telemetry.trace_path) if span["name"] == sc.SPAN_STEP]
    assert span["attributes"][sc.LOSS] == 1.25


def test_a_value_that_never_completes_is_exported_without_it_saying_so(configure: Any, device: Any) -> None:
    fake, reader = device
    telemetry = configure(exporter="file", offload=False, metrics=False)
    fake.launch_gate()  # never opened: a hung device
    trainer = otel_training.TrainerProcess()
    with trainer.step(global_step=0) as step:
        step.extra_args(loss=FakeScalar(2.0), note="kept")
    assert telemetry.late_values is not None and telemetry.late_values.held == 1
    assert telemetry.force_flush(timeout_s=10)  # a flush passes on what is held
    (span,) = [span for span in read_spans(telemetry.trace_path) if span["name"] == sc.SPAN_STEP]
    assert sc.LOSS not in span["attributes"] and span["attributes"][sc.VALUES_UNRESOLVED] == 1
    assert span["attributes"]["training.content.note"] == "kept" and reader.early_reads == 0


def test_without_a_reader_a_device_value_is_described_as_before(configure: Any) -> None:
    values_module.use_reader(lambda: None)
    try:
        telemetry = configure(exporter="file", offload=False, metrics=False)
        trainer = otel_training.TrainerProcess()
        with trainer.step(global_step=0) as step:
            step.extra_args(loss=FakeScalar(2.0))
        assert telemetry.force_flush(timeout_s=10)
        (span,) = [span for span in read_spans(telemetry.trace_path) if span["name"] == sc.SPAN_STEP]
        assert span["attributes"][sc.LOSS] == "<FakeScalar shape=() dtype=float32 device=fake:0>"
    finally:
        values_module.use_reader(None)


# -- the exporting side's hold (processors/late_values.py), on an injected clock -------------------------------
class _Seen(SpanProcessor):
    def __init__(self) -> None:
        self.ended: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.ended.append(span)


def _pipeline(hold_s: float = 5.0) -> tuple[TracerProvider, _Seen, LateValuesSpanProcessor, InMemorySpanExporter,
                                             FakeClock]:
    clock = FakeClock()
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({}))
    seen = _Seen()  # a stuck detector or goodput: beside the hold, not behind it
    provider.add_span_processor(seen)
    late = LateValuesSpanProcessor(SimpleSpanProcessor(exporter), hold_s=hold_s, clock=clock)
    provider.add_span_processor(late)
    return provider, seen, late, exporter, clock


def test_the_hold_delays_only_the_export_and_merges_values_into_the_span_and_its_event() -> None:
    provider, seen, late, exporter, _ = _pipeline()
    span = provider.get_tracer("t").start_span("training.step", attributes={"a": 1})
    span.add_event("#log", {sc.VALUES_PENDING: 1, "other": 2}, timestamp=1234)
    span.set_attribute(sc.VALUES_PENDING, 1)
    span.end()
    assert len(seen.ended) == 1 and exporter.get_finished_spans() == ()  # ended on time; export held
    span_id = span.get_span_context().span_id
    late.resolve(span_id, SPAN, {sc.LOSS: 0.5})
    assert exporter.get_finished_spans() == ()  # the event's value is still to come
    late.resolve(span_id, 1234, {"training.metric.loss": 0.25})
    (exported,) = exporter.get_finished_spans()
    assert dict(exported.attributes) == {"a": 1, sc.LOSS: 0.5}
    assert dict(exported.events[0].attributes) == {"other": 2, "training.metric.loss": 0.25}
    assert exported.get_span_context() == span.get_span_context() and exported.end_time == span.end_time


def test_values_that_arrive_before_their_span_ends_are_applied_when_it_ends() -> None:
    provider, _, late, exporter, _ = _pipeline()
    span = provider.get_tracer("t").start_span("training.step")
    span.add_event("#log", {sc.VALUES_PENDING: 1}, timestamp=99)
    late.resolve(span.get_span_context().span_id, 99, {"training.metric.loss": 3.0})
    span.end()
    (exported,) = exporter.get_finished_spans()
    assert dict(exported.events[0].attributes) == {"training.metric.loss": 3.0}


def test_a_span_held_past_hold_s_is_exported_without_its_values_and_counted() -> None:
    provider, _, late, exporter, clock = _pipeline(hold_s=5.0)
    span = provider.get_tracer("t").start_span("training.step", attributes={sc.VALUES_PENDING: 2})
    span.end()
    clock.now += 4.9
    late.tick()
    assert exporter.get_finished_spans() == ()
    clock.now += 0.2
    late.tick()
    (exported,) = exporter.get_finished_spans()
    assert exported.attributes[sc.VALUES_UNRESOLVED] == 2 and sc.VALUES_PENDING not in exported.attributes
    assert late.unresolved == 1 and late.held == 0
    late.resolve(span.get_span_context().span_id, SPAN, {sc.LOSS: 1.0})  # too late: nothing more is exported
    clock.now += 10
    late.tick()
    assert len(exporter.get_finished_spans()) == 1


def test_the_hold_is_bounded_in_spans() -> None:
    clock = FakeClock()
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({}))
    late = LateValuesSpanProcessor(SimpleSpanProcessor(exporter), hold_s=60, max_held=3, clock=clock)
    provider.add_span_processor(late)
    for index in range(10):
        provider.get_tracer("t").start_span(f"s{index}", attributes={sc.VALUES_PENDING: 1}).end()
    assert late.held <= 3 and len(exporter.get_finished_spans()) >= 7 and late.unresolved >= 7
    late.force_flush()
    assert len(exporter.get_finished_spans()) == 10 and late.held == 0


def test_values_of_a_long_span_wait_for_it_past_hold_s() -> None:
    """An event on an epoch that runs for hours: its value arrives at once, the epoch ends much later."""
    provider, _, late, exporter, clock = _pipeline(hold_s=5.0)
    epoch = provider.get_tracer("t").start_span("training.epoch")
    epoch.add_event("#log", {sc.VALUES_PENDING: 1}, timestamp=7)
    late.resolve(epoch.get_span_context().span_id, 7, {sc.LOSS: 0.125})
    clock.now += 3600
    late.tick()
    epoch.end()
    (exported,) = exporter.get_finished_spans()
    assert dict(exported.events[0].attributes) == {sc.LOSS: 0.125}


class Blocking:
    """A user's object whose ``__str__`` blocks until the test lets it go."""

    def __init__(self) -> None:
        import threading

        self.release = threading.Event()
        self.entered = threading.Event()

    def __str__(self) -> str:
        self.entered.set()
        self.release.wait(10)
        return "slow but fine"


@pytest.mark.parametrize("offload", [False, True], ids=["in-process", "offloaded"])
def test_an_object_whose_str_blocks_does_not_stall_the_step_and_its_text_arrives(configure: Any,
                                                                                 offload: bool) -> None:
    if offload and _ring.supported() is not None:
        pytest.skip(f"offload unavailable: {_ring.supported()}")
    import time

    telemetry = configure(exporter="file", offload=offload, metrics=False)
    trainer = otel_training.TrainerProcess()
    slow, other = Blocking(), Blocking()
    started = time.monotonic()
    with trainer.step(global_step=0, config=slow) as step:
        trainer.log(state=other)
        step.extra_args(where=Path("/data/x"))  # a known-cheap type: described at once
    assert time.monotonic() - started < 1.0  # nothing waited for the blocked __str__
    assert slow.entered.wait(10)
    slow.release.set()
    other.release.set()
    telemetry.shutdown(timeout_s=10)  # the pending conversions get a share of the exit budget, then the flush
    (span,) = [span for span in read_spans(telemetry.trace_path) if span["name"] == sc.SPAN_STEP]
    assert span["attributes"]["training.content.where"] == "/data/x"
    assert span["attributes"]["training.content.config"] == "slow but fine"
    log = next(event for event in span["events"] if event["name"] == "#log")
    assert log["attributes"]["training.metric.state"] == "slow but fine"
