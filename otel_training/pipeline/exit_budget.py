"""``exit_timeout_s`` for the way out, spent once however many steps the way out takes.

An uncaught exception is flushed by the exception hook and then again by the exit-time shutdown (and a signal may
come in between): each taking the whole budget made the exit take a multiple of it against a collector that never
answers. The time the exit flushes have spent is charged here instead of the time since they began, so a process
that goes on after its main thread died (non-daemon threads) still has its budget for the final shutdown.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class ExitBudget:
    """``total_s`` seconds for every exit flush together; ``clock`` is monotonic seconds (injected by tests)."""

    def __init__(self, total_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._total_s = total_s
        self._clock = clock
        self._spent_s = 0.0
        self._started: float | None = None

    def left_s(self) -> float:
        """What is left, counting the flush in progress (another thread's: a signal during the hook's)."""
        spent = self._spent_s
        started = self._started
        if started is not None:
            spent += self._clock() - started
        return max(0.0, self._total_s - spent)

    def spend(self, flush: Callable[[float], T]) -> T:
        """``flush(left_s())``, its time charged to the budget whatever it returns or raises."""
        self._started = started = self._clock()
        try:
            return flush(self.left_s())
        finally:
            self._spent_s += self._clock() - started
            self._started = None


__all__ = ["ExitBudget"]
