"""A fake asynchronous accelerator for testing the device timeline on CPU.

One in-order stream, run by a worker thread: the host enqueues "kernels"
(seconds of work, or a gate that holds the stream until the test opens it) and
markers; a marker completes when the work queued before it is done, at the
wall-clock time the worker reaches it. The host can block on the stream the
way CUDA code does: ``synchronize()`` is ``loss.item()``, ``wait_until_behind(n)``
is a pinned-memory copy or a full launch queue letting the host run at most n
markers ahead.

It implements ``otel_training.events.device.Device``.
"""

from __future__ import annotations

import threading
import time
from collections import deque


class Marker:
    __slots__ = ("done_ns", "index")

    def __init__(self, index: int) -> None:
        self.done_ns: int | None = None
        self.index = index


class FakeDevice:
    label = "fake:0"
    name = "Fake asynchronous device"

    def __init__(self) -> None:
        self._queue: deque[object] = deque()
        self._cond = threading.Condition()
        self._markers = 0
        self._completed = 0
        self.capturing = False  # like a CUDA graph capture: record() records nothing
        self.busy_s = 0.0
        self.kernel_s: list[float] = []  # each kernel's measured duration (sleep overshoots under load)
        self._stopped = False
        self._worker = threading.Thread(target=self._run, name="fake-device", daemon=True)
        self._worker.start()

    # -- host side ---------------------------------------------------------------
    def launch(self, seconds: float) -> None:
        """Enqueue a kernel of ``seconds`` of device work; returns at once."""
        self._put(float(seconds))

    def launch_gate(self) -> threading.Event:
        """Enqueue a kernel that runs until the returned event is set (a stalled kernel, a hung collective)."""
        gate = threading.Event()
        self._put(gate)
        return gate

    def record(self) -> Marker | None:
        if self.capturing:
            return None
        with self._cond:
            self._markers += 1
            marker = Marker(self._markers)
        self._put(marker)
        return marker

    def synchronize(self) -> None:
        """Block until everything queued so far has run (``.item()``, ``torch.cuda.synchronize()``)."""
        marker = self._sync_marker()
        with self._cond:
            self._cond.wait_for(lambda: marker.done_ns is not None)

    def wait_until_behind(self, markers: int) -> None:
        """Block until at most ``markers`` markers are still pending (a host that may run that far ahead)."""
        with self._cond:
            self._cond.wait_for(lambda: self._markers - self._completed <= markers)

    def _sync_marker(self) -> Marker:
        with self._cond:
            self._markers += 1
            marker = Marker(self._markers)
        self._put(marker)
        return marker

    def enqueue(self, completes: object) -> None:
        """Enqueue a call the stream makes when it reaches this point: a native marker's completion."""
        self._put(completes)

    # -- resolver side -------------------------------------------------------------
    def completed_ns(self, marker: Marker) -> int | None:
        return marker.done_ns

    def release(self, marker: Marker) -> None:
        pass

    # -- the device ----------------------------------------------------------------
    def _put(self, item: object) -> None:
        with self._cond:
            self._queue.append(item)
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._stopped)
                if self._stopped:
                    return
                item = self._queue[0]
            if isinstance(item, float):
                started = time.perf_counter()
                time.sleep(item)
                self.kernel_s.append(time.perf_counter() - started)
                self.busy_s += self.kernel_s[-1]
            elif isinstance(item, threading.Event):
                item.wait()
            elif callable(item):  # a marker another driver records (tests/test_device_native.py): complete it
                item()
            with self._cond:
                self._queue.popleft()
                if isinstance(item, Marker):
                    item.done_ns = time.time_ns()
                    self._completed += 1
                self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
