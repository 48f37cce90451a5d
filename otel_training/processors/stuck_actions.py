"""What the stuck detector does besides alerting: flush the alerts at once, and end or signal the process.

The flush runs on a thread of its own (an exporter may hang for its whole
retry budget; the watcher must not wait for it). The ``exit`` action ends the
open spans first, flushes within a bound and exits with a code an elastic
launcher restarts on; ``signal`` sends a signal to this process.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from opentelemetry.context import Context
from opentelemetry.sdk.trace import Span

from otel_training._contain import contain
from otel_training._text import text
from otel_training.processors.stuck_options import signal_of

if TYPE_CHECKING:
    from otel_training.processors.stuck_options import StuckOptions

logger = logging.getLogger("otel_training")


def guarded(function: Callable[..., Any], *args: Any) -> None:
    """Run ``function``; an error is logged once and goes no further (the watcher must keep watching).

    ``function`` may be the user's (``before_exit``): a ``functools.partial`` or a callable object has no
    ``__name__``, and naming it must not stop the call (nor the exit action after it)."""
    with internal_error(callable_name(function, "__name__")):
        function(*args)


def callable_name(function: object, attribute: str = "__qualname__") -> str:
    """What a log line calls ``function``: its ``__qualname__`` (or ``attribute``), else its text, which tells two
    partials apart (never raises: ``_text.text``)."""
    name = getattr(function, attribute, None)
    return name if isinstance(name, str) else text(function)


def internal_error(where: str) -> contain:
    """The stuck detector's containment at ``where``: logged once, training continues."""
    return contain(f"stuck:{where}", "otel_training: internal error in the stuck detector (%s); training continues",
                   where)


def log_internal(where: str) -> None:
    """``internal_error(where)`` from an inline handler (``on_start``/``on_end``, per span: a ``try`` is free)."""
    internal_error(where).failed()


class RemoteStacks(NamedTuple):
    """What another process says when its span is stuck: its stacks and what else its alerts carry."""

    stacks: str | None
    #: Who took them, when not the process's own Python (e.g. "py-spy").
    source: str | None
    #: Why they are missing.
    missing: str | None
    #: Its ``alert_context`` (e.g. the collective the rank is inside: ``training.collective.*``); None when it
    #: did not answer.
    context: Mapping[str, Any] | None = None


class RemoteProcess(Protocol):
    """The process whose spans a detector watches, when that is another process (the offload drain watches
    the training process's spans): where its stacks come from, and how its actions reach it."""

    def stacks(self, thread_id: int | None) -> RemoteStacks:
        """Every thread's stack, ``thread_id``'s first, and the process's alert context; bounded in time."""

    def signal(self, signum: int) -> None:
        """Send it ``signum``."""

    def exit(self, code: int) -> None:
        """Have it end its open spans, flush and exit with ``code`` (never waits)."""


class Slot(Protocol):
    """Where the watchdog sidecar reads the open step (``otel_training.watchdog.slot``)."""

    def begin(self, span: Span, parent_context: Context | None, start_s: float, threshold_s: float) -> None: ...

    def end(self, span_id: int) -> None: ...

    def alerted(self, span_id: int) -> None: ...

    def watchdog_alerts(self, span_id: int) -> int:
        """Stuck alerts the watchdog already raised on ``span_id`` while this process could not."""
        ...


class StuckActions:
    """The flusher thread and the ``none``/``exit``/``signal`` action of one detector, as its ``StuckOptions``
    say (on their ``remote`` when the watched spans are another process's)."""

    def __init__(self, options: StuckOptions, flush_target: Callable[[], Callable[[], Any] | None]) -> None:
        self.action = options.action
        self._exit_code = options.exit_code
        self._signal = signal_of(options.signal)
        self._flush = options.flush
        self._before_exit = options.before_exit
        self._flush_timeout_s = options.exit_flush_timeout_s
        #: Where the last alert went when no bounded flush was given (the stuck span's own pipeline).
        self._flush_target = flush_target
        self._remote = options.remote
        self.reset()

    def reset(self) -> None:
        """Fresh threads and state (a forked child starts with none of its parent's threads)."""
        self._stopping = False
        self._event = threading.Event()
        self._flusher: threading.Thread | None = None
        self._exiting = False

    def flush_now(self, timeout_s: float) -> None:
        if self._flush is not None:
            self._flush(timeout_s)
        else:
            target = self._flush_target()
            if target is not None:
                target()

    def request_flush(self) -> None:
        """Wake the flusher thread; never waits."""
        if self._flusher is None:
            self._flusher = threading.Thread(target=self._flush_loop, name="otel-training-stuck-flush", daemon=True)
            self._flusher.start()
        self._event.set()

    def _flush_loop(self) -> None:
        while not self._stopping:
            self._event.wait()
            self._event.clear()
            if self._stopping:
                return
            guarded(self.flush_now, self._flush_timeout_s)

    def act(self, span_name: str) -> None:
        """The action on a span's first stuck alert."""
        if self._remote is not None and self.action != "none":
            self.request_flush()  # the alert first: the remote process's exit flushes its own spans
            if self.action == "signal":
                self._remote.signal(self._signal)
            elif not self._exiting:
                self._exiting = True
                self._remote.exit(self._exit_code)
        elif self.action == "signal":
            logger.warning("otel_training: sending %s to this process (stuck %s)", self._signal.name, span_name)
            os.kill(os.getpid(), self._signal)
        elif self.action == "exit" and not self._exiting:
            self._exiting = True
            logger.warning("otel_training: exiting with code %d (stuck %s) so the launcher restarts this rank",
                           self._exit_code, span_name)
            if self._before_exit is not None:
                # e.g. end the open spans (the stuck step, its epoch) so the trace holds them
                guarded(self._before_exit)
            flusher = threading.Thread(target=guarded, args=(self.flush_now, self._flush_timeout_s),
                                       name="otel-training-stuck-exit-flush", daemon=True)
            flusher.start()
            flusher.join(self._flush_timeout_s)
            os._exit(self._exit_code)

    def stop(self) -> None:
        self._stopping = True
        self._event.set()
