"""What the drain asks of the training process: its threads' stacks for an alert, or its exit for a stuck action.

Why: with ``offload=True`` the stuck detector runs in the drain process, but a stuck alert's first question
is "where is it stuck?", and ``stuck_action`` ``exit`` or ``signal`` must act on the training process. So
the training process keeps one thread, the ``Responder``, blocked reading a pipe from the drain: it holds no
GIL and never wakes during healthy steps. The drain's side, ``Requests``, is the detector's
``RemoteProcess`` (``processors/stuck_actions.py``):

- ``stacks``: a request (24 bytes: kind, id, the stuck thread's id); the responder takes every thread's
  stack as the in-process detector would (``_stacks.thread_stacks``) and writes them into the ring as a
  ``STACKS`` record, which the drain's reader hands back (``deliver``). A training process that does not
  answer within ``ANSWER_WAIT_S`` (its training thread holds the GIL in a long C call, or it is frozen)
  delays the alert by that much at most: it goes out then with ``training.alert.stacks.error`` saying why.
- ``exit``: the responder does what the in-process action does (end the open spans, flush within the
  exit budget, ``os._exit`` with the code). One that has not exited by then (the GIL held) is killed with
  SIGKILL, said in the log: the launcher restarts it either way.
- ``signal``: sent by the drain itself; a signal needs no answer.
- ``device``: the UUID of a CUDA device (issue 31), so that the drain's GPU sampler reads the device the steps
  run on, whatever CUDA's and NVML's numbering (docs/gpu-state.md#which-device). Answered only from what
  the process already has: torch imported and CUDA initialised by the training code (``cuda_uuid``); never
  an import or a CUDA initialisation of its own, and never on the training thread.

With ``watchdog=True`` the drain also does the sidecar's work (it watches from another process already): a
training process that does not answer has its stacks read by py-spy, and one that dies without closing its
pipeline gets a ``died`` alert, its open spans ended ERROR and exported (``drain.py``).

The responder ends when the drain does (the pipe's end of file).
"""

from __future__ import annotations

import fcntl
import logging
import marshal
import os
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from otel_training import semconv as sc
from otel_training._contain import contain
from otel_training._stacks import thread_stacks
from otel_training.pipeline.records import STACKS, plain
from otel_training.processors import alert_context
from otel_training.processors.stuck_actions import RemoteStacks

logger = logging.getLogger("otel_training")
#: Kind, then (request id, thread id: 0 when none known), (exit code, 0) or (request id, CUDA ordinal).
_REQUEST = struct.Struct("<QQQ")
_ASK_STACKS, _ASK_EXIT, _ASK_DEVICE = 1, 2, 3
#: How long the drain's GPU sampler (its own thread, not the detector) waits for a device's UUID.
DEVICE_WAIT_S = 0.5
#: How long the drain's detector waits for the stacks (and the alert context: the collective the rank is in, which
#: the hang verdict reads) before it alerts without them. An alert comes at a threshold of seconds to minutes, so
#: half a second more costs nothing; 30 ms did: with three gloo ranks stuck at once on a 2-core machine the answers
#: took 20-40 ms (9 of 9 answered, 6 past 25 ms), and an alert without its context put its rank behind the others.
ANSWER_WAIT_S = 0.5
#: How long the responder waits for room in a full ring for its answer.
_WRITE_WAIT_S = 1.0


class Responder:
    """The training process's side: one daemon thread, blocked on ``fd`` until the drain asks.

    ``write(payload, begin, deadline)``: the ring's writer. ``exit_process(code)``: this process's stuck exit
    (end the open spans, flush, ``os._exit``).
    """

    def __init__(self, fd: int, write: Callable[[bytes, bool | None, float], bool],
                 exit_process: Callable[[int], None]) -> None:
        self._fd = fd
        self._write = write
        self._exit = exit_process
        self.thread = threading.Thread(target=self._answer, name="otel-training-responder", daemon=True)
        self.thread.start()

    def _answer(self) -> None:
        try:
            # Never raise in the training process; the alerts go without stacks.
            with contain("responder", "otel_training: the thread answering the drain's requests stopped; stuck alerts "
                         "go without stacks"):
                while True:
                    request = os.read(self._fd, _REQUEST.size)  # blocks without the GIL; b"": the drain is gone
                    if len(request) != _REQUEST.size:
                        return
                    kind, value, thread_id = _REQUEST.unpack(request)
                    if kind == _ASK_STACKS:
                        stacks = thread_stacks(thread_id or None)
                        # And what this process's alerts carry (the collective the rank is inside): the drain's
                        # detector has no collective tracker of its own.
                        context = plain(dict(alert_context.collect()))
                        self._write(marshal.dumps((STACKS, value, stacks, context)), None,
                                    time.monotonic() + _WRITE_WAIT_S)
                    elif kind == _ASK_EXIT:
                        self._exit(int(value))
                    elif kind == _ASK_DEVICE:
                        uuid = cuda_uuid(thread_id)
                        self._write(marshal.dumps((STACKS, value, "", {sc.HW_ID: uuid} if uuid else {})), None,
                                    time.monotonic() + _WRITE_WAIT_S)
        finally:
            try:
                os.close(self._fd)
            except OSError:
                pass


def cuda_uuid(ordinal: int) -> str | None:
    """The UUID of CUDA device ``ordinal`` as torch knows it (hex, no prefix), or None: only where the training
    code already imported torch and initialised CUDA (never imported or initialised here); not on ROCm, whose
    devices NVML does not see. torch reads a device's properties once and keeps them."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not cuda.is_initialized() or getattr(getattr(torch, "version", None), "hip", None):
            return None
        uuid = getattr(cuda.get_device_properties(ordinal), "uuid", None)  # torch 2.0 and later
        text = str(uuid) if uuid is not None else ""
    except Exception:  # noqa: BLE001 - no answer is the answer: the drain maps the ordinal itself
        return None
    return text if len(text) >= 32 and all(char in "0123456789abcdefABCDEF-" for char in text.removeprefix("GPU-")
                                          .removeprefix("MIG-")) else None


#: Every thread's stack of a process that cannot answer, read from outside it: (stacks, None) or (None, why not).
StacksReader = Callable[[int], "tuple[str | None, str | None]"]


class Requests:
    """The drain's side, the stuck detector's ``RemoteProcess``: asks (bounded), and takes the answers.

    ``pid``: the training process. ``exit_wait_s``: how long an exit may take before SIGKILL.
    """

    def __init__(self, fd: int, pid: int, exit_wait_s: float, wait_s: float = ANSWER_WAIT_S,
                 py_spy: StacksReader | None = None) -> None:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)  # never block a detector
        self._fd = fd
        self._pid = pid
        self._exit_wait_s = exit_wait_s
        self._wait_s = wait_s
        #: ``watchdog=True``: a process that does not answer has its stacks read by py-spy, as the sidecar does
        #: (the assembly hands the watchdog's reader, ``watchdog/monitor.py``).
        self._py_spy = py_spy
        self._lock = threading.Lock()
        self._next = 0
        self._waiting: dict[int, list[object]] = {}

    def stacks(self, thread_id: int | None) -> RemoteStacks:
        """The training process's stacks, the stuck thread's first, and its alert context, within ``wait_s``;
        else py-spy's stacks (with ``watchdog=True``), or none and why (``RemoteProcess.stacks``)."""
        stacks, missing, context = self._ask_for_stacks(thread_id)
        if stacks is not None or self._py_spy is None:
            return RemoteStacks(stacks, None, missing, context)
        stacks, error = self._py_spy(self._pid)  # only for a process that does not answer
        return RemoteStacks(stacks, "py-spy" if stacks is not None else None,
                            None if stacks is not None else f"{missing}; {error}", context)

    def _ask(self, kind: int, value: int, wait_s: float) -> tuple[list[object] | None, OSError | None]:
        """Send a request and wait up to ``wait_s`` for its answer (``deliver``): the answered slot
        ``[stacks, event, context]``, or None when none came in time; the error when it could not be sent."""
        with self._lock:
            self._next += 1
            request_id = self._next
            answered = threading.Event()
            slot: list[object] = [None, answered, None]
            self._waiting[request_id] = slot
        try:
            try:
                os.write(self._fd, _REQUEST.pack(kind, request_id, value))
            except OSError as error:
                return None, error
            return (slot if answered.wait(wait_s) else None), None
        finally:
            with self._lock:
                self._waiting.pop(request_id, None)

    def _ask_for_stacks(self, thread_id: int | None) -> tuple[str | None, str | None, dict[str, Any] | None]:
        slot, error = self._ask(_ASK_STACKS, thread_id or 0, self._wait_s)
        if error is not None:
            return None, f"the training process could not be asked for its stacks ({error.strerror})", None
        if slot is not None:
            return slot[0], None, slot[2]  # type: ignore[return-value]  # deliver() put the stacks str and the context dict there
        return None, (f"the training process did not send its stacks within {self._wait_s * 1000:.0f} ms "
                      "(it may hold the GIL in a long C call; the watchdog's py-spy stacks cover that)"), None

    def device_uuid(self, ordinal: int) -> str | None:
        """The UUID of the training process's CUDA device ``ordinal`` (``cuda_uuid`` there), within
        ``DEVICE_WAIT_S``; None when it does not know it cheaply or does not answer."""
        slot, _ = self._ask(_ASK_DEVICE, max(0, ordinal), DEVICE_WAIT_S)
        uuid = (slot[2] or {}).get(sc.HW_ID) if slot is not None else None  # type: ignore[attr-defined]  # slot[2]: deliver()'s context dict or None
        return uuid if isinstance(uuid, str) else None

    def deliver(self, request_id: int, stacks: str, context: dict[str, Any] | None = None) -> None:
        """A ``STACKS`` record read from the ring (an answer too late for its request is dropped)."""
        with self._lock:
            slot = self._waiting.get(request_id)
        if slot is not None:
            slot[0], slot[2] = stacks, context
            slot[1].set()  # type: ignore[attr-defined]  # slot[1]: the Event _ask() waits on

    def signal(self, signum: int) -> None:
        """``stuck_action="signal"``: the training process gets the signal, as it would from itself."""
        logger.warning("otel_training: sending %s to the training process %d (a stuck span)",
                       signal.Signals(signum).name, self._pid)
        os.kill(self._pid, signum)

    def exit(self, code: int) -> None:
        """``stuck_action="exit"``: the training process ends its spans, flushes and exits with ``code``; one
        still running after ``exit_wait_s`` (the GIL held) is killed."""
        try:
            os.write(self._fd, _REQUEST.pack(_ASK_EXIT, code, 0))
        except OSError:
            pass  # gone already, or not answering: the kill below
        timer = threading.Timer(self._exit_wait_s, self._kill_if_running)
        timer.daemon = True
        timer.start()

    def _kill_if_running(self) -> None:
        if os.getppid() == self._pid:  # the drain's parent: still there
            logger.warning("otel_training: the training process %d did not exit for its stuck action within %.1f s "
                           "(it may hold the GIL); killing it", self._pid, self._exit_wait_s)
            os.kill(self._pid, signal.SIGKILL)

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass
