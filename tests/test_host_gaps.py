"""The time between host steps, watched in the drain (pipeline/host_gaps.py): when it becomes a
``training.between_steps`` span, and when it does not (host work, the end of training, a device timeline)."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_training import semconv as sc
from otel_training.pipeline.host_gaps import HostGaps

S = 1_000_000_000


class Rig:
    def __init__(self, threshold_s: float | None = 2.0, device: bool = False) -> None:
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource.create({}))
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = provider.get_tracer("t")
        self.gaps = HostGaps(self.tracer, lambda: threshold_s, lambda: device)
        self.ids = 0

    def span(self, name: str, start_s: float, end_s: float | None = None, **attributes: Any) -> tuple[int, Any]:
        self.ids += 1
        span = self.tracer.start_span(name, attributes=attributes, start_time=int(start_s * S))
        self.gaps.host_began(self.ids, span, attributes.get(sc.EPOCH))
        if end_s is not None:
            self.end((self.ids, span), end_s)
        return self.ids, span

    def end(self, begun: tuple[int, Any], end_s: float) -> None:
        span_id, span = begun
        span.end(int(end_s * S))
        self.gaps.host_ended(span_id, span, int(end_s * S))

    def between(self) -> list[Any]:
        return [span for span in self.exporter.get_finished_spans() if span.name == sc.SPAN_BETWEEN_STEPS]


def test_a_gap_past_the_step_threshold_becomes_a_span_from_the_steps_end_until_the_next_step() -> None:
    rig = Rig()
    rig.span(sc.SPAN_STEP, 0.0, 1.0, **{sc.STEP: 7, sc.THREAD_ID: 11})
    rig.gaps.tick(int(2.9 * S))
    assert rig.gaps.gaps == 0  # 1.9 s after the step: under the threshold
    rig.gaps.tick(int(3.1 * S))
    rig.gaps.tick(int(4.0 * S))
    assert rig.gaps.gaps == 1  # one span for one gap
    rig.span(sc.SPAN_STEP, 9.0)  # the next step begins: the gap ends there
    (gap,) = rig.between()
    assert (gap.start_time, gap.end_time) == (1 * S, 9 * S)
    assert gap.attributes[sc.STEP] == 7 and gap.attributes[sc.THREAD_ID] == 11


def test_host_work_the_end_of_training_and_a_device_timeline_are_no_gap() -> None:
    rig = Rig()
    rig.span(sc.SPAN_TRAIN, 0.0)
    rig.span(sc.SPAN_STEP, 0.0, 1.0)
    checkpoint = rig.span(sc.SPAN_SAVE_CHECKPOINT, 1.5)  # a checkpoint after the step, still open at 5 s
    rig.gaps.tick(5 * S)
    assert rig.gaps.gaps == 0
    rig.end(checkpoint, 6.0)
    rig.gaps.tick(int(7.5 * S))
    assert rig.gaps.gaps == 0  # the time after host work counts from its end
    rig.gaps.tick(int(8.1 * S))
    assert rig.gaps.gaps == 1
    for kind in ("destroy", "device", "device-timed"):
        other = Rig(device=kind == "device")  # the drain's own device steps watch the time between steps
        # device-timed: the training process's device timeline watches it (and makes its own gap span)
        other.span(sc.SPAN_STEP, 0.0, 1.0, **({sc.STEP_DEVICE_TIMED: True} if kind == "device-timed" else {}))
        if kind == "destroy":
            other.span(sc.SPAN_DISTRIBUTED_DESTROY, 1.2)  # the zero-code teardown: training is over
        other.gaps.tick(60 * S)
        assert other.gaps.gaps == 0, kind


def test_no_threshold_no_watch_and_an_open_gap_ends_when_the_pipeline_closes() -> None:
    off = Rig(threshold_s=None)
    off.span(sc.SPAN_STEP, 0.0, 1.0)
    off.gaps.tick(100 * S)
    assert off.gaps.gaps == 0
    rig = Rig()
    rig.span(sc.SPAN_STEP, 0.0, 1.0)
    rig.gaps.tick(5 * S)
    rig.gaps.abandon(6 * S)
    (gap,) = rig.between()
    assert gap.end_time == 6 * S
