"""Finding the device a pipeline's steps run on, once one is in use.

Separate from the timeline itself: the per-step fast path asks ``may_probe()``
(at most once a second, torch imported or not: the steps read the clock inline between probes), and tests or other accelerators
replace detection with ``use_device(factory)``.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from otel_training._contain import log_once
from otel_training.events.device import Device, DeviceTimeline
from otel_training.events.device_native import NativeDevice, NativeDeviceTimeline

if TYPE_CHECKING:
    from otel_training.events.runtime import EventsRuntime

#: A device factory that replaces detection (tests, other accelerators): ``use_device(lambda: MyDevice())``.
_factory: Callable[[], Device | None] | None = None


def use_device(factory: Callable[[], Device | None] | None) -> None:
    """Time steps on the device ``factory()`` returns instead of the detected one (None: detect again).

    Takes effect for pipelines configured afterwards and for a runtime that has not probed yet.
    """
    global _factory
    _factory = factory


#: How often a step asks torch whether CUDA is in use while it is not (a job on the CPU, or steps before the
#: model moves to the GPU): asking costs a few µs of Python on every step otherwise.
PROBE_INTERVAL_S = 1.0


def may_probe(runtime: EventsRuntime) -> bool:
    """False while no device can be in use (torch not imported, no factory) and between two probes that found
    none (at most one a ``PROBE_INTERVAL_S``): the per-step fast path. A factory (``use_device``) is asked on
    every step until it gives a device."""
    if _factory is not None:
        return True
    now = time.monotonic()
    if now < runtime.device_probe_at:
        return False
    runtime.device_probe_at = now + PROBE_INTERVAL_S  # torch or not: the steps' inline clock check skips the call
    return "torch" in sys.modules


def probe(runtime: EventsRuntime) -> DeviceTimeline | NativeDeviceTimeline | None:
    """The runtime's timeline, creating it once a device is in use; None while there is none.

    Cheap while torch is not imported or has not initialised CUDA (a dict lookup and one call),
    so a process that never uses a device pays nothing more per step.
    """
    if not runtime.telemetry.options.get("device_timeline", True):
        runtime.device = False
        return None
    factory = _factory
    if factory is None:
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        if cuda is None or not cuda.is_initialized():
            return None
        events = str(runtime.telemetry.options.get("device_events", "torch"))
        factory = functools.partial(_cuda_device, events)  # where the user's factory would be
    try:
        device = factory()
    except Exception:  # noqa: BLE001 - no device timing rather than no training
        log_once("device-probe", "otel_training: could not set up the device timeline; steps are timed on the host")
        runtime.device = False
        return None
    if device is None:
        return None
    timeline: DeviceTimeline | NativeDeviceTimeline
    # The native resolver's records reach the drain, which makes device spans for the host steps it replays:
    # only for steps recorded by the pipeline's own tracer (not an instrumentor given another provider).
    native = isinstance(device, NativeDevice) and runtime.tracer is runtime.telemetry.tracer
    recorder = runtime.telemetry.device_recorder(device.label, device.name) if native else None
    if recorder is not None:  # offloaded with the C core: no Python thread resolves markers here
        timeline = NativeDeviceTimeline(cast(NativeDevice, device), recorder, runtime)  # a recorder only for a NativeDevice
    else:
        timeline = DeviceTimeline(device, runtime)
    runtime.device = timeline
    return timeline


def _cuda_device(events: str) -> Device | None:
    from otel_training.events.cuda import CudaDevice

    return CudaDevice.current(events)
