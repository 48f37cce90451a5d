"""Uncaught exceptions and termination signals: record them, end open spans, flush.

When a rank dies, the spans that were open (the step it died in, its epoch)
are the ones that explain why, and they are exported only when they end. So on
an uncaught exception or a fatal signal every open span is ended with status
ERROR and the exception or signal as an event, the exporter gets a bounded
flush, and then the previous handler runs (or the default action, re-raised),
so the exit status is exactly what it would be without the library.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

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


@contained(default=None)
def end_open_spans(telemetry: Telemetry, event: str, attributes: dict[str, Any], description: str,
                   thread_id: int | None = None) -> int:
    """End every open span (of one thread, or all) with status ERROR and ``event``; returns how many."""
    spans = telemetry.open_spans.open_spans(thread_id)
    for span in spans:  # newest first: children end before their parents
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


def _excepthook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    telemetry = get_telemetry()
    if telemetry is not None and not telemetry.is_shut_down:
        end_open_spans(telemetry, sc.EVENT_EXCEPTION, _exception_attributes(exc_type, exc, tb),
                       f"{exc_type.__name__}: {exc}")
        contained()(telemetry.force_flush)(telemetry.options["exit_timeout_s"])
    (_previous_excepthook or sys.__excepthook__)(exc_type, exc, tb)


def _thread_excepthook(args: threading.ExceptHookArgs) -> None:
    telemetry = get_telemetry()
    if telemetry is not None and not telemetry.is_shut_down and args.exc_value is not None:
        # Only this thread's spans: the process goes on.
        thread_id = args.thread.ident if args.thread is not None else None
        end_open_spans(telemetry, sc.EVENT_EXCEPTION,
                       _exception_attributes(args.exc_type, args.exc_value, args.exc_traceback),
                       f"{args.exc_type.__name__}: {args.exc_value}", thread_id=thread_id)
    (_previous_thread_excepthook or threading.__excepthook__)(args)


def _stack_of(frame: FrameType | None) -> str:
    return "".join(traceback.format_stack(frame))[-16384:] if frame is not None else ""


def _signal_handler(signum: int, frame: FrameType | None) -> None:
    previous = _installed_signals.get(signum, signal.SIG_DFL)
    telemetry = get_telemetry()
    name = signal.Signals(signum).name
    attributes = {sc.SIGNAL_NAME: name, sc.SIGNAL_NUMBER: signum, sc.EXCEPTION_STACKTRACE: _stack_of(frame)}
    if callable(previous):
        # Someone else handles it (e.g. torchelastic raising SignalException, or
        # SIGINT's KeyboardInterrupt): record, and let the exception they raise
        # end the spans on its way out.
        if telemetry is not None and not telemetry.is_shut_down:
            for span in telemetry.open_spans.open_spans(threading.get_ident()):
                contained()(span.add_event)(sc.EVENT_SIGNAL, attributes)
        previous(signum, frame)
        return
    # Default action (terminate, maybe with a core): end spans, flush, then die
    # of the same signal so the parent sees the same status.
    if telemetry is not None and not telemetry.is_shut_down:
        end_open_spans(telemetry, sc.EVENT_SIGNAL, attributes, f"terminated by {name}")
        contained()(telemetry.shutdown)(telemetry.options["exit_timeout_s"])
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def install(telemetry: Telemetry) -> None:
    """Install the hooks the options ask for; idempotent; chains to what was there."""
    global _installed_excepthook, _previous_excepthook, _previous_thread_excepthook
    with _lock:
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


def uninstall() -> None:
    """Restore the handlers that were there before ``install``."""
    global _installed_excepthook
    with _lock:
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
