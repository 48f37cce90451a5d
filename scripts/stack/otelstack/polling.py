"""Polling with deadlines: how the stack (and its tests) wait on a condition instead of sleeping."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """Status and body; an HTTP error status is returned, not raised (a refused connection raises OSError)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def http_ok(url: str, timeout: float = 1.0) -> bool:
    status, _ = http_get(url, timeout=timeout)
    return status == 200


def wait_until(check: Callable[[], T], *, timeout: float, interval: float = 0.2, what: str = "condition") -> T:
    """Poll ``check`` until it returns a truthy value or the deadline passes.

    Exceptions from ``check`` count as "not yet"; the last one is reported.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - reported on timeout
            last_exc = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_exc!r})" if last_exc else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(interval)
