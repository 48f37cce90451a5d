"""The drain's device spans from device records (``pipeline/device_steps.py``), driven record by record.

The end-to-end path (the C core's thread, the ring, the drain) is tests/test_device_native.py; here the
rules: clamping, stream order, a lost record, the time between steps, host work, a failed resolver.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from otel_training import semconv as sc
from otel_training.pipeline.device_steps import DeviceSteps
from otel_training.pipeline.records import DEVICE_BEGIN, DEVICE_END, DEVICE_FAILED

MS = 1_000_000
T0 = 1_700_000_000_000_000_000


class Harness:
    def __init__(self, threshold_s: float | None = 1.0) -> None:
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = provider.get_tracer("test")
        self.steps = DeviceSteps(self.tracer, lambda: threshold_s)
        self.steps.info("cuda:0", "Test GPU")
        self.ids = 0
        self.epoch = self.tracer.start_span(sc.SPAN_EPOCH, attributes={sc.EPOCH: 2}, start_time=T0)

    def host_step(self, step: int, start_ms: float, end_ms: float | None = None, timed: bool = True) -> int:
        from opentelemetry.trace import set_span_in_context

        self.ids += 1
        span = self.tracer.start_span(sc.SPAN_STEP, context=set_span_in_context(self.epoch),
                                      attributes={sc.STEP: step, sc.STEP_DEVICE_TIMED: timed, sc.BATCH_SIZE: 4},
                                      start_time=T0 + int(start_ms * MS))
        self.steps.host_began(self.ids, span, 2)  # type: ignore[arg-type]
        if end_ms is not None:
            self.end_host(self.ids, span, end_ms)
        self.spans = getattr(self, "spans", {})
        self.spans[self.ids] = span
        return self.ids

    def end_host(self, token: int, span: Any, end_ms: float) -> None:
        self.steps.host_ended(token, span, T0 + int(end_ms * MS))
        span.end(end_time=T0 + int(end_ms * MS))

    def device(self, token: int, which: int, at_ms: float) -> None:
        self.steps.device(token, which, T0 + int(at_ms * MS))

    def finished(self, name: str = sc.SPAN_DEVICE_STEP) -> list[Any]:
        return [span for span in self.exporter.get_finished_spans() if span.name == name]


def test_a_device_step_is_the_child_of_its_host_step_on_the_device_timeline() -> None:
    h = Harness()
    token = h.host_step(0, 0, 3)
    h.device(token, DEVICE_BEGIN, -1)  # a calibration error before the host launched it: clamped
    h.device(token, DEVICE_END, 10)
    (span,) = h.finished()
    assert span.parent.span_id == h.spans[token].get_span_context().span_id
    assert span.start_time == T0 and span.end_time == T0 + 10 * MS
    attributes = span.attributes
    assert attributes[sc.STEP] == 0 and attributes[sc.EPOCH] == 2 and attributes[sc.DEVICE] == "cuda:0"
    assert attributes[sc.DEVICE_NAME] == "Test GPU" and attributes[sc.STEP_LAUNCHED] is True
    assert attributes[sc.BATCH_SIZE] == 4


def test_a_device_step_made_in_the_drain_passes_its_end_hook_before_it_ends() -> None:
    """The GPU state's step join (issue 31) sees the device spans the drain makes from the C core's records."""
    h = Harness()
    seen: list[tuple[str, int, bool]] = []
    h.steps.on_end = lambda span, end_ns: seen.append((span.name, end_ns, span.end_time is None))
    token = h.host_step(0, 0, 3)
    h.device(token, DEVICE_BEGIN, 1)
    h.device(token, DEVICE_END, 10)
    assert seen == [(sc.SPAN_DEVICE_STEP, T0 + 10 * MS, True)]


def test_the_next_step_waits_for_the_previous_one_on_the_device() -> None:
    h = Harness()
    first = h.host_step(0, 0, 1)
    second = h.host_step(1, 1, 2)
    h.device(first, DEVICE_BEGIN, 1)
    h.device(second, DEVICE_BEGIN, 2)  # recorded before the first one's end record came
    assert [span.name for span in h.exporter.get_finished_spans()].count(sc.SPAN_DEVICE_STEP) == 0
    h.device(first, DEVICE_END, 8)
    h.device(second, DEVICE_END, 15)
    one, two = sorted(h.finished(), key=lambda span: span.attributes[sc.STEP])
    assert two.start_time == one.end_time == T0 + 8 * MS  # it could not begin before the first ended
    assert two.attributes[sc.DEVICE_IDLE_BEFORE_S] == 0.0 and two.attributes[sc.DEVICE_LAST_COMPLETED_STEP] == 0


def test_a_lost_end_record_ends_its_step_as_such_when_a_later_step_ends() -> None:
    h = Harness()
    first = h.host_step(0, 0, 1)
    second = h.host_step(1, 1, 2)
    h.device(first, DEVICE_BEGIN, 1)
    # first's end record was lost (a full ring); the device went on
    h.device(second, DEVICE_BEGIN, 9)
    h.device(second, DEVICE_END, 15)
    one, two = sorted(h.finished(), key=lambda span: span.attributes[sc.STEP])
    assert one.status.status_code is StatusCode.ERROR and one.end_time <= two.start_time
    assert two.status.status_code is StatusCode.UNSET and two.end_time == T0 + 15 * MS
    h.device(first, DEVICE_END, 20)  # a stray late record changes nothing
    assert len(h.finished()) == 2


def test_the_time_between_steps_past_the_threshold_is_a_span_until_the_next_step() -> None:
    h = Harness(threshold_s=1.0)
    token = h.host_step(0, 0, 2)
    h.device(token, DEVICE_BEGIN, 1)
    h.device(token, DEVICE_END, 5)
    h.steps.tick(T0 + 900 * MS)
    assert not h.finished(sc.SPAN_BETWEEN_STEPS)
    h.steps.tick(T0 + 1006 * MS)  # 1.001 s after both the host and the device were done
    h.host_step(1, 1500)
    (gap,) = h.finished(sc.SPAN_BETWEEN_STEPS)
    assert gap.start_time == T0 + 5 * MS and gap.end_time == T0 + 1500 * MS
    assert gap.attributes[sc.STEP] == 0 and gap.attributes[sc.DEVICE_LAST_COMPLETED_STEP] == 0


def _a_step_then_a_save() -> tuple[Harness, Any]:
    """Step 0 done on the host at 2 ms and on the device at 5 ms, then a checkpoint save begun at 6 ms (id 100)."""
    h = Harness(threshold_s=1.0)
    token = h.host_step(0, 0, 2)
    h.device(token, DEVICE_BEGIN, 1)
    h.device(token, DEVICE_END, 5)
    save = h.tracer.start_span(sc.SPAN_SAVE_CHECKPOINT, start_time=T0 + 6 * MS)
    h.steps.host_began(100, save, None)  # type: ignore[arg-type]
    return h, save


def test_host_work_and_the_end_of_training_are_no_gap() -> None:
    h, save = _a_step_then_a_save()
    h.steps.tick(T0 + 5000 * MS)
    h.steps.host_ended(100, save, T0 + 5000 * MS)  # type: ignore[arg-type]
    train = h.tracer.start_span(sc.SPAN_TRAIN, start_time=T0)
    h.steps.host_began(101, train, None)  # type: ignore[arg-type]
    h.steps.host_ended(101, train, T0 + 5001 * MS)  # type: ignore[arg-type]
    h.steps.tick(T0 + 9000 * MS)
    h.steps.abandon("the end", T0 + 9001 * MS)  # ends a gap, had one begun
    assert not h.finished(sc.SPAN_BETWEEN_STEPS)


def test_the_time_after_host_work_counts_from_its_end_not_from_the_step_before() -> None:
    """A save, then an evaluation, back to back: between the two no host work is open, and the step before
    them ended long ago. The time between steps counts from the last host work's end, so that moment is no gap
    (it was: a tick there opened one backdated to the step, alerted as seconds stuck)."""
    h, save = _a_step_then_a_save()
    h.steps.host_ended(100, save, T0 + 3000 * MS)  # type: ignore[arg-type]
    h.steps.tick(T0 + 3001 * MS)  # between the save and the evaluation
    evaluation = h.tracer.start_span(sc.SPAN_EVALUATE, start_time=T0 + 3002 * MS)
    h.steps.host_began(101, evaluation, None)  # type: ignore[arg-type]
    h.steps.host_ended(101, evaluation, T0 + 6000 * MS)  # type: ignore[arg-type]
    h.steps.tick(T0 + 6900 * MS)
    assert not h.finished(sc.SPAN_BETWEEN_STEPS)
    h.steps.tick(T0 + 7001 * MS)  # past the threshold after the evaluation: a gap, from the evaluation's end
    h.host_step(1, 7500)
    (gap,) = h.finished(sc.SPAN_BETWEEN_STEPS)
    assert gap.start_time == T0 + 6000 * MS and gap.end_time == T0 + 7500 * MS


def test_a_failed_resolver_ends_what_is_open_and_later_steps_are_not_waited_for() -> None:
    h = Harness()
    token = h.host_step(0, 0, 1)
    h.device(token, DEVICE_BEGIN, 1)
    h.steps.device(0, DEVICE_FAILED, T0 + 3 * MS)
    (span,) = h.finished()
    assert span.status.status_code is StatusCode.ERROR
    later = h.host_step(1, 4, 5)
    h.device(later, DEVICE_BEGIN, 6)
    h.steps.tick(T0 + 60_000 * MS)
    h.steps.abandon("the end", T0 + 60_001 * MS)  # ends a gap, had one begun
    assert len(h.finished()) == 1 and not h.finished(sc.SPAN_BETWEEN_STEPS)


def test_steps_no_longer_timed_on_the_device_release_what_waited() -> None:
    h = Harness(threshold_s=1.0)
    token = h.host_step(0, 0, 1)
    h.device(token, DEVICE_BEGIN, 1)
    h.host_step(1, 2, 3, timed=False)  # the training process fell back to host timing
    (span,) = h.finished()
    assert span.status.status_code is StatusCode.ERROR
    h.steps.tick(T0 + 60_000 * MS)  # the host's steps are watched themselves now, not the time between
    h.steps.abandon("the end", T0 + 60_001 * MS)
    assert not h.finished(sc.SPAN_BETWEEN_STEPS)
