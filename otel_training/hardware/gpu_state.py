"""The GPU state sampler of one rank's device: NVML read on a thread of the drain process, never of training.

Why in the drain: an NVML call takes tens of microseconds to milliseconds and holds the GIL around its
ctypes call; in the training process that would be time taken from the thread launching kernels. The drain
already holds the rank's spans, so the samples join the steps there (``on_span_end``), and its meter exports
them (``metrics.py``). Every NVML error is contained here: logged once, and the sampler goes on (or, when
NVML says the GPU is lost, says so in the metrics and the steps and stops asking).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.sdk.trace import Span as SDKSpan

from otel_training import semconv as sc
from otel_training._contain import contain, log_once
from otel_training.hardware.nvml import ERROR_GPU_IS_LOST, NvmlDevice, Sample, error_code, reasons, visible_entry
from otel_training.hardware.samples import SampleLog, step_events, step_state
from otel_training.processors.stuck_actions import RemoteProcess, RemoteStacks

logger = logging.getLogger("otel_training")

#: The spans that get the device's state during them.
JOINED = frozenset({sc.SPAN_STEP, sc.SPAN_DEVICE_STEP})
#: What the drain calls as it ends a replayed span, before ``span.end(end_ns)`` (``drain.Replayer.on_end``).
SpanEndHook = Callable[[SDKSpan, int], None]
#: Times the sampler asks the training process for a device's UUID before it maps the ordinal itself.
MAX_ASKS = 3


class GpuState:
    """Samples one device every ``interval_s`` (``start``) and joins them to the steps ending in the drain."""

    def __init__(self, nvml: Any, ordinal: int, interval_s: float, environ: Mapping[str, str], *,
                 clock_ns: Callable[[], int] = time.time_ns, uuids: Mapping[int, str] | None = None,
                 ask_uuid: Callable[[int], str | None] | None = None) -> None:
        self.nvml = nvml
        self.ordinal = ordinal
        #: CUDA ordinal -> the device's UUID as the training process's torch says it (its hello, or asked with
        #: ``ask_uuid`` once its device steps name the ordinal): NVML's device whatever the two numberings.
        self.uuids: dict[int, str] = dict(uuids or {})
        self.ask_uuid = ask_uuid
        self._ask: int | None = None
        self._asked: dict[int, int] = {}
        self._resolved: dict[str, str | None] = {}
        self.interval_s = interval_s
        self.environ = environ
        self.clock_ns = clock_ns
        self.log = SampleLog()
        self.device: NvmlDevice | None = None
        self._opened: int | str | None = None
        self.lost = False
        #: How old the sample in effect at a step's start may be: two intervals (one late sample is no gap).
        self.stale_ns = int(2 * interval_s * 1e9)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- sampling (the sampler's thread) ------------------------------------------------------------------
    def sample_once(self) -> Sample | None:
        """Read the device once and log the sample; None (logged once) when that failed. Never raises."""
        if self.lost:
            return None
        try:
            target = self._target()
            if self.device is None or target != self._opened:
                self._open(target)
            if self.device is None:
                return None
            sample = self.device.read(self.clock_ns())
        except Exception as error:  # noqa: BLE001 - NVML's errors end here, never in training
            if error_code(error) == ERROR_GPU_IS_LOST:
                return self._gone(error)
            log_once("gpu-state-sample", "otel_training: reading the GPU's state through NVML failed (%s); the "
                     "sampler goes on", error, exc_info=False)
            return None
        self.log.add(sample)
        return sample

    def _target(self) -> int | str | None:
        """NVML's device for CUDA ordinal ``ordinal``: by the UUID the training process gave, where it gave one
        NVML knows; else mapped through ``CUDA_VISIBLE_DEVICES`` (docs/gpu-state.md#which-device)."""
        ordinal = self.ordinal
        if self._ask == ordinal and self.ask_uuid is not None and self._asked.get(ordinal, 0) < MAX_ASKS:
            self._asked[ordinal] = self._asked.get(ordinal, 0) + 1
            uuid = self.ask_uuid(ordinal)  # on this thread: bounded (responder.DEVICE_WAIT_S), never the drain's
            if uuid:
                self.uuids[ordinal] = uuid
                self._ask = None
        uuid = self.uuids.get(ordinal)
        if uuid is not None:
            if uuid not in self._resolved:
                self._resolved[uuid] = self._nvml_uuid(uuid)
            if self._resolved[uuid] is not None:
                return self._resolved[uuid]
        return visible_entry(ordinal, self.environ)

    def _nvml_uuid(self, uuid: str) -> str | None:
        """NVML's UUID of the device torch calls ``uuid`` (hex without a prefix: "GPU-" for a GPU, "MIG-" for a
        MIG instance); None, said once, when NVML has no such device."""
        for candidate in [uuid] if uuid.startswith(("GPU-", "MIG-")) else [f"GPU-{uuid}", f"MIG-{uuid}"]:
            try:
                self.nvml.nvmlDeviceGetHandleByUUID(candidate)
            except self.nvml.NVMLError:
                continue
            return candidate
        log_once("gpu-state-uuid", "otel_training: NVML knows no device %s (the training process's CUDA device "
                 "%d); the sampler maps the ordinal through CUDA_VISIBLE_DEVICES instead", uuid, self.ordinal,
                 exc_info=False)
        return None

    def _open(self, target: int | str | None) -> None:
        if target is None:
            log_once("gpu-state-device", "otel_training: CUDA device %d is not visible (CUDA_VISIBLE_DEVICES=%r); "
                     "no GPU state is sampled", self.ordinal, self.environ.get("CUDA_VISIBLE_DEVICES"), exc_info=False)
            self.lost, self.device = True, None  # nothing to sample, ever: the thread stops asking
            return
        if self.device is not None:
            self.device.close()
        self.device, self._opened = None, target
        self.device = NvmlDevice(self.nvml, target)
        logger.info("otel_training: sampling GPU %s (%s) every %.3g s", self.device.uuid,
                    self.device.attributes.get(sc.HW_NAME, "?"), self.interval_s)

    def _gone(self, error: BaseException) -> Sample:
        """NVML says the GPU is lost: one last sample says so; the sampler asks no more."""
        self.lost = True
        logger.error("otel_training: NVML says GPU %s is lost (%s): it fell off the bus or needs a reset",
                     self.device.uuid if self.device is not None else self.ordinal, error)
        sample = Sample(self.clock_ns(), lost=True)
        self.log.add(sample)
        return sample

    def start(self) -> None:
        """Sample on a daemon thread until ``stop``: the first at once, then every ``interval_s``."""
        self._thread = threading.Thread(target=self._run, name="otel-training-gpu-state", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self.lost:
            self.sample_once()
            if self._stop.wait(self.interval_s):
                break

    def stop(self, timeout_s: float = 1.0) -> None:
        """Stop sampling (an NVML call in progress is waited for ``timeout_s`` at most: the thread is a daemon)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self.device is not None and (self._thread is None or not self._thread.is_alive()):
            self.device.close()

    # -- the join (the drain's thread) --------------------------------------------------------------------
    def on_span_end(self, span: SDKSpan, end_ns: int) -> None:
        """A step's device state, as attributes and events, set on ``span`` before it ends. Never raises."""
        name = span.name
        if name not in JOINED:
            return
        # A step without its GPU state beats a span lost.
        with contain("gpu-state-join", "otel_training: joining the GPU state to a step failed; the steps go on "
                     "without it"):
            if name == sc.SPAN_DEVICE_STEP:  # the device the training process times its steps on: "cuda:N"
                self._follow((span.attributes or {}).get(sc.DEVICE))
            start_ns = span.start_time or end_ns
            before, inside = self.log.during(start_ns, end_ns, self.stale_ns)
            attributes = step_state(before, inside)
            if attributes is None:
                return
            span.set_attributes(attributes)
            if inside:
                for name, event_attributes, at_ns in step_events(inside, self.device_attributes()):
                    span.add_event(name, event_attributes, at_ns)

    def _follow(self, label: Any) -> None:
        if isinstance(label, str) and label.startswith("cuda:") and label[5:].isdigit():
            self.ordinal = ordinal = int(label[5:])  # the sampler opens that device at its next sample
            if ordinal not in self.uuids:
                self._ask = ordinal  # CUDA runs there now: the training process's torch knows its UUID

    def device_attributes(self) -> dict[str, Any]:
        device = self.device
        return device.attributes if device is not None else {}

    # -- stuck alerts ---------------------------------------------------------------------------------------
    def alert_context(self) -> dict[str, Any]:
        """The device state at alert time: the latest sample, its age, and the device's id."""
        sample = self.log.latest
        if sample is None:
            return {}
        attributes: dict[str, Any] = {sc.GPU_SAMPLE_AGE_S: max(0.0, (self.clock_ns() - sample.time_ns) / 1e9),
                                      sc.GPU_LOST: sample.lost, sc.GPU_THROTTLED: bool(sample.throttle_mask)}
        hw_id = self.device_attributes().get(sc.HW_ID)
        if hw_id is not None:
            attributes[sc.HW_ID] = hw_id
        if sample.throttle_mask:
            attributes[sc.GPU_THROTTLE_REASONS] = reasons(sample.throttle_mask)
        for key, value in ((sc.GPU_SM_CLOCK_MHZ, sample.sm_clock_mhz), (sc.GPU_POWER_W, sample.power_w),
                           (sc.GPU_TEMPERATURE_C, sample.temperature_c)):
            if value is not None:
                attributes[key] = value
        error = self.log.last_error  # the hang verdict names it when it came near the stuck step's start
        if error is not None:
            attributes[sc.HW_ERROR_TYPE] = error[1]
            attributes[sc.GPU_ERROR_AGE_S] = max(0.0, (self.clock_ns() - error[0]) / 1e9)
            if error[2] is not None:
                attributes[sc.GPU_XID] = error[2]
        return attributes


class RemoteWithGpuState:
    """The training process as the drain's stuck detector asks it, its alert context joined by the device
    state: the detector uses a remote process's context instead of this process's providers."""

    def __init__(self, remote: RemoteProcess, state: GpuState) -> None:
        self._remote = remote
        self._state = state

    def stacks(self, thread_id: int | None) -> RemoteStacks:
        answer = self._remote.stacks(thread_id)
        context: dict[str, Any] | None = None
        # Without it (None), the alert goes out without the GPU's state.
        with contain("gpu-state-alert", "otel_training: the GPU state could not be added to a stuck alert"):
            context = {**self._state.alert_context(), **(answer.context or {})}
        if context is None:
            return answer
        return answer._replace(context=context) if answer.context is not None else answer

    def signal(self, signum: int) -> None:
        self._remote.signal(signum)

    def exit(self, code: int) -> None:
        self._remote.exit(code)

    def __getattr__(self, name: str) -> Any:  # what else the drain's Requests offers (deliver, close)
        return getattr(self._remote, name)
