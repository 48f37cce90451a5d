"""The device timeline when the offloaded pipeline resolves markers natively (``pipeline/device_records.py``).

Same contract as ``DeviceTimeline`` for the step spans (``span_kinds.StepDuration``): a step's begin and end
record a marker on the current stream, the host span says ``training.step.device_timed``. What differs is
where the rest happens: no Python thread here; the C core's thread resolves the markers without the GIL and
the drain makes the ``training.device_step`` spans and watches the time between steps (``device_steps.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from otel_training._contain import contain
from otel_training._fork import reset_in_child
from otel_training.events import cuda as _cuda
from otel_training.pipeline.device_records import DeviceRecorder
from otel_training.pipeline.records import DEVICE_BEGIN, DEVICE_END

if TYPE_CHECKING:
    from otel_training.events.runtime import EventsRuntime


@runtime_checkable
class NativeDevice(Protocol):
    """A device whose markers C records: its label and name, and the current stream's driver handle."""

    label: str
    name: str

    def raw_stream(self) -> int | None:
        """None: time this marker on the host (a capture, another device current)."""


class _Step:
    __slots__ = ("token", "awaiting", "begun")

    def __init__(self, awaiting: bool) -> None:
        self.token = 0
        self.awaiting = awaiting
        self.begun = False


class NativeDeviceTimeline:
    """Markers to the native resolver; device spans in the drain."""

    def __init__(self, device: NativeDevice, recorder: DeviceRecorder, runtime: EventsRuntime) -> None:
        self.device = device
        self.recorder = recorder
        self.failed = False
        self._runtime = runtime
        _cuda.capture_listeners.append(recorder.capture)
        reset_in_child(self, NativeDeviceTimeline._forked)
        runtime.telemetry.on_shutdown(self.close)

    def begin_step(self, epoch: Any, awaiting_input: bool = False) -> _Step | None:
        return None if self.failed else _Step(awaiting_input)

    def started(self, step: _Step, host_span: Any) -> None:
        step.token = host_span.get_span_context().span_id
        if not step.awaiting:
            self._mark(step, DEVICE_BEGIN)

    def input_ready(self, step: _Step) -> None:
        if not step.begun and step.token:
            self._mark(step, DEVICE_BEGIN)

    def end_step(self, step: _Step) -> None:
        if not step.token:
            return  # never started (its host span was not recorded)
        if not step.begun:
            self._mark(step, DEVICE_BEGIN)
        self._mark(step, DEVICE_END)

    def _mark(self, step: _Step, which: int) -> None:
        if self.failed:
            return
        step.begun = True
        if not self.recorder.mark(step.token, which, self.device.raw_stream()):
            self.failed = True  # the resolver failed (logged by the drain) or is full: host timing from now on

    def close(self, timeout_s: float | None = None) -> None:
        """Resolve what the device finishes in time (a quarter of ``exit_timeout_s``, as in-process)."""
        if timeout_s is None:
            timeout_s = self._runtime.telemetry.shutdown_share_s(0.25)
        try:
            _cuda.capture_listeners.remove(self.recorder.capture)
        except ValueError:
            pass
        # The native resolver failing at shutdown must not stop the exit.
        with contain("device-native-close", "otel_training: the native device resolver failed at shutdown"):
            self.recorder.close(timeout_s)
        self.failed = True

    def _forked(self) -> None:
        self.failed = True
        self.recorder.forget()


