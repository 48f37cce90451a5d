"""The GPU state (issue 31, docs/gpu-state.md) against a stand-in of NVML's API: no GPU needed.

The stand-in is an object with pynvml's names, handed to the code (never the real module, patched). What
it proves: values become the right metrics, samples join the steps (attributes, span events) in the drain's
replayer, stuck alerts carry the state, and NVML missing or failing never reaches training. That real NVML
answers as the stand-in does is proven only on a GPU (scripts/gpu-check, docs/gpu-state.md).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from fake_nvml import T0, Clock, FakeGpu, FakeNvml, S
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_training import _contain
from otel_training import semconv as sc
from otel_training.config.options import resolve
from otel_training.config.parsers import ConfigError
from otel_training.hardware.gpu_state import GpuState, RemoteWithGpuState
from otel_training.hardware.metrics import register_metrics
from otel_training.hardware.nvml import load_nvml, visible_entry
from otel_training.hardware.setup import device_ordinal, start_gpu_state
from otel_training.pipeline.drain import RecordedIds, Replayer
from otel_training.pipeline.record_tracer import RecordTracerProvider
from otel_training.processors import alert_context
from otel_training.processors.stuck_actions import RemoteStacks

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _fresh_log_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_contain, "_seen", set())


def _state(nvml: FakeNvml | None = None, environ: dict[str, str] | None = None,
           ordinal: int = 1) -> tuple[GpuState, FakeNvml, Clock]:
    nvml = nvml or FakeNvml()
    clock = Clock()
    return GpuState(nvml, ordinal, 1.0, environ or {}, clock_ns=clock), nvml, clock


def _points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    points: dict[str, list[Any]] = {}
    for resource_metrics in reader.get_metrics_data().resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                points[metric.name] = list(metric.data.data_points)
    return points


def test_values_become_metrics_with_the_device_attributes() -> None:
    state, nvml, clock = _state()
    reader = InMemoryMetricReader()
    register_metrics(MeterProvider(metric_readers=[reader]).get_meter("t"), state)
    gpu = nvml.gpus[1]
    gpu.mask, gpu.sm_clock, gpu.ecc = 0x4, 1410, [3, 0]
    gpu.xids.append(79)
    assert state.sample_once() is not None
    points = _points(reader)
    value = {name: [point.value for point in data] for name, data in points.items()}
    assert value[sc.METRIC_HW_GPU_UTILIZATION] == [0.97]
    assert value[sc.METRIC_HW_GPU_MEMORY_USAGE] == [40 << 30]
    assert value[sc.METRIC_HW_GPU_MEMORY_LIMIT] == [140 << 30]
    assert value[sc.METRIC_HW_GPU_MEMORY_UTILIZATION] == [pytest.approx(40 / 140)]
    assert value[sc.METRIC_GPU_SM_CLOCK] == [1410e6] and value[sc.METRIC_GPU_SM_CLOCK_MAX] == [1980e6]
    assert value[sc.METRIC_GPU_MEMORY_CLOCK] == [2619e6] and value[sc.METRIC_GPU_MEMORY_CLOCK_MAX] == [3201e6]
    assert value[sc.METRIC_GPU_POWER] == [500.0] and value[sc.METRIC_GPU_POWER_LIMIT] == [700.0]
    assert value[sc.METRIC_GPU_TEMPERATURE] == [61.0]
    assert value[sc.METRIC_GPU_SAMPLE_TIME] == [T0 / 1e9] and value[sc.METRIC_GPU_LOST] == [0]
    assert sc.METRIC_GPU_PCIE_REPLAYS not in points  # not supported by this stand-in: no point, no error
    throttle = {point.attributes[sc.GPU_THROTTLE_REASON]: point.value for point in points[sc.METRIC_GPU_THROTTLE]}
    assert throttle == {"power_cap": 1, "hw_slowdown": 0, "sync_boost": 0, "sw_thermal": 0, "hw_thermal": 0,
                        "hw_power_brake": 0}
    errors = {(point.attributes[sc.HW_ERROR_TYPE], point.attributes.get(sc.GPU_XID)): point.value
              for point in points[sc.METRIC_HW_ERRORS]}
    assert errors == {("xid", 79): 1, ("ecc_corrected", None): 3, ("ecc_uncorrected", None): 0}
    attributes = dict(points[sc.METRIC_GPU_SM_CLOCK][0].attributes)
    assert attributes == {sc.HW_ID: gpu.uuid, sc.HW_TYPE: "gpu", sc.HW_NAME: "NVIDIA H200",
                          sc.HW_DRIVER_VERSION: "570.124.06", sc.GPU_PCI_BUS_ID: "00000000:11:00.0",
                          sc.GPU_CUDA_DRIVER_VERSION: "12.8", sc.GPU_INDEX: 1}


def _replayer() -> tuple[Replayer, InMemorySpanExporter]:
    """The drain's replayer over a real SDK provider (as tests/test_record_check.py builds it)."""
    ids = RecordedIds()
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({}), sampler=ids, id_generator=ids, shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    pipeline = SimpleNamespace(ids=ids, tracer_provider=provider, tracer=provider.get_tracer("otel_training"),
                               force_flush=lambda timeout_s: True, stuck_threshold_s=lambda name: None)
    return Replayer(pipeline, ids), exporter  # type: ignore[arg-type]


def _step_records(start_ns: int, end_ns: int, name: str = sc.SPAN_STEP) -> list[bytes]:
    payloads: list[bytes] = []
    tracer = RecordTracerProvider(lambda payload, begin: payloads.append(payload) or True,
                                  Resource.create({})).get_tracer("otel_training")
    tracer.start_span(name, start_time=start_ns, attributes={sc.STEP: 7}).end(end_ns)
    return payloads


def test_a_step_replayed_in_the_drain_carries_the_device_state_and_events() -> None:
    state, nvml, clock = _state()
    gpu = nvml.gpus[1]
    state.sample_once()  # at T0: free
    clock.ns, gpu.mask, gpu.sm_clock = T0 + S, 0x4 | 0x40, 1410
    gpu.xids.append(48)
    state.sample_once()  # at T0 + 1 s: power cap and thermal began, an XID
    clock.ns, gpu.mask, gpu.sm_clock = T0 + 2 * S, 0, 1980
    state.sample_once()  # at T0 + 2 s, after the step
    replayer, exporter = _replayer()
    replayer.on_end = state.on_span_end
    replayer.apply_all(_step_records(T0 + S // 2, T0 + 3 * S // 2) + _step_records(T0 + 5 * S // 2, T0 + 3 * S,
                                                                                    name="other"))
    spans = {span.name: span for span in exporter.get_finished_spans()}
    step = spans[sc.SPAN_STEP]
    assert step.attributes[sc.GPU_SM_CLOCK_MIN_MHZ] == 1410
    assert step.attributes[sc.GPU_THROTTLED] is True
    assert step.attributes[sc.GPU_THROTTLE_REASONS] == ("power_cap", "hw_thermal")
    events = [(event.name, dict(event.attributes), event.timestamp) for event in step.events]
    assert events == [
        (sc.EVENT_GPU_THROTTLE_BEGAN, {sc.GPU_THROTTLE_REASONS: ("power_cap", "hw_thermal"), sc.HW_ID: gpu.uuid},
         T0 + S),
        (sc.EVENT_GPU_ERROR, {sc.HW_ERROR_TYPE: "xid", sc.GPU_XID: 48, sc.HW_ID: gpu.uuid}, T0 + S)]
    assert sc.GPU_THROTTLED not in (spans["other"].attributes or {})  # only steps are joined


def test_a_free_step_between_samples_takes_the_sample_in_effect_and_no_event() -> None:
    state, nvml, clock = _state()
    state.sample_once()
    replayer, exporter = _replayer()
    replayer.on_end = state.on_span_end
    replayer.apply_all(_step_records(T0 + S // 10, T0 + S // 5))
    (step,) = exporter.get_finished_spans()
    assert step.attributes[sc.GPU_THROTTLED] is False and step.attributes[sc.GPU_SM_CLOCK_MIN_MHZ] == 1980
    assert sc.GPU_THROTTLE_REASONS not in step.attributes and not step.events
    # A sample older than two intervals is no state of the step: nothing is said.
    replayer.apply_all(_step_records(T0 + 5 * S, T0 + 6 * S))
    assert sc.GPU_THROTTLED not in exporter.get_finished_spans()[-1].attributes


def test_ecc_errors_that_grew_during_a_step_are_an_event() -> None:
    state, nvml, clock = _state()
    state.sample_once()
    clock.ns = T0 + S
    nvml.gpus[1].ecc = [0, 2]
    state.sample_once()
    replayer, exporter = _replayer()
    replayer.on_end = state.on_span_end
    replayer.apply_all(_step_records(T0 + S // 2, T0 + 3 * S // 2))
    (step,) = exporter.get_finished_spans()
    assert [(event.name, event.attributes[sc.HW_ERROR_TYPE]) for event in step.events] == [
        (sc.EVENT_GPU_ERROR, "ecc_uncorrected")]


def test_the_join_costs_a_few_microseconds() -> None:
    """The drain's cost per step end (the hook alone, three samples in the step), measured, not assumed."""
    state, nvml, clock = _state()
    for second in range(600):  # a full log: the walk back must not depend on its length
        clock.ns = T0 + second * S
        state.sample_once()
    provider = TracerProvider(shutdown_on_exit=False)
    tracer = provider.get_tracer("t")
    spans = [tracer.start_span(sc.SPAN_STEP, start_time=T0 + 597 * S) for _ in range(2000)]
    began = time.perf_counter()
    for span in spans:
        state.on_span_end(span, T0 + 599 * S)  # type: ignore[arg-type]
    per_span_us = (time.perf_counter() - began) / len(spans) * 1e6
    other = tracer.start_span("training.data_wait", start_time=T0)
    began = time.perf_counter()
    for _ in range(2000):
        state.on_span_end(other, T0 + S)  # type: ignore[arg-type]
    other_us = (time.perf_counter() - began) / 2000 * 1e6
    print(f"gpu-state join: {per_span_us:.2f} us per step span, {other_us:.3f} us per other span")
    assert per_span_us < 50 and other_us < 5  # generous for loaded CI machines; typically ~5 and ~0.1


def test_stuck_alerts_carry_the_state_at_alert_time() -> None:
    state, nvml, clock = _state()
    nvml.gpus[1].mask, nvml.gpus[1].sm_clock = 0x4, 1200
    state.sample_once()
    clock.ns = T0 + 3 * S
    expected = {sc.HW_ID: nvml.gpus[1].uuid, sc.GPU_SM_CLOCK_MHZ: 1200, sc.GPU_POWER_W: 500.0,
                sc.GPU_TEMPERATURE_C: 61.0, sc.GPU_THROTTLED: True, sc.GPU_THROTTLE_REASONS: ("power_cap",),
                sc.GPU_LOST: False, sc.GPU_SAMPLE_AGE_S: 3.0}
    assert state.alert_context() == expected
    remote = SimpleNamespace(stacks=lambda thread_id: RemoteStacks("stacks", None, None, {"training.collective.op": "x"}))
    answer = RemoteWithGpuState(remote, state).stacks(1)  # type: ignore[arg-type]
    assert answer.context == {**expected, "training.collective.op": "x"} and answer.stacks == "stacks"
    silent = SimpleNamespace(stacks=lambda thread_id: RemoteStacks(None, None, "no answer", None))
    assert RemoteWithGpuState(silent, state).stacks(1).context is None  # type: ignore[arg-type]


def test_stuck_alerts_carry_the_latest_gpu_error_and_its_age() -> None:
    """For the hang verdict (docs/gpu-state.md#in-the-verdicts): the XID, its code and how long before the alert."""
    state, nvml, clock = _state()
    state.sample_once()
    assert sc.HW_ERROR_TYPE not in state.alert_context()
    clock.ns = T0 + S
    nvml.gpus[1].ecc = [5, 0]  # corrected: the memory doing its job, no error to name
    state.sample_once()
    assert sc.HW_ERROR_TYPE not in state.alert_context()
    clock.ns = T0 + 2 * S
    nvml.gpus[1].xids.append(79)
    state.sample_once()
    clock.ns = T0 + 5 * S
    state.sample_once()  # a later sample without errors keeps the latest error
    context = state.alert_context()
    assert (context[sc.HW_ERROR_TYPE], context[sc.GPU_XID], context[sc.GPU_ERROR_AGE_S]) == ("xid", 79, 3.0)
    nvml.gpus[1].fail["memory"] = 15  # then the GPU is lost
    clock.ns = T0 + 6 * S
    state.sample_once()
    context = state.alert_context()
    assert context[sc.HW_ERROR_TYPE] == sc.GPU_LOST and sc.GPU_XID not in context and context[sc.GPU_LOST] is True


def test_started_from_options_it_samples_on_its_thread_registers_and_stops() -> None:
    nvml = FakeNvml()
    sampled = threading.Event()
    memory = nvml.nvmlDeviceGetMemoryInfo

    def watched(handle: FakeGpu) -> Any:
        sampled.set()
        return memory(handle)

    nvml.nvmlDeviceGetMemoryInfo = watched  # type: ignore[method-assign]
    callbacks: list[Any] = []
    reader = InMemoryMetricReader()
    state = start_gpu_state({"gpu_state_interval_s": 30.0}, {sc.TRAINING_LOCAL_RANK: 1},
                            MeterProvider(metric_readers=[reader]), callbacks.append, {},
                            nvml_loader=lambda: (nvml, ""))
    assert state is not None
    try:
        assert sampled.wait(10)  # the first sample is taken at once, on the thread
        assert state.ordinal == 1 and callbacks
        assert alert_context.collect()[sc.HW_ID] == nvml.gpus[1].uuid  # the drain's own providers
    finally:
        callbacks[0]()
    assert not state._thread.is_alive()  # type: ignore[union-attr]
    assert sc.HW_ID not in alert_context.collect()


def test_nvml_missing_is_one_log_line_and_nothing_runs(caplog: pytest.LogCaptureFixture,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)  # the extra is not installed
    nvml, why = load_nvml()
    assert nvml is None and "nvidia-ml-py" in why
    with caplog.at_level(logging.INFO, logger="otel_training"):
        assert start_gpu_state({"gpu_state_interval_s": 1.0}, {}, None, lambda callback: None, {}) is None
        assert start_gpu_state({"gpu_state_interval_s": 1.0}, {}, None, lambda callback: None, {},
                               nvml_loader=lambda: (FakeNvml(count=0), "")) is None
        assert start_gpu_state({"gpu_state_interval_s": 0.0}, {}, None, lambda callback: None, {},
                               nvml_loader=lambda: pytest.fail("an interval of 0 loads nothing")) is None
    lines = [record.getMessage() for record in caplog.records]
    assert lines == ["otel_training: GPU state is not sampled: nvidia-ml-py is not installed "
                     "(pip install 'otel-training[gpu]')",
                     "otel_training: GPU state is not sampled: NVML sees no GPU"]


def test_in_process_pipeline_says_it_needs_offload(caplog: pytest.LogCaptureFixture) -> None:
    from otel_training.assembly.plugins import install_plugins
    from otel_training.pipeline.telemetry import Telemetry

    options = resolve({"exporter": "none", "metrics": False, "offload": False, "goodput": False}, environ={})
    telemetry = Telemetry(options, environ={})
    try:
        with caplog.at_level(logging.INFO, logger="otel_training"):
            assert install_plugins(telemetry) is None
    finally:
        telemetry.shutdown(timeout_s=1.0)
    assert [record.getMessage() for record in caplog.records if "GPU state" in record.getMessage()] == [
        "otel_training: GPU state is not sampled: it needs the offloaded pipeline (offload=true), never the "
        "training process"]


def test_nvml_errors_are_contained_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    state, nvml, clock = _state()
    nvml.gpus[1].fail["memory"] = 999  # an unknown error, every time
    with caplog.at_level(logging.WARNING, logger="otel_training"):
        assert state.sample_once() is None and state.sample_once() is None
    assert len([record for record in caplog.records if "NVML failed" in record.getMessage()
                or "reading the GPU's state" in record.getMessage()]) == 1
    del nvml.gpus[1].fail["memory"]
    assert state.sample_once() is not None  # it goes on
    # A join that fails (a broken span) is contained as well.
    state.on_span_end(SimpleNamespace(name=sc.SPAN_STEP, start_time=T0, set_attributes=None), T0 + S)  # type: ignore[arg-type]


def test_a_lost_gpu_is_said_once_and_no_longer_asked(caplog: pytest.LogCaptureFixture) -> None:
    state, nvml, clock = _state()
    reader = InMemoryMetricReader()
    register_metrics(MeterProvider(metric_readers=[reader]).get_meter("t"), state)
    state.sample_once()
    nvml.gpus[1].fail["memory"] = 15  # NVML_ERROR_GPU_IS_LOST
    clock.ns = T0 + S
    with caplog.at_level(logging.ERROR, logger="otel_training"):
        sample = state.sample_once()
    assert sample is not None and sample.lost and state.lost
    assert any("is lost" in record.getMessage() for record in caplog.records)
    calls = nvml.calls
    assert state.sample_once() is None and nvml.calls == calls  # not asked again
    points = _points(reader)
    assert [point.value for point in points[sc.METRIC_GPU_LOST]] == [1]
    assert sc.METRIC_GPU_SM_CLOCK not in points  # no stale readings of a lost device
    assert state.alert_context()[sc.GPU_LOST] is True


def test_the_rank_samples_its_own_device() -> None:
    assert device_ordinal(3, {}) == 3
    assert device_ordinal(None, {"LOCAL_RANK": "2"}) == 2
    assert device_ordinal(5, {"CUDA_VISIBLE_DEVICES": "7"}) == 0  # one device left to the rank
    assert visible_entry(1, {}) == 1
    assert visible_entry(1, {"CUDA_VISIBLE_DEVICES": "4,6"}) == 6
    assert visible_entry(2, {"CUDA_VISIBLE_DEVICES": "4,6"}) is None
    nvml = FakeNvml(count=4)
    uuid_prefix = nvml.gpus[3].uuid[:12]
    state, _, _ = _state(nvml, {"CUDA_VISIBLE_DEVICES": f"2,{uuid_prefix}"})
    state.sample_once()
    assert state.device is not None and state.device.uuid == nvml.gpus[3].uuid  # by UUID prefix, as CUDA
    # The training process times its steps on cuda:0: the sampler follows it at its next sample.
    provider = TracerProvider(shutdown_on_exit=False)
    span = provider.get_tracer("t").start_span(sc.SPAN_DEVICE_STEP, attributes={sc.DEVICE: "cuda:0"}, start_time=T0)
    state.on_span_end(span, T0 + 1)  # type: ignore[arg-type]
    state.sample_once()
    assert state.device.uuid == nvml.gpus[2].uuid


@pytest.mark.parametrize("value, expected", [(None, 1.0), (0, 0.0), ("2.5", 2.5), (0.1, 0.1)])
def test_the_interval_option(value: Any, expected: float) -> None:
    arguments = {} if value is None else {"gpu_state_interval_s": value}
    assert resolve(arguments, environ={})["gpu_state_interval_s"] == expected


@pytest.mark.parametrize("value", [0.05, -1, "fast", True, 10 ** 9])
def test_the_interval_option_refuses(value: Any) -> None:
    with pytest.raises(ConfigError, match="gpu_state_interval_s"):
        resolve({"gpu_state_interval_s": value}, environ={})


def test_a_gpu_alert_under_a_hang_verdict_for_the_same_rank_is_one_page() -> None:
    config = yaml.safe_load((REPO / "collector-config" / "alertmanager.yml").read_text())
    rules = [rule for rule in config["inhibit_rules"]
             if any("TrainingGpu" in matcher for matcher in rule["target_matchers"])]
    assert len(rules) == 1
    (rule,) = rules
    assert any("TrainingHangCulprit" in matcher for matcher in rule["source_matchers"])
    assert set(rule["equal"]) == {"training_job_id", "training_rank"}
    alerts = yaml.safe_load((REPO / "collector-config" / "alert-rules.yml").read_text())
    gpu_alerts = {rule["alert"] for group in alerts["groups"] for rule in group["rules"]
                  if rule.get("alert", "").startswith("TrainingGpu")}
    assert gpu_alerts == {"TrainingGpuXidError", "TrainingGpuEccErrors", "TrainingGpuThrottled", "TrainingGpuLost"}
    amtool = shutil.which("amtool")
    if amtool is None:
        pytest.skip("amtool not installed")
    proc = subprocess.run([amtool, "check-config", "alertmanager.yml"], cwd=REPO / "collector-config",
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr

