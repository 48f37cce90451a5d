"""A monotonic clock that moves only when a test moves it: deadlines decided by value, not by sleeping."""

from __future__ import annotations


class FakeClock:
    def __init__(self, start: float = 500.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now
