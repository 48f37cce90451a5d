"""Stacks for alerts and exit events: captured one way, bounded one way.

An alert span carries the stacks of every thread (the stuck one first) and an
exit event the stack of the thread that died; both must stay small enough for
an exporter and a backend to accept, whatever the recursion depth of the code
that hung. Text from ``py-spy`` (the sidecar's view of a frozen process) is
bounded the same way.
"""

from __future__ import annotations

import sys
import threading
import traceback
from types import FrameType

#: The most characters of stacks an alert or an event carries.
MAX_STACK_CHARS = 16_384
#: The innermost frames kept of each thread's stack in an alert.
MAX_STACK_FRAMES = 40
_TRUNCATED = "\n...[truncated]"


def bounded(text: str, max_chars: int = MAX_STACK_CHARS, *, keep_end: bool = False) -> str:
    """``text`` cut to ``max_chars``: its start, marked as cut; or with ``keep_end``, its end
    (a traceback's end is where it was raised)."""
    if len(text) <= max_chars:
        return text
    if keep_end:
        return text[-max_chars:]
    return text[: max_chars - len(_TRUNCATED)] + _TRUNCATED


def frame_stack(frame: FrameType | None, max_chars: int = MAX_STACK_CHARS) -> str:
    """One frame's stack, outermost first, its innermost end kept."""
    return bounded("".join(traceback.format_stack(frame)), max_chars, keep_end=True) if frame is not None else ""


def main_thread_frame() -> FrameType | None:
    """Where the main thread is now (for a signal handled on another thread)."""
    ident = threading.main_thread().ident  # set: the main thread has started
    return sys._current_frames().get(ident) if ident is not None else None  # noqa: SLF001 - the only way to see it


def thread_stacks(first_thread_id: int | None = None, max_chars: int = MAX_STACK_CHARS,
                  max_frames: int = MAX_STACK_FRAMES) -> str:
    """Every Python thread's stack (innermost ``max_frames`` frames) but the caller's, ``first_thread_id``'s
    first, bounded to ``max_chars``."""
    frames = sys._current_frames()  # noqa: SLF001 - the only way to see other threads' stacks
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    me = threading.get_ident()
    order = sorted((ident for ident in frames if ident != me or ident == first_thread_id),
                   key=lambda ident: ident != first_thread_id)
    parts = []
    for ident in order:
        mark = " (the stuck span's thread)" if ident == first_thread_id else ""
        stack = "".join(traceback.format_stack(frames[ident], limit=max_frames))
        parts.append(f"Thread {names.get(ident, '?')} ({ident}){mark}, most recent call last:\n{stack}")
    return bounded("\n".join(parts), max_chars)


__all__ = ["MAX_STACK_CHARS", "MAX_STACK_FRAMES", "bounded", "frame_stack", "main_thread_frame", "thread_stacks"]
