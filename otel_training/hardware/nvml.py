"""NVML, read for one device: all this package asks of ``pynvml`` (the ``gpu`` extra's nvidia-ml-py).

Why a wrapper: what NVML supports differs by GPU, driver and VM (NOT_SUPPORTED is normal on consumer cards,
under MIG, in some containers), and any call may fail once the GPU has fallen off the bus. Each optional
reading that is not supported is asked once and then left alone; "GPU is lost" is a state of the sample, not
an exception. The ``pynvml`` module is passed in (``load_nvml``), so the tests hand in a stand-in of its API.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from otel_training import semconv as sc

#: NVML's return codes this module tells apart (nvml.h).
ERROR_NOT_SUPPORTED, ERROR_NO_PERMISSION, ERROR_TIMEOUT, ERROR_FUNCTION_NOT_FOUND, ERROR_GPU_IS_LOST = 3, 4, 10, 13, 15
#: What an optional reading may answer when this GPU, driver or VM does not offer it.
UNSUPPORTED = frozenset({ERROR_NOT_SUPPORTED, ERROR_NO_PERMISSION, ERROR_FUNCTION_NOT_FOUND})
#: NVML's clock types, temperature sensor, ECC counter kinds and the XID event type (nvml.h).
CLOCK_SM, CLOCK_MEM = 1, 2
TEMPERATURE_GPU = 0
ECC_CORRECTED, ECC_UNCORRECTED, ECC_VOLATILE = 0, 1, 0
EVENT_XID = 0x8
#: The clock-event ("throttle") reasons that slow the GPU down, by NVML's bit. Idle and application-set
#: clocks are left out: they are no slowdown of the work.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x4, sc.GPU_THROTTLE_POWER_CAP), (0x8, sc.GPU_THROTTLE_HW_SLOWDOWN), (0x10, sc.GPU_THROTTLE_SYNC_BOOST),
    (0x20, sc.GPU_THROTTLE_SW_THERMAL), (0x40, sc.GPU_THROTTLE_HW_THERMAL), (0x80, sc.GPU_THROTTLE_HW_POWER_BRAKE))
THROTTLE_MASK = sum(bit for bit, _ in THROTTLE_REASONS)
#: At most this many XID events are read per sample (a storm of them must not hold the sampler).
MAX_EVENTS_PER_SAMPLE = 32


def reasons(mask: int) -> tuple[str, ...]:
    """The throttle reasons set in NVML's ``mask``, by name."""
    return tuple(name for bit, name in THROTTLE_REASONS if mask & bit)


def error_code(error: BaseException) -> int | None:
    """NVML's return code of ``error`` (pynvml's ``NVMLError.value``)."""
    value = getattr(error, "value", None)
    return value if isinstance(value, int) else None


def load_nvml() -> tuple[Any | None, str]:
    """``pynvml``, initialised, and ""; or None and why not (no extra, no library, no driver: a CPU machine)."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed (pip install 'otel-training[gpu]')"
    try:
        pynvml.nvmlInit()
    except Exception as error:  # noqa: BLE001 - NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return None, f"NVML did not initialise ({error})"
    return pynvml, ""


def visible_entry(ordinal: int, environ: Mapping[str, str]) -> int | str | None:
    """The NVML index, or UUID, of CUDA device ``ordinal`` as a process with ``environ`` numbers its devices.

    ``CUDA_VISIBLE_DEVICES`` lists indices or UUIDs ("GPU-...", "MIG-..."); unset, CUDA's ordinal is NVML's
    index (with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, or identical GPUs: docs/gpu-state.md). None: no such device.
    """
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return ordinal
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    if ordinal >= len(entries):
        return None
    entry = entries[ordinal]
    return int(entry) if entry.isdigit() else entry


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


@dataclasses.dataclass
class Sample:
    """One reading of the device; None where NVML does not offer the value."""

    time_ns: int
    utilization: float | None = None  # the fraction of time a kernel ran
    memory_busy: float | None = None  # the fraction of time memory was read or written
    memory_used: int | None = None
    memory_total: int | None = None
    sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    throttle_mask: int = 0
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    pcie_replays: int | None = None
    xids: tuple[int, ...] = ()
    lost: bool = False
    #: Set when the sample is logged (``samples.SampleLog``): the throttle reasons that were not set in the
    #: previous sample, and the errors counted since it, as (``hw.error.type``, XID code or None).
    began_mask: int = 0
    new_errors: tuple[tuple[str, int | None], ...] = ()


class NvmlDevice:
    """One GPU, opened through ``nvml``: its fixed description, and ``read`` for a sample."""

    def __init__(self, nvml: Any, target: int | str) -> None:
        self.nvml = nvml
        self.handle = self._handle(target)
        self._unsupported: set[str] = set()
        self.uuid = _text(nvml.nvmlDeviceGetUUID(self.handle))
        self.index = (target if isinstance(target, int)
                      else self._optional("index", nvml.nvmlDeviceGetIndex, self.handle))
        name = self._optional("name", nvml.nvmlDeviceGetName, self.handle)
        pci = self._optional("pci", nvml.nvmlDeviceGetPciInfo, self.handle)
        driver = self._optional("driver", nvml.nvmlSystemGetDriverVersion)
        cuda = self._optional("cuda", nvml.nvmlSystemGetCudaDriverVersion)
        #: The device's attributes, on every metric point (``hw.id`` first: semconv requires it).
        self.attributes: dict[str, Any] = {sc.HW_ID: self.uuid, sc.HW_TYPE: sc.HW_TYPE_GPU}
        for key, value in ((sc.HW_NAME, name and _text(name)), (sc.HW_DRIVER_VERSION, driver and _text(driver)),
                           (sc.GPU_PCI_BUS_ID, pci and _text(getattr(pci, "busId", ""))),
                           (sc.GPU_CUDA_DRIVER_VERSION, f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None),
                           (sc.GPU_INDEX, self.index)):
            if value not in (None, ""):
                self.attributes[key] = value
        self.sm_clock_max_mhz = self._optional("sm_max", nvml.nvmlDeviceGetMaxClockInfo, self.handle, CLOCK_SM)
        self.memory_clock_max_mhz = self._optional("mem_max", nvml.nvmlDeviceGetMaxClockInfo, self.handle, CLOCK_MEM)
        limit = self._optional("power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit, self.handle)
        self.power_limit_w = limit / 1000.0 if limit is not None else None
        self._events = self._register_xid_events()

    def _handle(self, target: int | str) -> Any:
        nvml = self.nvml
        if isinstance(target, int):
            return nvml.nvmlDeviceGetHandleByIndex(target)
        try:
            return nvml.nvmlDeviceGetHandleByUUID(target)
        except nvml.NVMLError:  # CUDA takes a UUID's prefix too; NVML only the whole one
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                if _text(nvml.nvmlDeviceGetUUID(handle)).startswith(target):
                    return handle
            raise

    def _optional(self, key: str, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)``, or None from now on where this device does not offer it; other errors raise."""
        if key in self._unsupported:
            return None
        try:
            return call(*args)
        except self.nvml.NVMLError as error:
            if error_code(error) not in UNSUPPORTED:
                raise
        except AttributeError:  # an older pynvml without the call
            pass
        self._unsupported.add(key)
        return None

    def _register_xid_events(self) -> Any:
        nvml = self.nvml
        try:
            events = nvml.nvmlEventSetCreate()
            nvml.nvmlDeviceRegisterEvents(self.handle, EVENT_XID, events)
            return events
        except Exception:  # noqa: BLE001 - not offered here (a VM, no permission): sampled without XIDs
            return None

    def read(self, time_ns: int) -> Sample:
        """A sample of the device at ``time_ns``; raises NVML's error for anything but an unsupported value."""
        nvml, handle, optional = self.nvml, self.handle, self._optional
        sample = Sample(time_ns)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)  # offered everywhere: its failure is the GPU's
        sample.memory_used, sample.memory_total = int(memory.used), int(memory.total)
        rates = optional("utilization", nvml.nvmlDeviceGetUtilizationRates, handle)
        if rates is not None:
            sample.utilization, sample.memory_busy = rates.gpu / 100.0, rates.memory / 100.0
        sample.sm_clock_mhz = optional("sm_clock", nvml.nvmlDeviceGetClockInfo, handle, CLOCK_SM)
        sample.memory_clock_mhz = optional("mem_clock", nvml.nvmlDeviceGetClockInfo, handle, CLOCK_MEM)
        power = optional("power", nvml.nvmlDeviceGetPowerUsage, handle)
        sample.power_w = power / 1000.0 if power is not None else None
        temperature = optional("temperature", nvml.nvmlDeviceGetTemperature, handle, TEMPERATURE_GPU)
        sample.temperature_c = float(temperature) if temperature is not None else None
        reasons_call = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        sample.throttle_mask = int(optional("throttle", reasons_call, handle) or 0) & THROTTLE_MASK
        sample.ecc_corrected = optional("ecc_corrected", nvml.nvmlDeviceGetTotalEccErrors, handle, ECC_CORRECTED,
                                        ECC_VOLATILE)
        sample.ecc_uncorrected = optional("ecc_uncorrected", nvml.nvmlDeviceGetTotalEccErrors, handle,
                                          ECC_UNCORRECTED, ECC_VOLATILE)
        sample.pcie_replays = optional("pcie_replays", nvml.nvmlDeviceGetPcieReplayCounter, handle)
        sample.xids = self._xids()
        return sample

    def _xids(self) -> tuple[int, ...]:
        """The XID codes NVML reported since the last sample (waits for none)."""
        if self._events is None:
            return ()
        nvml, codes = self.nvml, []
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        for _ in range(MAX_EVENTS_PER_SAMPLE):
            try:
                data = wait(self._events, 0)
            except nvml.NVMLError as error:
                if error_code(error) == ERROR_TIMEOUT:
                    break
                raise
            if int(data.eventType) & EVENT_XID:
                codes.append(int(data.eventData))
        return tuple(codes)

    def close(self) -> None:
        if self._events is not None:
            try:
                self.nvml.nvmlEventSetFree(self._events)
            except Exception:  # noqa: BLE001 - the process is ending; NVML frees it with the process
                pass
            self._events = None
