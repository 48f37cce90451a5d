"""The one way tests wait: on a condition, with a deadline, never a fixed sleep before an assertion."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], object], timeout_s: float = 30.0, interval_s: float = 0.005) -> bool:
    """True as soon as ``condition()`` is; False if it still is not after ``timeout_s``.

    The deadline is generous by design: it bounds a broken test, it is not what
    the test measures, so a loaded CI machine only makes the test slower.
    """
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return bool(condition())
        time.sleep(interval_s)
    return True


def first_value(produce: Callable[[], T | None], timeout_s: float = 30.0, interval_s: float = 0.005) -> T:
    """``produce()``'s first result that is not None, polled with a deadline; AssertionError past it."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = produce()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"no value within {timeout_s} s")
        time.sleep(interval_s)
