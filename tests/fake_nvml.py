"""A stand-in of pynvml's API (nvidia-ml-py), for the GPU state's tests: no GPU needed (docs/gpu-state.md).

An object with pynvml's function names and ``NVMLError``, over ``FakeGpu`` devices whose readings a test
sets; handed to the code (``GpuState(nvml, ...)``), never patched into the real module. That real NVML
answers as this does is proven only on a GPU (scripts/gpu-check).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

S = 1_000_000_000
T0 = 1_700_000_000 * S


class NVMLError(Exception):
    """pynvml's error: its return code in ``value``."""

    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeGpu:
    def __init__(self, index: int) -> None:
        self.uuid = f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd"
        self.sm_clock, self.mem_clock, self.power_mw, self.temperature, self.mask = 1980, 2619, 500_000, 61, 0
        self.ecc = [0, 0]
        self.xids: list[int] = []
        self.fail: dict[str, int] = {}  # NVML call -> the error code it answers


class FakeNvml:
    """A stand-in of pynvml's API for the calls the sampler makes, over ``gpus``."""

    NVMLError = NVMLError

    def __init__(self, count: int = 2) -> None:
        self.gpus = [FakeGpu(index) for index in range(count)]
        self.calls = 0

    def _gpu(self, name: str, handle: FakeGpu) -> FakeGpu:
        self.calls += 1
        if name in handle.fail:
            raise NVMLError(handle.fail[name])
        return handle

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        raise NVMLError(6)

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        return handle.uuid

    def nvmlDeviceGetIndex(self, handle: FakeGpu) -> int:
        return self.gpus.index(handle)

    def nvmlDeviceGetName(self, handle: FakeGpu) -> bytes:
        return b"NVIDIA H200"

    def nvmlDeviceGetPciInfo(self, handle: FakeGpu) -> Any:
        return SimpleNamespace(busId=f"00000000:1{self.gpus.index(handle)}:00.0")

    def nvmlSystemGetDriverVersion(self) -> str:
        return "570.124.06"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12080

    def nvmlDeviceGetMaxClockInfo(self, handle: FakeGpu, kind: int) -> int:
        return 1980 if kind == 1 else 3201

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeGpu) -> int:
        return 700_000

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> Any:
        self._gpu("memory", handle)
        return SimpleNamespace(used=40 << 30, total=140 << 30)

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> Any:
        return SimpleNamespace(gpu=97, memory=40)

    def nvmlDeviceGetClockInfo(self, handle: FakeGpu, kind: int) -> int:
        return self._gpu("clock", handle).sm_clock if kind == 1 else handle.mem_clock

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        return self._gpu("power", handle).power_mw

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        return handle.temperature

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeGpu) -> int:
        return handle.mask | 0x1  # idle is no throttle: left out

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeGpu) -> int:
        return handle.mask

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeGpu, kind: int, counter: int) -> int:
        return handle.ecc[kind]

    def nvmlDeviceGetPcieReplayCounter(self, handle: FakeGpu) -> int:
        raise NVMLError(3)  # not supported: asked once

    def nvmlEventSetCreate(self) -> list[FakeGpu]:
        return []

    def nvmlDeviceRegisterEvents(self, handle: FakeGpu, kinds: int, events: list[FakeGpu]) -> None:
        events.append(handle)

    def nvmlEventSetWait_v2(self, events: list[FakeGpu], timeout_ms: int) -> Any:
        for gpu in events:
            if gpu.xids:
                return SimpleNamespace(eventType=0x8, eventData=gpu.xids.pop(0))
        raise NVMLError(10)  # timeout: none pending

    def nvmlEventSetFree(self, events: list[FakeGpu]) -> None:
        events.clear()


class Clock:
    def __init__(self) -> None:
        self.ns = T0

    def __call__(self) -> int:
        return self.ns
