"""Uncaught exceptions and termination signals: record them, end open spans, flush.

When a rank dies, the spans that were open (the step it died in, its epoch)
are the ones that explain why, and they are exported only when they end. So on
an uncaught exception or a fatal signal every open span is ended with status
ERROR and the exception or signal as an event, the exporter gets a bounded
flush, and then the previous handler runs (or the default action, re-raised),
so the exit status is exactly what it would be without the library.

A Python signal handler runs only when the main thread returns to bytecode; a
rank blocked in C (a collective, a rendezvous, a store wait) would not die of
SIGTERM until that call returned. So for signals whose default action was in
force, the work is done by a watcher thread woken through Python's wakeup fd:
it ends the spans, flushes within ``exit_timeout_s``, restores the default
action at the C level and re-raises, however busy the main thread is. A second
signal during that bounded flush does not restart it, and a forked child (a
DataLoader or Pool worker) drops the hooks: its copies of the parent's open
spans are not its own to end.
"""

from __future__ import annotations

import gc
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import Span
from opentelemetry.trace import Status, StatusCode

from otel_training import semconv as sc
from otel_training._contain import contained
from otel_training.config.telemetry import Telemetry, get_telemetry

FATAL_SIGNALS = tuple(
    getattr(signal, name)
    for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGABRT", "SIGUSR1", "SIGUSR2", "SIGXCPU")
    if hasattr(signal, name)
)
# SIGUSR1/2 are caught only to be recorded if their default action (terminate) is in force.

_installed_excepthook = False
_installed_signals: dict[int, Any] = {}
_previous_excepthook: Callable[..., Any] | None = None
_previous_thread_excepthook: Callable[..., Any] | None = None
_lock = threading.Lock()
_owner_pid = os.getpid()
# Taken by the first thread that starts terminating the process; set when it is done.
_terminating = threading.Lock()
_terminated = threading.Event()
# The thread that took ``_terminating``, and when (time.monotonic()) the process dies at the latest.
_flusher: int | None = None
_exit_deadline = math.inf
# A thread waiting for another's flush gives it this long past the deadline to die of the signal itself.
_DEADLINE_GRACE_S = 0.1


def open_spans(telemetry: Telemetry) -> list[Span]:
    """The pipeline's spans that have begun and not ended, newest first (children before parents).

    Found by walking the garbage collector's objects rather than tracked span by
    span: this runs only when a process is dying, so the training loop pays
    nothing for it (a tracking processor cost ~1.5 µs on every span).
    """
    resource = telemetry.resource
    spans = [obj for obj in gc.get_objects()
             if isinstance(obj, Span) and obj.end_time is None and obj.resource is resource]
    spans.sort(key=lambda span: span.start_time or 0, reverse=True)
    return spans


@contained(default=None)
def end_open_spans(telemetry: Telemetry, event: str, attributes: dict[str, Any], description: str) -> int:
    """End every open span of the pipeline with status ERROR and ``event``; returns how many."""
    spans = open_spans(telemetry)
    for span in spans:
        span.add_event(event, attributes)
        span.set_status(Status(StatusCode.ERROR, description[:512]))
        span.end()
    return len(spans)


def _exception_attributes(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> dict[str, Any]:
    return {
        sc.EXCEPTION_TYPE: exc_type.__qualname__,
        sc.EXCEPTION_MESSAGE: str(exc)[:4096],
        sc.EXCEPTION_STACKTRACE: "".join(traceback.format_exception(exc_type, exc, tb))[-16384:],
        "exception.escaped": True,
    }


def _owned_telemetry() -> Telemetry | None:
    """The live pipeline, if this process is the one the hooks were installed in."""
    telemetry = get_telemetry()
    if telemetry is None or telemetry.is_shut_down or os.getpid() != _owner_pid:
        return None
    return telemetry


def _excepthook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    telemetry = _owned_telemetry()
    if telemetry is not None:
        end_open_spans(telemetry, sc.EVENT_EXCEPTION, _exception_attributes(exc_type, exc, tb),
                       f"{exc_type.__name__}: {exc}")
        if sys.flags.interactive or hasattr(sys, "ps1"):
            # An interactive session goes on after an exception: this is no way out.
            contained()(telemetry.force_flush)(telemetry.options["exit_timeout_s"])
        else:
            contained()(telemetry.exit_flush)()
    (_previous_excepthook or sys.__excepthook__)(exc_type, exc, tb)


def _thread_excepthook(args: threading.ExceptHookArgs) -> None:
    telemetry = _owned_telemetry()
    if telemetry is not None and args.exc_value is not None:
        # The process goes on, and the spans the thread opened in ``with`` blocks
        # have already recorded the exception on the way out; record the death of
        # the thread itself on the process-lifetime span.
        from otel_training.events.runtime import runtime

        attributes = _exception_attributes(args.exc_type, args.exc_value, args.exc_traceback)
        attributes["thread.name"] = args.thread.name if args.thread is not None else ""
        contained()(lambda: runtime().process_span(sc.TARGET_TRAINER).add_event(sc.EVENT_EXCEPTION, attributes))()
    (_previous_thread_excepthook or threading.__excepthook__)(args)


def _stack_of(frame: FrameType | None) -> str:
    return "".join(traceback.format_stack(frame))[-16384:] if frame is not None else ""


def _signal_attributes(signum: int, frame: FrameType | None) -> dict[str, Any]:
    return {sc.SIGNAL_NAME: signal.Signals(signum).name, sc.SIGNAL_NUMBER: signum,
            sc.EXCEPTION_STACKTRACE: _stack_of(frame)}


def _die_of(signum: int) -> None:
    """Restore the default action and re-raise, from any thread."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signum, signal.SIG_DFL)
    else:  # signal.signal() is main-thread only; libc's is not
        import ctypes

        libc_signal = ctypes.CDLL(None).signal
        libc_signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc_signal.restype = ctypes.c_void_p
        libc_signal(signum, None)  # SIG_DFL is 0
    os.kill(os.getpid(), signum)


def _terminate(signum: int, frame: FrameType | None) -> None:
    """The default action, preceded by ending the open spans and a flush bounded by the exit budget."""
    global _flusher, _exit_deadline
    telemetry = _owned_telemetry()
    _exit_deadline = min(_exit_deadline, time.monotonic() + (telemetry.exit_budget_s() if telemetry else 0.0))
    if not _terminating.acquire(blocking=False):
        if _flusher == threading.get_ident():
            # A signal during our own flush, whose handler runs nested inside it:
            # waiting here would hold that flush up past its deadline. Let it finish.
            return
        # Another thread is flushing: wait for it until the deadline rather than
        # start over or return to training.
        _terminated.wait(max(0.0, _exit_deadline - time.monotonic()) + _DEADLINE_GRACE_S)
        _die_of(signum)
        return
    _flusher = threading.get_ident()
    try:
        if telemetry is not None:
            if frame is None:  # on the watcher thread: say where the main thread was
                frame = sys._current_frames().get(threading.main_thread().ident)  # noqa: SLF001
            name = signal.Signals(signum).name
            end_open_spans(telemetry, sc.EVENT_SIGNAL, _signal_attributes(signum, frame), f"terminated by {name}")
            contained()(telemetry.shutdown)(_exit_deadline - time.monotonic())
    finally:
        _terminated.set()
    _die_of(signum)


def _signal_handler(signum: int, frame: FrameType | None) -> None:
    previous = _installed_signals.get(signum, signal.SIG_DFL)
    if os.getpid() != _owner_pid:  # inherited by a fork that kept it: act as if we were not here
        if callable(previous):
            previous(signum, frame)
        else:
            _die_of(signum)
        return
    if callable(previous):
        # Someone else handles it (e.g. torchelastic raising SignalException, or
        # SIGINT's KeyboardInterrupt): record, and let the exception they raise
        # end the spans on its way out.
        telemetry = _owned_telemetry()
        if telemetry is not None:
            attributes = _signal_attributes(signum, frame)
            current = trace_api.get_current_span()
            if current.is_recording():
                contained()(current.add_event)(sc.EVENT_SIGNAL, attributes)
        previous(signum, frame)
        return
    _terminate(signum, frame)


class _SignalWatcher:
    """A thread woken through ``signal.set_wakeup_fd`` that terminates even while the main thread is in C."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)
        try:
            previous = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        except ValueError:
            previous = -2  # not the main thread
        if previous != -1:  # someone (an event loop) owns the wakeup fd: leave it to them
            if previous >= 0:
                signal.set_wakeup_fd(previous)
            self.close()
            raise RuntimeError("the signal wakeup fd is in use")
        self.thread = threading.Thread(target=self._run, name="otel-training-signals", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                data = os.read(self.read_fd, 64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if _installed_signals.get(signum, None) is not signal.SIG_DFL or os.getpid() != _owner_pid:
                    continue
                if signal.getsignal(signum) is not _signal_handler:
                    continue  # the program installed its own handler since: the signal is its to handle
                if time.monotonic() - _last_foreign_fork < _FORK_GRACE_S:
                    # A child forked from another thread inherited the wakeup fd for a moment:
                    # the byte may be its signal. Leave it to the main-thread handler.
                    continue
                _terminate(signum, None)

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass


_watcher: _SignalWatcher | None = None
_last_foreign_fork = -math.inf
_FORK_GRACE_S = 5.0


def install(telemetry: Telemetry) -> None:
    """Install the hooks the options ask for; idempotent; chains to what was there."""
    global _installed_excepthook, _previous_excepthook, _previous_thread_excepthook, _watcher, _owner_pid
    with _lock:
        _owner_pid = os.getpid()
        if telemetry.options["exception_hooks"] and not _installed_excepthook:
            _previous_excepthook = sys.excepthook
            _previous_thread_excepthook = threading.excepthook
            sys.excepthook = _excepthook
            threading.excepthook = _thread_excepthook
            _installed_excepthook = True
        if telemetry.options["signal_hooks"] and threading.current_thread() is threading.main_thread():
            for signum in FATAL_SIGNALS:
                if signum in _installed_signals:
                    continue
                try:
                    previous = signal.getsignal(signum)
                    if previous is signal.SIG_IGN or previous is None:
                        continue  # ignored stays ignored; None: installed from C, leave it alone
                    if signum in (getattr(signal, "SIGUSR1", -1), getattr(signal, "SIGUSR2", -1)) and previous is not signal.SIG_DFL:
                        continue
                    signal.signal(signum, _signal_handler)
                    _installed_signals[signum] = previous
                except (ValueError, OSError):
                    continue
            if _watcher is None and signal.SIG_DFL in _installed_signals.values():
                try:
                    _watcher = _SignalWatcher()
                except (RuntimeError, OSError):
                    _watcher = None  # the main-thread handler still works, once the main thread runs Python


def uninstall() -> None:
    """Restore the handlers that were there before ``install``."""
    global _installed_excepthook, _watcher
    with _lock:
        if _watcher is not None:
            try:
                signal.set_wakeup_fd(-1)
            except ValueError:
                pass
            _watcher.close()
            _watcher = None
        if _installed_excepthook:
            sys.excepthook = _previous_excepthook or sys.__excepthook__
            threading.excepthook = _previous_thread_excepthook or threading.__excepthook__
            _installed_excepthook = False
        for signum, previous in list(_installed_signals.items()):
            try:
                signal.signal(signum, previous)
            except (ValueError, OSError):
                pass
            del _installed_signals[signum]


def _before_fork() -> None:
    """Fork with no wakeup fd, so a signal the child gets before its hooks run cannot wake our watcher."""
    global _last_foreign_fork
    if _watcher is None:
        return
    if threading.current_thread() is threading.main_thread():
        try:
            signal.set_wakeup_fd(-1)
        except ValueError:
            pass
    else:  # only the main thread may change the wakeup fd
        _last_foreign_fork = time.monotonic()


def _after_fork_in_parent() -> None:
    if _watcher is not None and threading.current_thread() is threading.main_thread():
        try:
            signal.set_wakeup_fd(_watcher.write_fd, warn_on_full_buffer=False)
        except ValueError:
            pass


def _after_fork_in_child() -> None:
    """A forked child drops the hooks: the parent's open spans are not its to end."""
    global _watcher, _terminating, _terminated, _flusher, _exit_deadline
    if _watcher is not None:
        try:
            signal.set_wakeup_fd(-1)  # else the child's signals would wake the parent's watcher
        except ValueError:
            pass
        _watcher.close()
        _watcher = None
    _terminating, _terminated, _flusher, _exit_deadline = threading.Lock(), threading.Event(), None, math.inf
    try:
        uninstall()
    except Exception:  # noqa: BLE001 - never break a fork
        pass


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
