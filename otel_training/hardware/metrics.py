"""The GPU state as OpenTelemetry metrics: observable instruments read from the latest sample at collection.

Why observable: the sampler takes a sample a second; the metric reader collects every few seconds or
minutes. Reading the latest sample at collection costs nothing between collections, and a sampler that
stopped (NVML hung, the GPU gone) shows as ``training.gpu.sample.time`` no longer moving. Each point
carries the device's attributes (``hw.id`` = the GPU's UUID, ``hw.type`` = gpu, name, PCI bus id, driver
and CUDA versions). Names: semconv's ``hw.gpu.*`` and ``hw.errors`` where they exist, ``training.gpu.*``
else (docs/semantic-conventions.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_training import semconv as sc
from otel_training.hardware.gpu_state import GpuState
from otel_training.hardware.nvml import THROTTLE_REASONS, Sample

Read = Callable[[Sample, GpuState], Any]


def _gauge(meter: Meter, state: GpuState, name: str, unit: str, description: str, read: Read,
           scale: float = 1.0) -> None:
    def observe(options: CallbackOptions) -> Iterable[Observation]:
        sample = state.log.latest
        if sample is None or sample.lost:
            return []
        value = read(sample, state)
        return [] if value is None else [Observation(value * scale, state.device_attributes())]

    meter.create_observable_gauge(name, [observe], unit=unit, description=description)


def register_metrics(meter: Meter, state: GpuState) -> None:
    """The GPU state's instruments on ``meter`` (the drain's), all read from ``state`` at collection."""
    gauges: tuple[tuple[str, str, str, Read, float], ...] = (
        (sc.METRIC_HW_GPU_UTILIZATION, "1", "Fraction of time a kernel ran on the GPU (NVML).",
         lambda s, _: s.utilization, 1.0),
        (sc.METRIC_HW_GPU_MEMORY_USAGE, "By", "GPU memory used.", lambda s, _: s.memory_used, 1.0),
        (sc.METRIC_HW_GPU_MEMORY_LIMIT, "By", "GPU memory in all.", lambda s, _: s.memory_total, 1.0),
        (sc.METRIC_HW_GPU_MEMORY_UTILIZATION, "1", "Fraction of GPU memory used.",
         lambda s, _: s.memory_used / s.memory_total if s.memory_used is not None and s.memory_total else None,
         1.0),
        (sc.METRIC_GPU_SM_CLOCK, "Hz", "SM clock.", lambda s, _: s.sm_clock_mhz, 1e6),
        (sc.METRIC_GPU_SM_CLOCK_MAX, "Hz", "Maximum SM clock.", lambda _, st: _device(st, "sm_clock_max_mhz"), 1e6),
        (sc.METRIC_GPU_MEMORY_CLOCK, "Hz", "Memory clock.", lambda s, _: s.memory_clock_mhz, 1e6),
        (sc.METRIC_GPU_MEMORY_CLOCK_MAX, "Hz", "Maximum memory clock.",
         lambda _, st: _device(st, "memory_clock_max_mhz"), 1e6),
        (sc.METRIC_GPU_POWER, "W", "Power drawn by the GPU.", lambda s, _: s.power_w, 1.0),
        (sc.METRIC_GPU_POWER_LIMIT, "W", "Power limit the driver enforces.",
         lambda _, st: _device(st, "power_limit_w"), 1.0),
        (sc.METRIC_GPU_TEMPERATURE, "Cel", "GPU core temperature.", lambda s, _: s.temperature_c, 1.0),
    )
    for name, unit, description, read, scale in gauges:
        _gauge(meter, state, name, unit, description, read, scale)

    def throttle(options: CallbackOptions) -> Iterable[Observation]:
        sample = state.log.latest
        if sample is None or sample.lost:
            return []
        device = state.device_attributes()
        return [Observation(1 if sample.throttle_mask & bit else 0, {**device, sc.GPU_THROTTLE_REASON: reason})
                for bit, reason in THROTTLE_REASONS]

    def sample_time(options: CallbackOptions) -> Iterable[Observation]:
        sample = state.log.latest
        return [] if sample is None else [Observation(sample.time_ns / 1e9, state.device_attributes())]

    def lost(options: CallbackOptions) -> Iterable[Observation]:
        sample = state.log.latest
        return [] if sample is None else [Observation(1 if state.lost and sample.lost else 0,
                                                      state.device_attributes())]

    def errors(options: CallbackOptions) -> Iterable[Observation]:
        sample = _last_read(state)
        device = state.device_attributes()
        points = [Observation(count, {**device, sc.HW_ERROR_TYPE: sc.GPU_ERROR_XID, sc.GPU_XID: code})
                  for code, count in sorted(state.log.xid_counts.items())]
        if sample is not None:
            for kind, value in ((sc.GPU_ERROR_ECC_CORRECTED, sample.ecc_corrected),
                                (sc.GPU_ERROR_ECC_UNCORRECTED, sample.ecc_uncorrected)):
                if value is not None:
                    points.append(Observation(value, {**device, sc.HW_ERROR_TYPE: kind}))
        return points

    def pcie_replays(options: CallbackOptions) -> Iterable[Observation]:
        sample = _last_read(state)
        if sample is None or sample.pcie_replays is None:
            return []
        return [Observation(sample.pcie_replays, state.device_attributes())]

    meter.create_observable_gauge(sc.METRIC_GPU_THROTTLE, [throttle], unit="",
                                  description="1 while the throttle reason holds the GPU's clocks down, else 0.")
    meter.create_observable_gauge(sc.METRIC_GPU_SAMPLE_TIME, [sample_time], unit="s",
                                  description="Unix time of the latest GPU state sample.")
    meter.create_observable_gauge(sc.METRIC_GPU_LOST, [lost], unit="",
                                  description="1 once NVML said the GPU is lost (fell off the bus), else 0.")
    meter.create_observable_counter(sc.METRIC_HW_ERRORS, [errors], unit="{error}",
                                    description="GPU errors: XID events since sampling began, volatile ECC counts.")
    meter.create_observable_counter(sc.METRIC_GPU_PCIE_REPLAYS, [pcie_replays], unit="{replay}",
                                    description="PCIe replays (NVML's counter).")


def _device(state: GpuState, field: str) -> Any:
    return getattr(state.device, field, None) if state.device is not None else None


def _last_read(state: GpuState) -> Sample | None:
    """The latest sample with readings (a lost GPU's last sample has none; counters keep their last value)."""
    sample = state.log.latest
    return state.log.last_read if sample is not None and sample.lost else sample
