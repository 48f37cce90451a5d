"""Every thread's stack, from the training process to the drain's stuck alerts, at no cost until an alert.

Why: a stuck alert's first question is "where is it stuck?", and with ``offload=True`` the stuck detector
runs in the drain process, whose threads are not the stuck ones. So the training process keeps one thread,
the ``StackResponder``, blocked reading a pipe from the drain: it holds no GIL and never wakes during
healthy steps. On an alert the drain's detector asks (``StackRequests.stacks``: a request id and the stuck
thread's id, 16 bytes), the responder takes the stacks as the in-process detector would
(``_stacks.thread_stacks``) and writes them into the ring as a ``STACKS`` record, which the drain's reader
hands back to the waiting request.

A training process that does not answer within ``ANSWER_WAIT_S`` (its training thread holds the GIL in a
long C call, or it is frozen) does not delay the alert: it goes out on time with
``training.alert.stacks.error`` saying why, and the watchdog sidecar's py-spy stacks cover that case. The
responder ends when the drain does (the pipe's end of file).
"""

from __future__ import annotations

import fcntl
import marshal
import os
import struct
import threading
import time
from collections.abc import Callable

from otel_training._contain import log_once
from otel_training._stacks import thread_stacks
from otel_training.pipeline.records import STACKS

_REQUEST = struct.Struct("<QQ")  # request id, the stuck span's thread id (0: none known)
#: How long the drain's detector waits for the stacks before it alerts without them.
ANSWER_WAIT_S = 0.03
#: How long the responder waits for room in a full ring for its answer.
_WRITE_WAIT_S = 1.0
#: ``(thread_id) -> (stacks, why they are missing)``: the stuck detector's source of stacks.
StacksSource = Callable[["int | None"], "tuple[str | None, str | None]"]


class StackResponder:
    """The training process's side: one daemon thread, blocked on ``fd`` until the drain asks."""

    def __init__(self, fd: int, write: Callable[[bytes, "bool | None", float], bool]) -> None:
        self._fd = fd
        self._write = write
        self.thread = threading.Thread(target=self._answer, name="otel-training-stacks", daemon=True)
        self.thread.start()

    def _answer(self) -> None:
        try:
            while True:
                request = os.read(self._fd, _REQUEST.size)  # blocks without the GIL; b"": the drain is gone
                if len(request) != _REQUEST.size:
                    return
                request_id, thread_id = _REQUEST.unpack(request)
                stacks = thread_stacks(thread_id or None)
                self._write(marshal.dumps((STACKS, request_id, stacks)), None, time.monotonic() + _WRITE_WAIT_S)
        except Exception:  # noqa: BLE001 - never raise in the training process; the alerts go without stacks
            log_once("stack-responder", "otel_training: the thread answering the drain's requests for stacks "
                     "stopped; stuck alerts go without stacks")
        finally:
            try:
                os.close(self._fd)
            except OSError:
                pass


class StackRequests:
    """The drain's side: ``stacks`` asks the training process (bounded); ``deliver`` takes its answers."""

    def __init__(self, fd: int, wait_s: float = ANSWER_WAIT_S) -> None:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)  # never block a detector
        self._fd = fd
        self._wait_s = wait_s
        self._lock = threading.Lock()
        self._next = 0
        self._waiting: dict[int, list[object]] = {}

    def stacks(self, thread_id: int | None) -> tuple[str | None, str | None]:
        """The training process's stacks, the stuck thread's first, or (None, why not) within ``wait_s``."""
        with self._lock:
            self._next += 1
            request_id = self._next
            answered = threading.Event()
            slot: list[object] = [None, answered]
            self._waiting[request_id] = slot
        try:
            try:
                os.write(self._fd, _REQUEST.pack(request_id, thread_id or 0))
            except OSError as error:
                return None, f"the training process could not be asked for its stacks ({error.strerror})"
            if answered.wait(self._wait_s):
                return slot[0], None  # type: ignore[return-value]
            return None, (f"the training process did not send its stacks within {self._wait_s * 1000:.0f} ms "
                          "(it may hold the GIL in a long C call; the watchdog's py-spy stacks cover that)")
        finally:
            with self._lock:
                self._waiting.pop(request_id, None)

    def deliver(self, request_id: int, stacks: str) -> None:
        """A ``STACKS`` record read from the ring (an answer too late for its request is dropped)."""
        with self._lock:
            slot = self._waiting.get(request_id)
        if slot is not None:
            slot[0] = stacks
            slot[1].set()  # type: ignore[attr-defined]

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass
