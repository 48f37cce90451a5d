"""A job's trace files as the drain writes them with the GPU state sampled, through the stand-in NVML.

Each rank is what the drain does for it: a ``GpuState`` over a stand-in device (``fake_nvml.py``) sampled
on an injected clock, every step span joined by ``GpuState.on_span_end`` before it ends (as
``drain.Replayer._end`` does), stuck alerts carrying ``GpuState.alert_context()`` (as the drain's detector
gets it), all exported by the real SDK through the project's OTLP JSON file exporter to
``traces-r<rank>.jsonl``. The tests set a device's readings (throttled, an XID) between steps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fake_nvml import T0, Clock, FakeGpu, FakeNvml, S
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from otel_training import semconv as sc
from otel_training.exporters.otlp_json import OtlpJsonFileMetricExporter, OtlpJsonFileSpanExporter, trace_file
from otel_training.hardware.gpu_state import GpuState
from otel_training.hardware.metrics import register_metrics

JOB = "gpu-job"
#: Seconds between samples: a 1 s step sees two or three.
INTERVAL_S = 0.5


class Rank:
    """One rank's drain: its device, its sampler on a fake clock, its trace file."""

    def __init__(self, directory: Path, rank: int, *, t0: int = T0, job: str = JOB) -> None:
        self.rank = rank
        self.nvml = FakeNvml(count=1)
        self.gpu: FakeGpu = self.nvml.gpus[0]
        self.clock = Clock()
        self.clock.ns = t0
        self.state = GpuState(self.nvml, 0, INTERVAL_S, {}, clock_ns=self.clock)
        self.resource = Resource.create({sc.TRAINING_JOB_ID: job, sc.TRAINING_RANK: rank, sc.TRAINING_RUN_ID: "run-1",
                                         sc.SERVICE_NAME: "train", sc.SERVICE_INSTANCE_ID: f"instance-{rank}"})
        self.provider = TracerProvider(resource=self.resource, shutdown_on_exit=False)
        self.provider.add_span_processor(SimpleSpanProcessor(OtlpJsonFileSpanExporter(trace_file(directory, rank))))
        self.tracer = self.provider.get_tracer(sc.INSTRUMENTATION_SCOPE)
        self.now = self.next_sample = t0
        self.directory = directory

    def advance(self, until_ns: int) -> None:
        """Take the samples the sampler's thread would have taken up to ``until_ns``."""
        while self.next_sample <= until_ns:
            self.clock.ns = self.next_sample
            self.state.sample_once()
            self.next_sample += int(INTERVAL_S * S)
        self.clock.ns = until_ns

    def step(self, number: int, seconds: float, **attributes: Any) -> None:
        start, end = self.now, self.now + int(seconds * S)
        self.advance(end)
        span = self.tracer.start_span(sc.SPAN_STEP, start_time=start, attributes={sc.STEP: number, **attributes})
        self.state.on_span_end(span, end)  # type: ignore[arg-type]  # the drain's join, before the span ends
        span.end(end_time=end)
        self.now = end

    def stuck(self, number: int, elapsed_s: float, **attributes: Any) -> None:
        """A stuck alert on a step that began now and has run ``elapsed_s`` (it never ends in the files)."""
        at = self.now + int(elapsed_s * S)
        self.advance(at)
        context = self.state.alert_context()
        span = self.tracer.start_span(sc.SPAN_ALERT, start_time=at, attributes={
            sc.ALERT_KIND: sc.ALERT_KIND_STUCK, sc.ALERT_ELAPSED_S: elapsed_s, sc.ALERT_THRESHOLD_S: elapsed_s / 2,
            sc.ALERT_SPAN_NAME: sc.SPAN_STEP, sc.ALERT_SPAN_ID: f"{self.rank:016x}", sc.STEP: number,
            **attributes, **context})
        span.end(end_time=at)

    def throttle(self, sm_clock_mhz: int = 1410, mask: int = 0x4) -> None:
        """From the next sample on: clocks held down (0x4: NVML's power cap)."""
        self.gpu.sm_clock, self.gpu.mask = sm_clock_mhz, mask

    def write_metrics(self) -> Path:
        """One collection of the drain's GPU metrics (the real SDK and exporter) to ``metrics-r<rank>.drain.jsonl``."""
        path = self.directory / f"metrics-r{self.rank}.drain.jsonl"
        reader = PeriodicExportingMetricReader(OtlpJsonFileMetricExporter(path), export_interval_millis=3_600_000)
        provider = MeterProvider(resource=self.resource, metric_readers=[reader], shutdown_on_exit=False)
        register_metrics(provider.get_meter(sc.INSTRUMENTATION_SCOPE), self.state)
        provider.shutdown()  # the reader's last collection: the one line
        return path


def collective(entered: int, completed: int, op: str = "allreduce", step: int | None = None) -> dict[str, Any]:
    attributes: dict[str, Any] = {sc.COLLECTIVE_GROUP: "0", sc.COLLECTIVE_SEQ: entered,
                                  sc.COLLECTIVE_COMPLETED_SEQ: completed, sc.COLLECTIVE_OP: op}
    if step is not None:
        attributes[sc.COLLECTIVE_STEP] = step
    return attributes
