"""Uncaught exceptions and termination signals in DLRover's log (``DLROVER_EVENT_HOOK_ERROR``).

The one part of the shim that changes process-wide state (``sys.excepthook``,
signal handlers), so it stays alone, with its registration and undoing.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any, ClassVar

from otel_training._contain import contain, contained
from otel_training._text import text
from otel_training.compat.dlrover.config import Config, one_per_process
from otel_training.compat.dlrover.emitter import Process
from otel_training.compat.dlrover.exporter import AsyncExporter, get_default_exporter

#: The signals DLRover hooks, less the synchronous faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL: a Python handler
#: never runs, the faulting instruction repeats) and SIGPIPE (Python ignores it, so a closed pipe is an error).
_EXIT_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGABRT", "SIGHUP", "SIGQUIT")
                      if hasattr(signal, name))


def _flush_default_exporter(timeout_s: float) -> None:
    """The process is about to die: the line must reach the file first (DLRover writes it synchronously)."""
    exporter = get_default_exporter()
    if isinstance(exporter, AsyncExporter):
        exporter.force_flush(timeout_s)


class ErrorHandler:
    """With ``DLROVER_EVENT_HOOK_ERROR``: an ``exception`` instant for an uncaught exception and an ``exit_sig``
    instant for a termination signal, in DLRover's log, before the previous hook or handler runs.

    otel-training's own hooks (``exception_hooks``, ``signal_hooks``) record the same on the spans; each
    chains to the other, whichever was installed first.
    """

    _instance: ClassVar[ErrorHandler | None] = None
    _lock: ClassVar[threading.RLock] = threading.RLock()

    def __init__(self) -> None:
        self._original_excepthook: Callable[..., Any] | None = None
        self._original_handlers: dict[int, Any] = {}
        self._process: Process = Process("ErrorReporter")
        self._registered = False

    @classmethod
    def singleton_instance(cls) -> ErrorHandler:
        return one_per_process(cls, cls._lock)

    def _handle_exception(self, exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        # The user's exception, not ours, must reach the original hook.
        with contain("dlrover-compat:exception-hook", "otel_training: could not log an uncaught exception"):
            if tb is not None:
                self._process.instant("exception", {"stack": traceback.format_exception(exc_type, exc, tb),
                                                    "pid": os.getpid()})
                _flush_default_exporter(1.0)
        if self._original_excepthook is not None:
            self._original_excepthook(exc_type, exc, tb)

    def _handle_signal(self, signum: int, frame: Any) -> None:
        try:
            # In a signal handler: the original handler must still run (finally).
            with contain("dlrover-compat:signal-hook", "otel_training: could not log a signal"):
                content: dict[str, Any] = {"sig": signum, "sig_name": signal.Signals(signum).name, "pid": os.getpid()}
                try:
                    if frame:
                        content["stack"] = traceback.format_list(traceback.extract_stack(frame))
                except Exception as error:  # noqa: BLE001 - a stack that cannot be read is named in the event, as DLRover does
                    content["stack"] = f"get stack failed: {text(error)}"
                self._process.instant("exit_sig", content)
                _flush_default_exporter(1.0)
        finally:
            self._call_original_handler(signum, frame)

    def _call_original_handler(self, signum: int, frame: Any) -> None:
        original = self._original_handlers.get(signum, signal.SIG_DFL)
        if callable(original):
            original(signum, frame)
        elif original == signal.SIG_IGN:
            return
        else:  # the default action: die of the signal, as without the hook
            if self._registered:
                self.unregister()
            os.kill(os.getpid(), signum)

    def register(self) -> None:
        """Hook ``sys.excepthook`` and the termination signals (from the main thread)."""
        with self._lock:
            if self._registered:
                return
            self._original_excepthook = sys.excepthook
            sys.excepthook = self._handle_exception
            for signum in _EXIT_SIGNALS:
                self._original_handlers[signum] = signal.getsignal(signum)
                signal.signal(signum, self._handle_signal)
            self._registered = True

    def unregister(self) -> None:
        with self._lock:
            if not self._registered:
                return
            if self._original_excepthook is not None:
                sys.excepthook = self._original_excepthook
                self._original_excepthook = None
            for signum, handler in self._original_handlers.items():
                signal.signal(signum, handler)
            self._original_handlers.clear()
            self._registered = False


@contained(default=None)
def init_error_handler() -> None:
    """Register the ``ErrorHandler`` when ``DLROVER_EVENT_HOOK_ERROR`` says so (at import, as DLRover does)."""
    config = Config.singleton_instance()
    if config.enable and config.hook_error:
        ErrorHandler.singleton_instance().register()
