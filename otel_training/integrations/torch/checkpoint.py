"""``torch.save``/``torch.load`` and ``torch.distributed.checkpoint`` as checkpoint spans.

Checkpoint time is badput, and how big a checkpoint was explains most of it, so
each span carries the path and the bytes written or read (file size, bytes
through a file object, or the size of a distributed checkpoint's directory).
A save nested in another (DCP writing through ``torch.save``, a framework
wrapping it) is part of the outer span, not a span of its own.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from otel_training import semconv as sc
from otel_training._contain import contained
from otel_training.integrations.torch.steps import SOURCE, StepTracker

#: Bound on the files counted for a distributed checkpoint's size.
MAX_FILES_COUNTED = 10_000

_local = threading.local()


def _path_of(target: Any) -> str | None:
    if isinstance(target, (str, os.PathLike)):
        return os.fspath(target) if not isinstance(target, bytes) else None
    name = getattr(target, "name", None)
    return name if isinstance(name, str) else None


def _tell(target: Any) -> int | None:
    try:
        return int(target.tell())
    except Exception:  # noqa: BLE001 - not a seekable file object
        return None


def _size(path: str | None) -> int | None:
    """Bytes of a file, or of a directory's files (bounded)."""
    if not path:
        return None
    try:
        if os.path.isfile(path):
            return os.path.getsize(path)
        if not os.path.isdir(path):
            return None
        total, counted = 0, 0
        for root, _dirs, files in os.walk(path):
            for name in files:
                total += os.path.getsize(os.path.join(root, name))
                counted += 1
                if counted >= MAX_FILES_COUNTED:
                    return total
        return total
    except OSError:
        return None


def _dcp_path(kwargs: dict[str, Any], io_key: str) -> str | None:
    target = kwargs.get("checkpoint_id")
    if target is None:
        target = getattr(kwargs.get(io_key), "path", None)
    return os.fspath(target) if isinstance(target, (str, os.PathLike)) else None


def _run(tracker: StepTracker, save: bool, path: str | None, fmt: str,
         call: Callable[[], Any], file: Any = None) -> Any:
    """Run ``call`` in a checkpoint span unless one is already open on this thread."""
    if getattr(_local, "active", False):
        return call()
    token = _begin(tracker, save, path, fmt)
    before = _tell(file) if file is not None else None
    _local.active = True
    try:
        result = call()
    except BaseException as error:
        tracker.span_end(token, error)
        raise
    finally:
        _local.active = False
    _finish(tracker, token, save, path, file, before)
    return result


@contained(default=None)
def _begin(tracker: StepTracker, save: bool, path: str | None, fmt: str) -> Any:
    trainer = tracker.trainer
    duration = (trainer.save if save else trainer.load_ckpt)(path=path)
    duration.extra_args(**{sc.CHECKPOINT_FORMAT: fmt, sc.INSTRUMENTATION_SOURCE: SOURCE})
    return tracker.span_begin(duration, boundary=True)


@contained(default=None)
def _finish(tracker: StepTracker, token: Any, save: bool, path: str | None, file: Any, before: int | None) -> None:
    if token is None:
        return
    size: int | None = None
    if file is not None and before is not None:
        after = _tell(file)
        size = after - before if after is not None else None
    if size is None:
        size = _size(path)
    if size is not None:
        token[0].extra_args(**{sc.CHECKPOINT_BYTES: size})
    tracker.span_end(token)


def save_wrapper(tracker: StepTracker) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        target = args[1] if len(args) > 1 else kwargs.get("f")
        path = _path_of(target)
        file = None if isinstance(target, (str, os.PathLike)) else target
        return _run(tracker, True, path, "torch.save", lambda: wrapped(*args, **kwargs), file)

    return wrapper


def load_wrapper(tracker: StepTracker) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        target = args[0] if args else kwargs.get("f")
        path = _path_of(target)
        file = None if isinstance(target, (str, os.PathLike)) else target
        return _run(tracker, False, path, "torch.load", lambda: wrapped(*args, **kwargs), file)

    return wrapper


def dcp_wrapper(tracker: StepTracker, save: bool) -> Callable[..., Any]:
    io_key = "storage_writer" if save else "storage_reader"

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        path = _dcp_path(kwargs, io_key)
        return _run(tracker, save, path, "torch.distributed.checkpoint", lambda: wrapped(*args, **kwargs))

    return wrapper


@contextlib.contextmanager
def outer_checkpoint() -> Iterator[None]:
    """A framework reports this checkpoint itself: torch.save/load inside it add no span."""
    previous = getattr(_local, "active", False)
    _local.active = True
    try:
        yield
    finally:
        _local.active = previous
