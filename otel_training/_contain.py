"""Containment: instrumentation must never break or stall the training loop.

Every entry point the training thread calls goes through ``contained`` (a
function), ``contain`` (a block), or catches and calls ``log_once``: an internal
failure is logged once per place with its traceback and then swallowed, so a bug
or a broken exporter costs a log line, never a training run. The broad
``except Exception`` those need lives here, once, instead of at every place.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final, TypeVar

logger = logging.getLogger("otel_training")

_seen: set[str] = set()
_seen_lock = threading.Lock()

F = TypeVar("F", bound=Callable[..., Any])


def after_fork_in_child() -> None:
    """A forked child: another thread may have held the lock at the fork (``_fork.py`` calls this first)."""
    global _seen_lock
    _seen_lock = threading.Lock()


def log_once(key: str, message: str, *args: Any, exc_info: bool = True) -> None:
    """Log ``message`` the first time ``key`` is seen in this process."""
    with _seen_lock:
        if key in _seen:
            return
        _seen.add(key)
    logger.warning(message + " (further occurrences are not logged)", *args, exc_info=exc_info)


class contain:
    """A block whose failure (any ``Exception``) is logged once under ``key`` and swallowed.

    ``message % args`` is the log line, with the traceback unless ``exc_info=False``. Code after the block runs
    either way; a block that returns a value falls through to the line after it when it fails::

        with contain("values-deliver", "otel_training: could not deliver a converted value"):
            return deliver(value)
        return None

    ``BaseException`` (KeyboardInterrupt, SystemExit) passes through: stopping the job is the user's call. An
    instance holds no state between uses: a module constant serves every call, and a per-step site calls its
    ``failed()`` from an inline handler instead.
    """

    __slots__ = ("key", "message", "args", "exc_info")

    def __init__(self, key: str, message: str, *args: Any, exc_info: bool = True) -> None:
        self.key: Final = key
        self.message: Final = message
        self.args: Final = args
        self.exc_info: Final = exc_info

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> bool:
        if kind is None or not issubclass(kind, Exception):
            return False
        self.failed()
        return True

    def failed(self) -> None:
        """Log the exception being handled, once: for a site that runs every step and so keeps its own inline
        ``try`` (free when nothing raises; a ``with`` block costs two calls), with its key and message here."""
        log_once(self.key, self.message, *self.args, exc_info=self.exc_info)


def call_contained(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)``, contained as ``contained()`` would (None if it raised)."""
    return contained()(function)(*args, **kwargs)


def contained(default: Any = None,
              message: str = "otel_training: internal error in %s; training continues") -> Callable[[F], F]:
    """Run the function; on any exception log it once (``message`` % its name) and return ``default``."""

    def decorate(function: F) -> F:
        key = f"{function.__module__}.{function.__qualname__}"

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return function(*args, **kwargs)
            except Exception:  # noqa: BLE001 - the whole point is to contain everything
                log_once(key, message, key)
                return default

        return wrapper  # type: ignore[return-value]  # functools.wraps: the same callable F, contained

    return decorate
