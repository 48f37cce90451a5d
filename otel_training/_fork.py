"""One fork-safety registry for every object and module with per-process state.

A forked child (a DataLoader worker, a ``multiprocessing`` Pool process, a launcher's fork) inherits copies of
the parent's objects but none of its threads: a lock held at the fork stays held for ever, a writer thread is
gone, a ring and a drain are the parent's, and a random generator would draw the parent's ids. Each class that
keeps such state registers its instances here, with the function that makes the child's copy safe
(``reset_in_child``); a module's own state registers handlers for the process's life (``at_fork``).

One at-fork handler, registered once, calls them all: each contained (one failing reset never leaves the
others undone, and is logged once), in registration order (``before`` handlers in reverse, as
``os.register_at_fork`` does), with instances held weakly (registering never keeps an object alive).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from otel_training import _contain
from otel_training._contain import log_once

T = TypeVar("T")

#: Instance resets by the instance's id, in registration order: an entry goes when its instance does.
_resets: dict[int, tuple[weakref.ref[Any], Callable[[Any], None]]] = {}
_before: list[Callable[[], None]] = []
_after_in_parent: list[Callable[[], None]] = []
_after_in_child: list[Callable[[], None]] = []
_lock = threading.Lock()  # registrations from threads; the handlers themselves read snapshots


def reset_in_child(instance: T, reset: Callable[[T], None]) -> None:
    """Call ``reset(instance)`` in every forked child for as long as ``instance`` lives (held weakly), or until
    ``forget(instance)``. Registering it again replaces its reset."""
    key = id(instance)

    def gone(ref: weakref.ref[Any]) -> None:
        if _resets.get(key, (None,))[0] is ref:
            del _resets[key]

    with _lock:
        _resets[key] = (weakref.ref(instance, gone), reset)


def forget(instance: object) -> None:
    """No reset for ``instance`` in a child from now on (it was shut down: its child copy has nothing to redo)."""
    with _lock:
        entry = _resets.get(id(instance))
        if entry is not None and entry[0]() is instance:
            del _resets[id(instance)]


def at_fork(*, before: Callable[[], None] | None = None, after_in_parent: Callable[[], None] | None = None,
            after_in_child: Callable[[], None] | None = None) -> None:
    """A module's own fork handlers, for the life of the process (``os.register_at_fork``'s arguments)."""
    with _lock:
        for handler, handlers in ((before, _before), (after_in_parent, _after_in_parent),
                                  (after_in_child, _after_in_child)):
            if handler is not None:
                handlers.append(handler)


def _run(handler: Callable[..., None], *args: object) -> None:
    try:
        handler(*args)
    except BaseException:  # noqa: BLE001 - one failing reset (even interrupted) must not leave the others undone, nor fail the fork
        log_once(f"fork:{getattr(handler, '__qualname__', handler)}",
                 "otel_training: a fork handler failed (%s); the others ran", handler)


def _before_fork() -> None:
    for handler in reversed(list(_before)):
        _run(handler)


def _after_fork_in_parent() -> None:
    for handler in list(_after_in_parent):
        _run(handler)


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    _contain.after_fork_in_child()  # and the once-only log's lock, which a failing reset takes
    for handler in list(_after_in_child):
        _run(handler)
    for ref, reset in tuple(_resets.copy().values()):  # a copy: a weak reference's callback may pop from it
        instance = ref()
        if instance is not None:
            _run(reset, instance)


if hasattr(os, "register_at_fork"):  # every POSIX platform; the one guard for all of them
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)
