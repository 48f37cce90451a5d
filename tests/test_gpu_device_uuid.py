"""The drain samples the device the steps run on, by its UUID from the training process (issue 31).

With ``CUDA_VISIBLE_DEVICES`` unset, CUDA numbers the GPUs fastest first and NVML by PCI bus: ordinal 1 may
be NVML's index 3. The training process's torch knows its devices' UUIDs once it initialised CUDA; it says
so in the drain's hello when it already had, and answers the drain's sampler (through the responder, not the
training thread) once device steps name the ordinal. Never does it import torch or initialise CUDA for it.
Against the stand-in NVML (``fake_nvml.py``) and a stand-in torch module: no GPU here.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fake_nvml import T0, Clock, FakeNvml
from opentelemetry.sdk.trace import TracerProvider
from test_responder import _answering_pair

from otel_training import _contain
from otel_training import semconv as sc
from otel_training.hardware.gpu_state import MAX_ASKS, GpuState
from otel_training.pipeline.offload import OffloadTelemetry
from otel_training.pipeline.responder import Requests, cuda_uuid

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _fresh_log_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_contain, "_seen", set())


def _torch(initialized: bool, uuids: dict[int, str], calls: list[int] | None = None, hip: str | None = None) -> Any:
    """A stand-in of the torch module as the training code left it: ``get_device_properties(i).uuid``'s str."""
    def properties(ordinal: int) -> Any:
        if calls is not None:
            calls.append(ordinal)
        if not initialized:
            raise AssertionError("would initialise CUDA")
        return SimpleNamespace(uuid=SimpleNamespace(__str__=None) if ordinal not in uuids else _Uuid(uuids[ordinal]))

    return SimpleNamespace(cuda=SimpleNamespace(is_initialized=lambda: initialized, get_device_properties=properties),
                           version=SimpleNamespace(hip=hip))


class _Uuid:
    """torch._C._CUuuid: its str is the hex, without NVML's "GPU-"."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


def _bare(nvml: FakeNvml, index: int) -> str:
    return nvml.gpus[index].uuid.removeprefix("GPU-")


def test_cuda_uuid_answers_only_from_a_cuda_the_training_code_initialised(monkeypatch: pytest.MonkeyPatch) -> None:
    bare = "5fb4a1c2-0000-1111-2222-333344445555"
    calls: list[int] = []
    monkeypatch.setitem(sys.modules, "torch", _torch(False, {1: bare}, calls))
    assert cuda_uuid(1) is None and calls == []  # not initialised: not asked, so never initialised here
    monkeypatch.setitem(sys.modules, "torch", _torch(True, {1: bare}, calls))
    assert cuda_uuid(1) == bare and calls == [1]
    monkeypatch.setitem(sys.modules, "torch", _torch(True, {1: bare}, hip="6.2"))
    assert cuda_uuid(1) is None  # ROCm: NVML does not see its devices
    monkeypatch.setitem(sys.modules, "torch", _torch(True, {}))
    assert cuda_uuid(0) is None  # an answer that is no UUID
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert cuda_uuid(0) is None and "torch" not in sys.modules  # never imported for it


def test_cuda_uuid_with_the_real_torch_on_a_machine_without_cuda_initialises_nothing() -> None:
    """In a process of its own: torch imported by the "training code", CUDA never initialised."""
    code = ("import torch; from otel_training.pipeline.responder import cuda_uuid; "
            "print(cuda_uuid(0), torch.cuda.is_initialized())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["None", "False"]


def test_the_responder_answers_the_drains_question_for_a_device(monkeypatch: pytest.MonkeyPatch) -> None:
    bare = "5fb4a1c2-0000-1111-2222-333344445555"
    monkeypatch.setitem(sys.modules, "torch", _torch(True, {2: bare}))
    requests, responder, written = _answering_pair()
    try:
        assert requests.device_uuid(2) == bare
        assert requests.device_uuid(0) is None  # torch has no UUID for it: no answer but "none"
    finally:
        requests.close()
        responder.thread.join(10)


def test_a_training_process_that_does_not_answer_costs_the_sampler_half_a_second() -> None:
    asked, ask = os.pipe()  # nobody reads it
    requests = Requests(ask, os.getpid(), exit_wait_s=1)
    try:
        assert requests.device_uuid(0) is None
    finally:
        requests.close()
        os.close(asked)


def test_the_sampler_opens_the_device_by_the_uuid_in_the_hello() -> None:
    nvml = FakeNvml(count=4)
    # CUDA's ordinal 0 is NVML's index 2 (fastest first); CUDA_VISIBLE_DEVICES unset.
    state = GpuState(nvml, 0, 1.0, {}, clock_ns=Clock(), uuids={0: _bare(nvml, 2)})
    state.sample_once()
    assert state.device is not None and state.device.uuid == nvml.gpus[2].uuid
    without = GpuState(nvml, 0, 1.0, {}, clock_ns=Clock())
    without.sample_once()
    assert without.device is not None and without.device.uuid == nvml.gpus[0].uuid  # the ordinal, as before


def _device_step(state: GpuState, label: str) -> None:
    span = TracerProvider(shutdown_on_exit=False).get_tracer("t").start_span(
        sc.SPAN_DEVICE_STEP, attributes={sc.DEVICE: label}, start_time=T0)
    state.on_span_end(span, T0 + 1)  # type: ignore[arg-type]


def test_the_sampler_asks_once_device_steps_name_the_ordinal_on_its_own_thread() -> None:
    nvml = FakeNvml(count=4)
    asked: list[int] = []

    def ask(ordinal: int) -> str | None:
        asked.append(ordinal)
        return _bare(nvml, 3) if ordinal == 1 else None

    state = GpuState(nvml, 0, 1.0, {}, clock_ns=Clock(), ask_uuid=ask)
    state.sample_once()
    assert asked == [] and state.device.uuid == nvml.gpus[0].uuid  # type: ignore[union-attr]  # no reason to ask yet
    _device_step(state, "cuda:1")
    assert asked == []  # the drain's thread only notes it: the sampler asks, at its next sample
    state.sample_once()
    assert asked == [1] and state.device.uuid == nvml.gpus[3].uuid  # type: ignore[union-attr]  # not NVML's index 1
    _device_step(state, "cuda:1")
    state.sample_once()
    assert asked == [1]  # known: not asked again


def test_a_question_without_answer_is_asked_a_few_times_then_the_ordinal_is_mapped() -> None:
    nvml = FakeNvml(count=4)
    asked: list[int] = []
    def ask(ordinal: int) -> str | None:
        asked.append(ordinal)  # and no answer: the training process's torch has no CUDA up, or it is busy
        return None

    state = GpuState(nvml, 0, 1.0, {}, clock_ns=Clock(), ask_uuid=ask)
    _device_step(state, "cuda:1")
    for _ in range(MAX_ASKS + 3):
        state.sample_once()
        _device_step(state, "cuda:1")
    assert asked == [1] * MAX_ASKS
    assert state.device.uuid == nvml.gpus[1].uuid  # type: ignore[union-attr]


def test_a_uuid_nvml_does_not_know_falls_back_to_the_ordinal_said_once(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml(count=2)
    state = GpuState(nvml, 1, 1.0, {}, clock_ns=Clock(), uuids={1: "00000000-dead-beef-0000-000000000000"})
    with caplog.at_level(logging.WARNING, logger="otel_training"):
        state.sample_once()
        state.sample_once()
    assert state.device.uuid == nvml.gpus[1].uuid  # type: ignore[union-attr]
    assert len([record for record in caplog.records if "NVML knows no device" in record.getMessage()]) == 1


def test_a_mig_instance_is_found_by_its_mig_uuid() -> None:
    nvml = FakeNvml(count=2)
    nvml.gpus[1].uuid = "MIG-11112222-3333-4444-5555-666677778888"
    state = GpuState(nvml, 0, 1.0, {}, clock_ns=Clock(), uuids={0: "11112222-3333-4444-5555-666677778888"})
    state.sample_once()
    assert state.device.uuid == nvml.gpus[1].uuid  # type: ignore[union-attr]


def test_the_hello_carries_the_uuid_only_where_cuda_is_already_up(monkeypatch: pytest.MonkeyPatch) -> None:
    bare = "5fb4a1c2-0000-1111-2222-333344445555"
    telemetry = SimpleNamespace(options={"gpu_state_interval_s": 1.0},
                                resource=SimpleNamespace(attributes={sc.TRAINING_LOCAL_RANK: 3}))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert OffloadTelemetry._device_uuids(telemetry) == {}  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "torch", _torch(False, {3: bare}))
    assert OffloadTelemetry._device_uuids(telemetry) == {}  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "torch", _torch(True, {3: bare}))
    assert OffloadTelemetry._device_uuids(telemetry) == {3: bare}  # type: ignore[arg-type]
    telemetry.options["gpu_state_interval_s"] = 0.0  # not sampled: nothing asked
    assert OffloadTelemetry._device_uuids(telemetry) == {}  # type: ignore[arg-type]


def test_the_drain_hands_the_hello_and_the_question_to_the_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    from otel_training.assembly.plugins import install_plugins
    from otel_training.config.options import resolve
    from otel_training.hardware import setup
    from otel_training.pipeline.telemetry import Telemetry

    seen: dict[str, Any] = {}

    def started(*args: Any, **kwargs: Any) -> None:
        seen.update(kwargs)
        return None

    monkeypatch.setattr(setup, "start_gpu_state", started)
    options = resolve({"exporter": "none", "metrics": False, "offload": False, "goodput": False}, environ={})
    telemetry = Telemetry(options, environ={})
    remote = SimpleNamespace(device_uuid=lambda ordinal: "x")
    try:
        install_plugins(telemetry, None, spans_of_this_process=False, device_uuids={0: "abc"},
                        ask_device_uuid=remote.device_uuid)
    finally:
        telemetry.shutdown(timeout_s=1.0)
    assert seen["uuids"] == {0: "abc"} and seen["ask_uuid"] is remote.device_uuid
