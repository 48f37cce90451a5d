"""The signal watcher: a thread woken through Python's wakeup fd, and the helper process behind it.

A Python signal handler runs only when the main thread returns to bytecode; a
rank blocked in C (a collective, a store wait) would not die of SIGTERM until
that call returned. The watcher reads the wakeup fd (or the helper's forwarded
records, with the time each signal arrived) and hands each signal to the hooks'
dispatch, however busy the main thread is.
"""

from __future__ import annotations

import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from otel_training.lifecycle import _signal_helper

#: One forwarded record: a signal number and CLOCK_MONOTONIC nanoseconds.
RECORD = _signal_helper.RECORD_BYTES


class SignalWatcher:
    """A thread woken through ``signal.set_wakeup_fd`` that terminates even while the main thread is in C.

    With the signal helper running, the helper reads the wakeup fd and passes each
    signal on with the time it arrived; without it (it could not start, or died),
    the thread reads the wakeup fd itself. The thread only dispatches: the flush
    runs in a thread of its own, so that the watcher can put the one-shot handler
    back after every further signal and end the process at the deadline.
    """

    def __init__(self, dispatch: Callable[[int, float], None], time_left: Callable[[], float],
                 overran: Callable[[], bool], owned: Callable[[], bool]) -> None:
        """``dispatch(signum, arrived)`` for each signal; ``time_left()`` until the exit deadline (with its
        grace); ``overran()`` ends the process if one is dying past it (True then); ``owned()``: this is
        the process the hooks were installed in (a forked child only lets go)."""
        self._dispatch, self._time_left, self._overran, self._owned = dispatch, time_left, overran, owned
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)
        self.forward_fd = -1
        self.helper: subprocess.Popen[bytes] | None = None
        try:
            previous = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        except ValueError:
            previous = -2  # not the main thread
        if previous != -1:  # someone (an event loop) owns the wakeup fd: leave it to them
            if previous >= 0:
                signal.set_wakeup_fd(previous)
            self.close()
            raise RuntimeError("the signal wakeup fd is in use")
        self._start_helper()
        self.thread = threading.Thread(target=self._run, name="otel-training-signals", daemon=True)
        self.thread.start()

    def _start_helper(self) -> None:
        helper = _signal_helper.__file__
        if not sys.platform.startswith("linux") or not helper or not os.path.isfile(helper):
            return
        if "python" not in os.path.basename(sys.executable or "").lower():
            return  # embedded (uwsgi, say): sys.executable would start something else
        forward_read, forward_write = os.pipe()
        try:
            self.helper = subprocess.Popen(
                [sys.executable, "-I", "-S", helper, str(os.getpid()), str(self.read_fd), str(forward_write)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(self.read_fd, forward_write), start_new_session=True,
            )
        except OSError:
            os.close(forward_read)
            return
        finally:
            os.close(forward_write)
        self.forward_fd = forward_read

    def configure_helper(self, exit_timeout_s: float, signums: list[int]) -> None:
        """Tell the helper the budget and which signals it delivers the default action of."""
        if self.helper is None or self.helper.stdin is None:
            return
        try:
            self.helper.stdin.write(f"{exit_timeout_s!r} {' '.join(str(int(signum)) for signum in signums)}\n".encode())
            self.helper.stdin.flush()
        except (OSError, ValueError):
            pass

    def _run(self) -> None:
        pending = b""
        while True:
            left = self._time_left()
            if left <= 0 and self._overran():  # the flush overran its deadline, or Python got to the signal late
                return
            from_helper = self.forward_fd >= 0
            fd = self.forward_fd if from_helper else self.read_fd
            try:
                if not readable(fd, left):
                    continue
                data = os.read(fd, RECORD * 64)
            except (OSError, ValueError):
                return
            if not data and from_helper:  # the helper is gone: read the wakeup fd ourselves
                os.close(self.forward_fd)
                self.forward_fd = -1
                helper = self.helper
                if helper is not None:
                    helper.poll()  # reaped, not left a zombie
                continue
            if not data:
                return
            if from_helper:  # records of a signal number and CLOCK_MONOTONIC nanoseconds
                pending += data
                whole = len(pending) - len(pending) % RECORD
                records = [(pending[at], int.from_bytes(pending[at + 1:at + RECORD], "little") / 1e9)
                           for at in range(0, whole, RECORD)]
                pending = pending[whole:]
            else:
                records = [(signum, time.monotonic()) for signum in data]
            for signum, arrived in records:
                self._dispatch(signum, arrived)

    def close(self) -> None:
        """Close the pipes and stop the helper (a forked child only lets go of its copies)."""
        helper, self.helper = self.helper, None
        if helper is not None and helper.stdin is not None:
            try:
                helper.stdin.close()  # the helper's cue to exit
            except OSError:
                pass
            if self._owned():
                try:
                    helper.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    helper.kill()
        for fd in (self.read_fd, self.write_fd, self.forward_fd):
            try:
                os.close(fd)
            except OSError:
                pass


def readable(fd: int, timeout_s: float) -> bool:
    """Wait for ``fd`` to be readable (poll, not select: a busy process may be past fd 1024)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout_s == math.inf else max(0, math.ceil(timeout_s * 1000))))

