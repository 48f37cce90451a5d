"""``events.cuda.CudaDevice``'s own logic on CPU, against a stand-in for ``torch.cuda``.

The real-GPU checks are in test_device_cuda.py (skipped without CUDA). These pin what can be
checked without one: device-clock timestamps mapped to the wall clock within the anchor's
bracket, an anchor stream that is busy (shared from torch's pool) neither blocking nor skewing,
negative ``elapsed_time`` for markers that completed before the anchor, and the graph-capture
guard: nothing recorded or queried during a capture, whichever way the capture ends.
"""

from __future__ import annotations

import time

import pytest
from waiting import first_value

from otel_training.events import cuda as cuda_module
from otel_training.events.cuda import CudaDevice

#: The stand-in device's clock runs this far from the wall clock (ns).
OFFSET_NS = 123_456_789_000


class Stream:
    def __init__(self, device: int = 0, busy_until_ns: int = 0) -> None:
        self.device_index = device
        self.busy_until_ns = busy_until_ns  # a shared pool stream, busy with a collective until then


class Event:
    def __init__(self, enable_timing: bool = False) -> None:
        self.device_ns: int | None = None
        self.queries = 0

    def record(self, stream: Stream) -> None:
        assert not FakeCuda.active.capturing, "recorded during a capture"
        now = time.time_ns() + OFFSET_NS
        self.device_ns = max(now, stream.busy_until_ns + OFFSET_NS)

    def query(self) -> bool:
        assert FakeCuda.active.captures == 0, "queried during a capture"
        self.queries += 1
        return self.device_ns is not None and time.time_ns() + OFFSET_NS >= self.device_ns

    def elapsed_time(self, other: Event) -> float:
        assert self.query() and other.query()
        return (other.device_ns - self.device_ns) / 1e6  # type: ignore[operator]


class GenericEvent(Event):
    """``torch.Event``: the device is named, and ``record()`` without a stream uses the current one."""

    def __init__(self, device: str, enable_timing: bool = False) -> None:
        assert device == "cuda:0"
        super().__init__(enable_timing)

    def record(self, stream: Stream | None = None) -> None:
        super().record(FakeCuda.active.stream if stream is None else stream)


def GenericStream(device: str) -> Stream:
    assert device == "cuda:0"
    return Stream(0, FakeCuda.active.side_busy_until_ns)


class CUDAGraph:
    def capture_begin(self, *args, **kwargs) -> None:
        FakeCuda.active.captures += 1

    def capture_end_pre(self) -> None:
        FakeCuda.active.captures -= 1

    def capture_end(self) -> None:
        self.capture_end_pre()  # as torch's does


class FakeCuda:
    active: FakeCuda

    def __init__(self) -> None:
        FakeCuda.active = self
        self.stream = Stream()
        self.capturing = False
        self.captures = 0
        self.side_busy_until_ns = 0
        self.Event = Event
        self.graphs = type("graphs", (), {"CUDAGraph": type("CUDAGraph", (CUDAGraph,), {})})

    def Stream(self, device: int = 0) -> Stream:
        return Stream(device, self.side_busy_until_ns)

    def current_device(self) -> int:
        return 0

    def get_device_name(self, index: int) -> str:
        return "Stand-in GPU"

    def current_stream(self) -> Stream:
        return self.stream

    def is_current_stream_capturing(self) -> bool:
        return self.capturing


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    monkeypatch.setattr(cuda_module, "_captures", [0])
    monkeypatch.setattr(cuda_module, "_CAPTURING", set())
    return FakeCuda()


@pytest.fixture(params=["torch", "torch.cuda"])
def make(request: pytest.FixtureRequest, cuda: FakeCuda):
    """A CudaDevice on the stand-in, recording with ``torch.Event`` or with ``torch.cuda.Event``."""

    def make_device() -> CudaDevice:
        device = CudaDevice(cuda, events=request.param, generic=(GenericEvent, GenericStream))
        assert device.events == request.param
        return device

    return make_device


def resolve(device: CudaDevice, marker) -> int:
    # Polled without a pause: a marker's own poll bracket is its timestamp until an anchor exists.
    return first_value(lambda: device.completed_ns(marker), timeout_s=5.0, interval_s=0)


def test_device_time_maps_to_the_wall_clock(make) -> None:
    device = make()
    before = time.time_ns()
    marker = device.record()
    after = time.time_ns()
    done = resolve(device, marker)
    # The marker completed (on the device clock) between the two reads; mapped back to wall time.
    assert before - 300_000 <= done <= after + 300_000
    assert device.label == "cuda:0" and device.name == "Stand-in GPU"


def test_a_marker_completed_before_the_anchor_gets_a_negative_offset(make) -> None:
    device = make()
    early = device.record()
    recorded = time.time_ns()
    time.sleep(0.01)  # the anchor is taken later than the marker completed
    done = resolve(device, early)
    assert abs(done - recorded) < 1_000_000


@pytest.mark.realtime
def test_a_busy_anchor_stream_neither_blocks_nor_skews(cuda: FakeCuda, make) -> None:
    cuda.side_busy_until_ns = time.time_ns() + 3_600_000_000_000  # a collective that never ends
    device = make()
    marker = device.record()
    recorded = time.time_ns()
    started = time.monotonic()
    done = resolve(device, marker)
    assert time.monotonic() - started < 0.5  # one bounded 2 ms sample, no synchronize
    # No good anchor: the marker's own poll bracket stands in, close to the truth.
    assert abs(done - recorded) < 5_000_000
    later = device.record()
    recorded = time.time_ns()
    assert abs(resolve(device, later) - recorded) < 5_000_000


def test_nothing_recorded_or_queried_during_a_capture_however_it_ends(cuda: FakeCuda, make) -> None:
    device = make()
    graph_class = cuda.graphs.CUDAGraph
    pending = device.record()
    queries = pending.queries

    graph = graph_class()
    graph.capture_begin()
    assert device.record() is None
    assert device.completed_ns(pending) is None and pending.queries == queries
    graph.capture_end()  # calls capture_end_pre inside: counted once
    assert cuda_module._captures[0] == 0
    assert resolve(device, pending) > 0

    failed = graph_class()
    failed.capture_begin()
    failed.capture_end_pre()  # torch.cuda.graph's failure path ends the capture this way alone
    assert cuda_module._captures[0] == 0
    assert device.record() is not None

    cuda.capturing = True  # a capture begun without a CUDAGraph (the current stream says so)
    assert device.record() is None


def test_another_current_device_is_timed_on_the_host(cuda: FakeCuda, make, monkeypatch: pytest.MonkeyPatch) -> None:
    device = make()
    monkeypatch.setattr(cuda, "current_device", lambda: 1)
    monkeypatch.setattr(cuda.stream, "device_index", 1)
    assert device.record() is None


def test_markers_come_from_the_pool(make) -> None:
    device = make()
    first = device.record()
    resolve(device, first)
    second = device.record()
    resolve(device, second)
    device.release(second)  # (the first may be the clock's anchor, which is never reused)
    assert device.record() is second


def test_the_event_api_is_torch_event_where_torch_has_it(cuda: FakeCuda) -> None:
    generic = (GenericEvent, GenericStream)
    assert CudaDevice(cuda, generic=generic).events == "torch"
    assert CudaDevice(cuda, generic=(None, None)).events == "torch.cuda"  # a torch without torch.Event
    assert CudaDevice(cuda, "torch.cuda", generic=generic).events == "torch.cuda"  # the device_events option
    with pytest.raises(ValueError, match="device_events='cupy'"):
        CudaDevice(cuda, "cupy", generic=generic)


def test_a_bad_device_events_option_is_refused_before_training() -> None:
    from otel_training.config.options import ConfigError, resolve

    with pytest.raises(ConfigError, match="OTEL_TRAINING_DEVICE_EVENTS.*'cupy'.*device_events"):
        resolve({}, environ={"OTEL_TRAINING_DEVICE_EVENTS": "cupy"})
