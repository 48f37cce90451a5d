"""Waiting with a deadline: what a flush or shutdown achieved, and a call that is waited for no longer than asked.

Why a module of its own: the pipeline (``telemetry.py``) and the offloaded one (``offload.py``) bound every
flush and shutdown the same way, whatever the exporter or the drain does.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from otel_training._contain import contain


@dataclasses.dataclass(frozen=True)
class FlushResult:
    """What a flush or shutdown achieved within its deadline."""

    completed: bool
    """True when everything queued was handed to the exporter before the deadline."""
    exported: int
    """Spans the exporter delivered since start-up."""
    dropped: int
    """Spans that will never be delivered: failed exports, queue overflow, and on
    shutdown whatever was still queued."""
    pending: int
    """Spans still queued or in flight (0 after a shutdown)."""
    elapsed_s: float
    spooled: int = 0
    """Spans the collector could not take, written to the local spool instead (``spool_dir``)."""


def run_with_deadline(function: Callable[[], Any], timeout_s: float, name: str) -> bool:
    """Run ``function`` in a daemon thread; True if it returned within ``timeout_s``.

    The SDK's flush and shutdown can block for the exporter's whole retry budget;
    a daemon thread lets us stop waiting without being able to cancel them.
    """
    done = threading.Event()

    def run() -> None:
        try:
            # A daemon thread: the flush's or shutdown's failure is logged once, not raised.
            with contain(f"deadline:{name}", "otel_training: %s raised", name):
                function()
        finally:
            done.set()

    thread = threading.Thread(target=run, name=f"otel-training-{name}", daemon=True)
    thread.start()
    return done.wait(max(0.0, timeout_s))


def millis(seconds: float) -> int:
    return max(0, int(seconds * 1000))
