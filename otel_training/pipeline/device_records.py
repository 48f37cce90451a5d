"""The training process's end of the device records: a step's CUDA markers, resolved by a native thread.

Why: the device timeline's resolver used to be a Python thread in the training process, polling the oldest
marker every few milliseconds and making the device spans there; every poll took the GIL from the training
thread, whose torch ops release it (issue: the fast path). Offloaded with the C core, the markers go to
``_native.DevicePoller`` instead: its thread queries them without the GIL and writes each completion into
the offload ring as a device record ``(DEVICE, token, which, ns)``; the drain makes the device spans
(``device_steps.py``). Nothing of ours in Python wakes in the training process while steps are healthy.

The token is the host step span's id; ``which`` says begin or end. A marker that cannot be recorded on the
device (a graph being captured, another device current, a full queue) is queued with the host's time, in
order with the others, as the in-process timeline does.
"""

from __future__ import annotations

import marshal
import time
from typing import TYPE_CHECKING, Any

from otel_training._contain import log_once
from otel_training.pipeline.records import DEVICE_INFO, Emit

if TYPE_CHECKING:
    from typing import Protocol

    class DevicePoller(Protocol):
        """``_native.DevicePoller`` (``native/module.c``), as the recorder calls it."""

        def mark(self, token: int, which: int, stream: int, /) -> bool: ...
        def host(self, token: int, which: int, ns: int, /) -> bool: ...
        def capture(self, delta: int, /) -> None: ...
        def stats(self) -> dict[str, int]: ...
        def close(self, timeout_s: float, /) -> tuple[dict[str, int], bool]: ...
        def forget(self) -> None: ...

#: The driver library the resolver calls (loaded by torch already; the resolver never loads it itself).
DRIVER = "libcuda.so.1"
#: How often the resolver queries the oldest marker while one is pending, and looks when none is. Its queries
#: take no GIL; times come from the device's own clock, so this bounds only how late a step is seen.
POLL_US = 1000
IDLE_POLL_US = 5000
#: The resolver's counts (``DevicePoller.stats``, the C core's ``stats_dict``).
STAT_KEYS = ("marked", "resolved", "dropped", "refused", "failed", "pending")


class DeviceRecorder:
    """Markers in; device records out, through the ring, by the C core's thread."""

    def __init__(self, poller: DevicePoller, label: str, name: str, emit: Emit) -> None:
        self._poller = poller
        self.label = label
        self.name = name
        self.closed = False
        self._final: dict[str, int] | None = None
        emit(marshal.dumps((DEVICE_INFO, label, name)), None)

    def mark(self, token: int, which: int, stream: int | None) -> bool:
        """On the training thread: a marker on ``stream`` (None: the host's time stands in). False when the
        resolver took neither (it failed, or its queue is full): the caller times steps on the host from then."""
        poller = self._poller
        return (stream is not None and poller.mark(token, which, stream)) or poller.host(token, which, time.time_ns())

    def capture(self, delta: int) -> None:
        self._poller.capture(delta)

    def stats(self) -> dict[str, int]:
        """The resolver's counts: marked, resolved, dropped (a full ring), refused, failed, pending."""
        return dict(self._final if self._final is not None else self._poller.stats())

    def close(self, timeout_s: float) -> dict[str, int]:
        """Resolve what the device completes within ``timeout_s``, then stop; the final counts."""
        if self.closed:
            return self.stats()
        self.closed = True
        stats, stopped = self._poller.close(timeout_s)
        self._final = dict(stats)
        if not stopped:
            log_once("device-resolver-stuck", "otel_training: the device resolver was inside a CUDA call at "
                     "shutdown (a hung device?); it stops by itself and writes nothing more")
        if stats.get("dropped"):
            log_once("device-records-dropped", "otel_training: %d device record(s) did not fit in the offload ring; "
                     "those steps' device spans are incomplete", stats["dropped"])
        return dict(stats)

    def forget(self) -> None:
        """In a forked child, where the resolver's thread does not exist."""
        self.closed = True
        self._final = dict.fromkeys(STAT_KEYS, 0)
        self._poller.forget()


def start_recorder(extension: Any, core: Any, label: str, name: str, emit: Emit) -> DeviceRecorder | None:
    """A recorder for the CUDA context current on this thread, writing into the ring ``core`` (``_native``'s
    ``RingCore``); None (logged once) when the resolver cannot start: then the Python timeline times the steps,
    as without the C core. The driver must be loaded already (torch loaded it when it initialised CUDA)."""
    try:
        poller = extension.DevicePoller(core, DRIVER, POLL_US, IDLE_POLL_US, only_loaded=True)
    except OSError as error:
        log_once("device-resolver", "otel_training: the native device resolver could not start (%s); steps are "
                 "timed on the device by a Python thread instead", error)
        return None
    return DeviceRecorder(poller, label, name, emit)
