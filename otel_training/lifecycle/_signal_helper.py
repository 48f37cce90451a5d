"""The signal helper: a fatal signal's default action for a process that cannot run Python.

A process whose main thread is in a C call that holds the GIL runs no Python at
all: not the signal handler, not the watcher thread. Without the library SIGTERM
would kill it at once; with a Python handler installed, it would never die. So
``hooks`` makes its handlers one-shot (``SA_RESETHAND``: the kernel restores the
default action as it delivers the signal), and Python re-installs them when it
takes the signal in hand. This small process, started by ``hooks`` with
``python -I -S`` (standard library only, ~10 MB), reads the signal wakeup fd
that CPython's C-level handler writes to (no GIL needed), passes each signal on
to the watcher thread with the time it arrived, and ``exit_timeout_s`` later, if
the default action is still in force (nothing took the signal in hand), sends
the signal again: the process dies of it, as it would have without the library.

Usage: ``python -I -S _signal_helper.py PID WAKEUP_FD FORWARD_FD``; its standard
input carries lines ``EXIT_TIMEOUT_S SIGNUM...`` (the budget and the signals
handled this way), and its end (or the process's) ends the helper.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

RECORD_BYTES = 9  # the signal number, then CLOCK_MONOTONIC nanoseconds (little-endian)


def default_action_in_force(pid: int, signum: int) -> bool:
    """Neither caught nor ignored by ``pid`` now, from /proc/PID/status."""
    bit = 1 << (signum - 1)
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(("SigIgn:", "SigCgt:")) and int(line.split()[1], 16) & bit:
                return False
    return True


def main(argv: list[str]) -> int:
    pid, wakeup, forward = (int(arg) for arg in argv[1:4])
    signum: int  # a Signals member here; below, the numbers the wakeup fd and the deadlines carry
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                   signal.SIGUSR2, signal.SIGXCPU, signal.SIGPIPE):
        signal.signal(signum, signal.SIG_IGN)  # a signal sent to every process of the job must not end us first
    os.set_blocking(forward, False)
    try:
        process = os.pidfd_open(pid)
    except (AttributeError, OSError):
        process = None  # an old kernel: we are its child, so its death shows as a new parent
    budget_s, watched = 0.0, set()
    deadlines: dict[int, float] = {}
    control = sys.stdin.fileno()
    buffered = b""
    while True:
        now = time.monotonic()
        timeout = min(deadlines.values()) - now if deadlines else None
        if process is None:
            timeout = 1.0 if timeout is None else min(timeout, 1.0)
        poller = select.poll()  # not select(): the fds keep their numbers from a process that may be past 1024
        for fd in (wakeup, control, process):
            if fd is not None:
                poller.register(fd, select.POLLIN)
        readable = {fd for fd, _ in poller.poll(None if timeout is None else max(0, int(timeout * 1000) + 1))}
        if (process in readable) or (process is None and os.getppid() != pid):
            return 0
        if control in readable:
            data = os.read(control, 4096)
            if not data:
                return 0
            buffered += data
            *lines, buffered = buffered.split(b"\n")
            for line in lines:
                budget, *signums = line.split()
                budget_s, watched = float(budget), {int(signum) for signum in signums}
        if wakeup in readable:
            data = os.read(wakeup, 64)  # 64 records of 9 bytes: one write within PIPE_BUF, whole or not at all
            if not data:
                return 0
            arrived = time.monotonic_ns()
            try:
                os.write(forward, b"".join(bytes([signum]) + arrived.to_bytes(8, "little") for signum in data))
            except (BlockingIOError, BrokenPipeError):
                pass  # the watcher cannot read (the GIL is held): what follows still holds
            for signum in data:
                if signum in watched and signum not in deadlines:
                    deadlines[signum] = arrived / 1e9 + budget_s
        now = time.monotonic()
        for signum, deadline in list(deadlines.items()):
            if now >= deadline:
                del deadlines[signum]
                try:
                    in_force = default_action_in_force(pid, signum)
                except OSError:
                    in_force = False  # cannot tell: a signal to a handler that took over would be one too many
                if not in_force:
                    continue
                try:
                    if process is not None:
                        signal.pidfd_send_signal(process, signum)
                    else:
                        os.kill(pid, signum)
                except OSError:
                    return 0  # it is gone


if __name__ == "__main__":
    sys.exit(main(sys.argv))
