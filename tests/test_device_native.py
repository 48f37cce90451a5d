"""The native device resolver (``native/device.c``, ``pipeline/device_records.py``, ``pipeline/device_steps.py``)
on CPU: the C core's thread against a fake CUDA driver (``native/tests/fake_cuda.c``, built here), whose
events complete when the fake asynchronous device (tests/fake_device.py) reaches them.

The real driver is exercised by tests/test_device_cuda.py on a GPU (``otel-training run`` offloads there).
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from otlp_json import read_spans
from waiting import wait_until

import otel_training
from otel_training import _native_loader, _ring
from otel_training import semconv as sc
from otel_training.events import device_probe
from otel_training.pipeline import device_records

REPO = Path(__file__).resolve().parent.parent
COMPILER = shutil.which("cc") or shutil.which("gcc")
pytestmark = [
    pytest.mark.skipif(_ring.supported("on") is not None, reason=f"offload unavailable: {_ring.supported('on')}"),
    pytest.mark.skipif(COMPILER is None, reason="no C compiler to build the fake CUDA driver"),
]


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, ctypes.CDLL]:
    """The fake driver, built and loaded (the resolver only opens a driver the process has loaded)."""
    path = tmp_path_factory.mktemp("fake-cuda") / "libfakecuda.so"
    subprocess.run([COMPILER, "-std=c11", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-pthread", "-o",
                    str(path), str(REPO / "native" / "tests" / "fake_cuda.c")], check=True)
    library = ctypes.CDLL(str(path))
    library.fake_count.restype = ctypes.c_uint64
    return str(path), library


@pytest.fixture
def fake_cuda(driver: tuple[str, ctypes.CDLL]) -> Iterator[ctypes.CDLL]:
    library = driver[1]
    library.fake_reset()
    for which in range(3):
        library.fake_set(which, 0)
    yield library
    for which in range(3):
        library.fake_set(which, 0)


class NativeFake:
    """tests/fake_device.py's asynchronous device, whose markers the fake driver records: each time the native
    timeline asks for the current stream (right before C records a marker on it), the device queues that
    marker's completion in its stream order."""

    label = "fake:0"
    name = "Fake asynchronous device"

    def __init__(self, device: Any, library: ctypes.CDLL) -> None:
        self.device = device
        self.library = library
        self.capturing = False
        self.stopped = False  # the test ended: markers still waiting to be recorded never will be

    def raw_stream(self) -> int | None:
        if self.capturing:
            return None
        # The marker C records next gets the driver's next order. Its completion waits on the device until it
        # is recorded: a device idle when this is enqueued (a loaded machine's training thread descheduled
        # between this call and the record) would otherwise complete nothing, and every later marker would
        # complete one step late (CI saw a 2 ms kernel's step last 0.43 ms).
        order = self.library.fake_count(2) + 1

        def complete() -> None:  # a marker never recorded (the test ended first) completes nothing
            if wait_until(lambda: self.stopped or self.library.fake_count(2) >= order, timeout_s=10,
                          interval_s=0.0005) and not self.stopped:
                self.library.fake_complete(1)

        self.device.enqueue(complete)
        return 0

    def launch(self, seconds: float) -> None:
        self.device.launch(seconds)

    def launch_gate(self) -> threading.Event:
        return self.device.launch_gate()


@pytest.fixture
def native_fake(monkeypatch: pytest.MonkeyPatch, driver: tuple[str, ctypes.CDLL],
                fake_cuda: ctypes.CDLL) -> Iterator[NativeFake]:
    from fake_device import FakeDevice

    device = FakeDevice()
    adapter = NativeFake(device, fake_cuda)
    monkeypatch.setattr(device_records, "DRIVER", driver[0])
    monkeypatch.setattr(device_probe, "_factory", lambda: adapter)
    yield adapter
    adapter.stopped = True
    device.stop()


@pytest.fixture
def native_offload(configure: Any) -> Any:
    def make(**options: Any) -> Any:
        telemetry = configure(exporter="file", offload=True, native="on", **options)
        assert telemetry.drain_ready(30), "the drain did not start"
        return telemetry

    return make


def _exported(telemetry: Any) -> list[dict[str, Any]]:
    telemetry.force_flush(timeout_s=30)
    return read_spans(telemetry.trace_path) if telemetry.trace_path.exists() else []


def _our_python_threads() -> list[str]:
    return [thread.name for thread in threading.enumerate() if thread.name == "otel-training-device"]


# -- through the pipeline ------------------------------------------------------------------------------------
def test_steps_are_timed_on_the_device_by_the_native_thread_and_the_drain_makes_their_spans(
        native_offload: Any, native_fake: NativeFake) -> None:
    telemetry = native_offload(stuck_threshold_s=0.3)
    trainer = otel_training.TrainerProcess()
    started = time.time_ns()
    with trainer.epoch(epoch=3):
        for index in range(6):
            with trainer.step(global_step=index, batch_size=8):
                native_fake.launch(0.002)
            if index == 3:  # the host outside any step, the device idle: alerted, by the drain, while it lasts
                assert wait_until(lambda: any(span["name"] == sc.SPAN_ALERT and span["attributes"][
                    sc.ALERT_SPAN_NAME] == sc.SPAN_BETWEEN_STEPS for span in _exported(telemetry)), timeout_s=30)
        assert not _our_python_threads(), "a Python resolver thread runs beside the native one"
    native_fake.device.synchronize()
    telemetry.shutdown(timeout_s=30)
    exported = read_spans(telemetry.trace_path)
    hosts = {span["span_id"]: span for span in exported if span["name"] == sc.SPAN_STEP}
    devices = sorted((span for span in exported if span["name"] == sc.SPAN_DEVICE_STEP),
                     key=lambda span: span["attributes"][sc.STEP])
    assert [span["attributes"][sc.STEP] for span in devices] == list(range(6))
    previous_end = started
    for span in devices:
        host = hosts[span["parent_id"]]
        attributes = span["attributes"]
        assert host["attributes"][sc.STEP_DEVICE_TIMED] is True
        assert attributes[sc.EPOCH] == 3 and attributes[sc.DEVICE] == "fake:0"
        assert attributes[sc.DEVICE_NAME] == "Fake asynchronous device" and attributes[sc.STEP_LAUNCHED] is True
        assert attributes[sc.BATCH_SIZE] == 8
        # On the device's timeline: after its host step began and the previous device step ended, and at
        # least the kernel's 2 ms long.
        assert span["start"] >= max(host["start"], previous_end)
        assert span["end"] - span["start"] >= 1_500_000
        previous_end = span["end"]
    # the gap after step 3 (a loaded machine, or the sanitizer build, may leave the host out of a step past
    # the 0.3 s threshold elsewhere too: those gaps are true as well)
    gaps = [span for span in exported if span["name"] == sc.SPAN_BETWEEN_STEPS]
    assert [gap["attributes"][sc.STEP] for gap in gaps].count(3) == 1, gaps
    stats = telemetry.device_stats()
    assert stats["resolved"] == 12 and stats["dropped"] == 0 and stats["refused"] == 0


def test_a_hung_kernel_is_alerted_for_its_own_step_while_the_host_runs_ahead(native_offload: Any,
                                                                               native_fake: NativeFake) -> None:
    telemetry = native_offload(stuck_threshold_s=0.3)
    trainer = otel_training.TrainerProcess()
    gate = None
    for index in range(5):
        with trainer.step(global_step=index):
            if index == 2:
                gate = native_fake.launch_gate()  # step 2's kernel hangs; the host launches steps 3 and 4
            else:
                native_fake.launch(0.001)

    def stuck() -> list[dict[str, Any]]:
        return [span for span in _exported(telemetry) if span["name"] == sc.SPAN_ALERT
                and span["attributes"][sc.ALERT_KIND] == sc.ALERT_KIND_STUCK]

    assert wait_until(stuck, timeout_s=30)
    (alert,) = stuck()
    assert alert["attributes"][sc.ALERT_SPAN_NAME] == sc.SPAN_DEVICE_STEP and alert["attributes"][sc.STEP] == 2
    assert gate is not None
    gate.set()
    native_fake.device.synchronize()
    assert wait_until(lambda: any(span["attributes"].get(sc.ALERT_KIND) == sc.ALERT_KIND_RECOVERED
                                  for span in _exported(telemetry) if span["name"] == sc.SPAN_ALERT), timeout_s=30)
    telemetry.shutdown(timeout_s=30)
    steps = [span["attributes"][sc.STEP] for span in read_spans(telemetry.trace_path)
             if span["name"] == sc.SPAN_DEVICE_STEP]
    assert sorted(steps) == list(range(5))


def test_a_step_still_running_on_the_device_at_shutdown_is_ended_as_such(native_offload: Any,
                                                                           native_fake: NativeFake) -> None:
    telemetry = native_offload(exit_timeout_s=1.0)
    trainer = otel_training.TrainerProcess()
    with trainer.step(global_step=0):
        native_fake.launch(0.001)
    with trainer.step(global_step=1):
        gate = native_fake.launch_gate()
    started = time.monotonic()
    telemetry.shutdown(timeout_s=5)
    assert time.monotonic() - started < 4.0  # bounded, with the device hung
    gate.set()
    devices = {span["attributes"][sc.STEP]: span for span in read_spans(telemetry.trace_path)
               if span["name"] == sc.SPAN_DEVICE_STEP}
    assert devices[0]["status"].get("code") != 2
    assert devices[1]["status"].get("code") == 2


def test_a_graph_capture_times_its_step_on_the_host_and_stops_the_thread_querying(
        native_offload: Any, native_fake: NativeFake, fake_cuda: ctypes.CDLL) -> None:
    from otel_training.events import cuda

    telemetry = native_offload()
    trainer = otel_training.TrainerProcess()
    with trainer.step(global_step=0):
        native_fake.launch(0.001)
    native_fake.device.synchronize()
    assert wait_until(lambda: telemetry.device_stats()["resolved"] == 2, timeout_s=10)
    for listener in list(cuda.capture_listeners):
        listener(1)  # what the guarded CUDAGraph.capture_begin does
    native_fake.capturing = True
    try:
        queries = fake_cuda.fake_count(0)
        with trainer.step(global_step=1):
            native_fake.launch(0.001)
        time.sleep(0.05)  # the resolver polls every millisecond: none of its polls may query now
        assert fake_cuda.fake_count(0) == queries
    finally:
        native_fake.capturing = False
        for listener in list(cuda.capture_listeners):
            listener(-1)
    telemetry.shutdown(timeout_s=30)
    devices = [span for span in read_spans(telemetry.trace_path) if span["name"] == sc.SPAN_DEVICE_STEP]
    assert sorted(span["attributes"][sc.STEP] for span in devices) == [0, 1]


def test_a_failing_driver_is_reported_once_and_steps_go_on(native_offload: Any, native_fake: NativeFake,
                                                           fake_cuda: ctypes.CDLL,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    telemetry = native_offload()
    trainer = otel_training.TrainerProcess()
    fake_cuda.fake_set(2, 1)  # every query fails from now on
    for index in range(4):
        with trainer.step(global_step=index):
            native_fake.launch(0.001)
    assert wait_until(lambda: telemetry.device_stats()["failed"] == 1, timeout_s=10)
    with trainer.step(global_step=4):
        pass
    result = telemetry.shutdown(timeout_s=30)
    assert result.dropped == 0
    spans = read_spans(telemetry.trace_path)
    hosts = [span for span in spans if span["name"] == sc.SPAN_STEP]
    assert len(hosts) == 5  # training went on, timed on the host
    # The device steps begun before the failure end as failed, never as if they had completed.
    assert all(span["status"].get("code") == 2 for span in spans if span["name"] == sc.SPAN_DEVICE_STEP)


def test_without_the_c_core_the_python_resolver_times_the_steps(configure: Any, native_fake: NativeFake) -> None:
    if _ring.supported("off") is not None:
        pytest.skip(f"offload unavailable: {_ring.supported('off')}")
    telemetry = configure(exporter="file", offload=True, native="off")
    trainer = otel_training.TrainerProcess()
    from fake_device import FakeDevice

    plain = FakeDevice()
    try:
        device_probe.use_device(lambda: plain)
        with trainer.step(global_step=0):
            plain.launch(0.001)
        assert _our_python_threads() == ["otel-training-device"]
    finally:
        device_probe.use_device(None)
        telemetry.shutdown(timeout_s=30)
        plain.stop()
    assert [span["attributes"][sc.STEP] for span in read_spans(telemetry.trace_path)
            if span["name"] == sc.SPAN_DEVICE_STEP] == [0]


# -- the binding itself ----------------------------------------------------------------------------------------
@pytest.fixture
def poller(driver: tuple[str, ctypes.CDLL], fake_cuda: ctypes.CDLL) -> Iterator[tuple[Any, Any]]:
    extension = _native_loader.native("on")
    ring = _ring.Ring.create(1 << 16, "on")
    ring.put(_ring.DRAIN_FIELDS["caps"], _ring.CAP_FAST_RECORDS)
    made = extension.DevicePoller(ring.fast_records(), driver[0], 200, 1000, only_loaded=True)
    yield made, ring
    made.close(0.5)
    ring.close()


def _records(ring: Any, count: int) -> list[tuple[int, ...]]:
    extension = _native_loader.native("on")
    got: list[tuple[int, ...]] = []
    wait_until(lambda: got.extend(extension.decode(payload) for payload in ring.read()) or len(got) >= count,
               timeout_s=10)
    return got


def test_markers_resolve_in_stream_order_host_markers_in_between(poller: tuple[Any, Any],
                                                                 fake_cuda: ctypes.CDLL) -> None:
    made, ring = poller
    assert made.mark(1, 0, 0) and made.mark(1, 1, 0)
    host_ns = time.time_ns()
    assert made.host(2, 0, host_ns) and made.mark(2, 1, 0)
    time.sleep(0.02)
    assert ring.read() == []  # nothing completed: nothing written, the host marker waits its turn
    before = time.time_ns()
    fake_cuda.fake_complete(3)
    records = _records(ring, 4)
    assert [(kind, token, which) for kind, token, which, _ in records] == [(7, 1, 0), (7, 1, 1), (7, 2, 0), (7, 2, 1)]
    assert records[2][3] == host_ns
    assert all(before - 1_000_000 <= records[index][3] <= time.time_ns() for index in (0, 1, 3))


def test_bad_arguments_are_refused_without_a_crash(poller: tuple[Any, Any]) -> None:
    made, _ = poller
    assert made.mark(-1, 0, 0) is False and made.mark(1, 5, 0) is False and made.mark(1, 0, -3) is False
    assert made.mark("1", 0, 0) is False and made.host(1, 0, -5) is False
    with pytest.raises(TypeError):
        made.mark(1, 0)
    with pytest.raises(OSError, match="not loaded"):
        _native_loader.native("on").DevicePoller(made_ring := _ring.Ring.create(1 << 16, "on").fast_records(),
                                                 "/nonexistent/libcuda.so.1", 100, 100)
    del made_ring


def test_close_is_bounded_and_reports_what_never_completed(poller: tuple[Any, Any]) -> None:
    made, _ = poller
    for token in range(1, 4):
        made.mark(token, 0, 0)
    started = time.monotonic()
    stats, stopped = made.close(0.1)
    assert stopped and time.monotonic() - started < 2.0
    assert stats["pending"] == 3 and stats["marked"] == 3
    assert made.mark(9, 0, 0) is False  # closed: the caller times on the host


def test_a_full_queue_refuses_and_counts(poller: tuple[Any, Any]) -> None:
    made, _ = poller
    accepted = sum(made.host(1, 0, 1) for _ in range(9000))
    # The queue holds 8192; the thread resolves host markers as fast as it can, so at least that many went in.
    assert accepted >= 8192
    stats = made.stats()
    assert stats["marked"] == accepted and stats["refused"] == 9000 - accepted
