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

A main thread in a C call that holds the GIL runs no Python at all, the watcher
included. For that case those handlers are one-shot (the kernel restores the
default action as it delivers the signal; Python re-installs them when it takes
the signal in hand), and a helper process (``_signal_helper``) that reads the
wakeup fd sends the signal again ``exit_timeout_s`` after it arrived if no Python
took it in hand by then: the process dies of it within the budget, with the exit
status it would have without the library.
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
import weakref
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import Span
from opentelemetry.trace import Status, StatusCode

from otel_training import semconv as sc
from otel_training._contain import call_contained, contained
from otel_training._fork import at_fork
from otel_training._stacks import bounded, frame_stack, main_thread_frame
from otel_training._text import text
from otel_training.lifecycle import oneshot
from otel_training.lifecycle.watcher import SignalWatcher

if TYPE_CHECKING:  # the pipeline installs the hooks and imports this module, never the other way round
    from otel_training.pipeline.record_span import RecordSpan
    from otel_training.pipeline.telemetry import Telemetry

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
# The pipeline the hooks were last installed for, held weakly: a pipeline shut down and dropped is freed.
_installed_for: weakref.ref[Telemetry] | None = None
# Taken by the first thread that starts terminating the process; set when it is done.
_terminating = threading.Lock()
_terminated = threading.Event()
# The thread that took ``_terminating``, and when (time.monotonic()) the process dies at the latest.
_flusher: int | None = None
_exit_deadline = math.inf
# A thread waiting for another's flush gives it this long past the deadline to die of the signal itself.
_DEADLINE_GRACE_S = 0.1
# The signal the process is dying of, once one is; no handler is put back after that.
_dying_of: int | None = None
_dying = False


def open_spans(telemetry: Telemetry) -> list[Span | RecordSpan]:
    """The pipeline's spans that have begun and not ended, newest first (children before parents).

    Found by walking the garbage collector's objects rather than tracked span by span: this runs only when a
    process is dying, so the training loop pays nothing for it (a tracking processor cost ~1.5 µs on every span).
    """
    from otel_training.pipeline.record_span import RecordSpan  # an offloading pipeline's spans

    resource = telemetry.resource
    # type(), not isinstance(): that reads each object's __class__, which some objects warn on (torch's reduce_op)
    spans = [obj for obj in gc.get_objects()
             if issubclass(type(obj), (Span, RecordSpan)) and obj.end_time is None and obj.resource is resource]
    spans.sort(key=lambda span: span.start_time or 0, reverse=True)
    return spans


@contained(default=None)
def end_open_spans(telemetry: Telemetry, event: str, attributes: dict[str, Any], description: str) -> int:
    """End every open span of the pipeline with status ERROR and ``event`` (``on_failure`` first); returns how many."""
    telemetry.failing()
    spans = open_spans(telemetry)
    for span in spans:
        span.add_event(event, attributes)
        span.set_status(Status(StatusCode.ERROR, description[:512]))
        span.end()
    return len(spans)


def _exception_attributes(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> dict[str, Any]:
    """Text the exporters can encode, whatever the exception's ``__str__`` does (raises, lone surrogates)."""
    try:
        stack = "".join(traceback.format_exception(exc_type, exc, tb))
    except Exception:  # noqa: BLE001 - format_exception calls str(exc)
        stack = "".join(traceback.format_tb(tb)) + f"{exc_type.__qualname__}: <unprintable>"
    return {
        sc.EXCEPTION_TYPE: text(exc_type.__qualname__),
        sc.EXCEPTION_MESSAGE: text(exc)[:4096],
        sc.EXCEPTION_STACKTRACE: bounded(text(stack), keep_end=True),
        "exception.escaped": True,
    }


def _owned_telemetry() -> Telemetry | None:
    """The live pipeline, if this process is the one the hooks were installed in."""
    telemetry = _installed_for() if _installed_for is not None else None
    if telemetry is None or telemetry.is_shut_down or os.getpid() != _owner_pid:
        return None
    return telemetry


def _excepthook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    telemetry = _owned_telemetry()
    if telemetry is not None:
        end_open_spans(telemetry, sc.EVENT_EXCEPTION, _exception_attributes(exc_type, exc, tb),
                       f"{exc_type.__name__}: {text(exc)}")
        if sys.flags.interactive or hasattr(sys, "ps1"):
            # An interactive session goes on after an exception: this is no way out.
            call_contained(telemetry.force_flush, telemetry.options["exit_timeout_s"])
        else:
            call_contained(telemetry.exit_flush)
    (_previous_excepthook or sys.__excepthook__)(exc_type, exc, tb)


def _thread_excepthook(args: threading.ExceptHookArgs) -> None:
    telemetry = _owned_telemetry()
    if telemetry is not None and args.exc_value is not None:
        # The process goes on, and the spans the thread opened in ``with`` blocks
        # have already recorded the exception on the way out; record the death of
        # the thread itself on the process-lifetime span.
        # (Only once the events API runs on the pipeline: it owns the process span.)
        process_span = telemetry.process_span
        if process_span is not None:
            attributes = _exception_attributes(args.exc_type, args.exc_value, args.exc_traceback)
            attributes["thread.name"] = args.thread.name if args.thread is not None else ""
            call_contained(lambda: process_span(sc.TARGET_TRAINER).add_event(sc.EVENT_EXCEPTION, attributes))
    (_previous_thread_excepthook or threading.__excepthook__)(args)


def _signal_attributes(signum: int, frame: FrameType | None) -> dict[str, Any]:
    return {sc.SIGNAL_NAME: signal.Signals(signum).name, sc.SIGNAL_NUMBER: signum,
            sc.EXCEPTION_STACKTRACE: frame_stack(frame)}


def _die_of(signum: int) -> None:
    """Restore the default action and re-raise, from any thread."""
    global _dying
    _dying = True  # before the default action is restored: _rearm must not undo it
    if threading.current_thread() is threading.main_thread():
        signal.signal(signum, signal.SIG_DFL)
    else:  # signal.signal() is main-thread only; libc's is not
        import ctypes

        libc_signal = ctypes.CDLL(None).signal
        libc_signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc_signal.restype = ctypes.c_void_p
        libc_signal(signum, None)  # SIG_DFL is 0
    os.kill(os.getpid(), signum)


def _set_deadline(signum: int, arrived: float) -> None:
    """The process dies of ``signum`` within the exit budget counted from ``arrived``, or sooner."""
    global _exit_deadline, _dying_of
    telemetry = _owned_telemetry()
    deadline = arrived + (telemetry.exit_budget_s() if telemetry is not None else 0.0)
    if deadline < _exit_deadline:
        _exit_deadline = deadline
    if _dying_of is None:
        _dying_of = signum


def _terminate(signum: int, frame: FrameType | None) -> None:
    """The default action, preceded by ending the open spans and a flush bounded by the exit budget."""
    global _flusher
    _rearm(signum)
    telemetry = _owned_telemetry()
    _set_deadline(signum, time.monotonic())
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
                frame = main_thread_frame()
            name = signal.Signals(signum).name
            end_open_spans(telemetry, sc.EVENT_SIGNAL, _signal_attributes(signum, frame), f"terminated by {name}")
            call_contained(telemetry.shutdown, _exit_deadline - time.monotonic())
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
                call_contained(current.add_event, sc.EVENT_SIGNAL, attributes)
        previous(signum, frame)
        return
    _terminate(signum, frame)


def _dispatch(signum: int, arrived: float) -> None:
    """A signal the watcher saw: terminate (in a thread of its own) if it is ours to handle."""
    if _installed_signals.get(signum) is not signal.SIG_DFL or os.getpid() != _owner_pid:
        return
    if signal.getsignal(signum) is not _signal_handler:
        return  # the program installed its own handler since: the signal is its to handle
    if time.monotonic() - _last_foreign_fork < _FORK_GRACE_S:
        # A child forked from another thread inherited the wakeup fd for a moment:
        # the byte may be its signal. Leave it to the main-thread handler.
        return
    _rearm(signum)
    _set_deadline(signum, arrived)
    if not _terminating.locked():
        try:
            threading.Thread(target=_terminate, args=(signum, None), name="otel-training-terminate",
                             daemon=True).start()
        except RuntimeError:  # no new threads at interpreter shutdown: flush from here
            _terminate(signum, None)

def _rearm(signum: int) -> None:
    """Our one-shot handler back after a delivery, while it is still ours and the process is not dying."""
    if not _dying and signal.getsignal(signum) is _signal_handler:
        oneshot.rearm(signum)


def _time_left() -> float:
    return _exit_deadline + _DEADLINE_GRACE_S - time.monotonic()


def _overran() -> bool:
    """Past the deadline with a signal to die of: die of it now."""
    if _dying_of is None:
        return False
    _die_of(_dying_of)
    return True


def _owned() -> bool:
    return os.getpid() == _owner_pid


_watcher: SignalWatcher | None = None
_last_foreign_fork = -math.inf
_FORK_GRACE_S = 5.0


def install(telemetry: Telemetry) -> None:
    """Install the hooks the options ask for; idempotent; chains to what was there."""
    global _installed_excepthook, _previous_excepthook, _previous_thread_excepthook, _watcher, _owner_pid
    global _installed_for
    with _lock:
        _owner_pid = os.getpid()
        _installed_for = weakref.ref(telemetry)
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
                    _watcher = SignalWatcher(_dispatch, _time_left, _overran, _owned)
                except (RuntimeError, OSError):
                    _watcher = None  # the main-thread handler still works, once the main thread runs Python
            if _watcher is not None and _watcher.helper is not None:
                # One-shot only with a helper to deliver the default action they leave in force.
                for signum, previous in _installed_signals.items():
                    if previous is signal.SIG_DFL and not oneshot.is_one_shot(signum):
                        oneshot.make_one_shot(signum)
                _watcher.configure_helper(telemetry.options["exit_timeout_s"], oneshot.signals())


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
                signal.signal(signum, previous)  # one-shot no more: Python installs it without SA_RESETHAND
            except (ValueError, OSError):
                pass
            del _installed_signals[signum]
            oneshot.forget(signum)


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
    global _watcher, _terminating, _terminated, _flusher, _exit_deadline, _dying_of, _dying
    if _watcher is not None:
        try:
            signal.set_wakeup_fd(-1)  # else the child's signals would wake the parent's watcher
        except ValueError:
            pass
        _watcher.close()
        _watcher = None
    _terminating, _terminated, _flusher, _exit_deadline = threading.Lock(), threading.Event(), None, math.inf
    _dying_of, _dying = None, False
    try:
        uninstall()
    except Exception:  # noqa: BLE001 - never break a fork
        pass


at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
