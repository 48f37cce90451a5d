"""The task, session, step and profiling of the running context (``contextvars``).

They follow ``await`` and ``asyncio`` tasks, so concurrent rollout samples do
not mix; scopes, phases and the tracer all read them from here.
"""

from __future__ import annotations

import contextvars
from typing import Any

_task_id: contextvars.ContextVar[int | None] = contextvars.ContextVar("otel_training_areal_task", default=None)
_session_id: contextvars.ContextVar[int | None] = contextvars.ContextVar("otel_training_areal_session",
                                                                         default=None)
_global_step: contextvars.ContextVar[Any] = contextvars.ContextVar("otel_training_areal_step", default=None)
_profiling: contextvars.ContextVar[bool] = contextvars.ContextVar("otel_training_areal_profiling", default=False)


def set_task_id(task_id: int | None) -> None:
    """Make ``task_id`` the task of this context (it follows ``await`` and ``asyncio`` tasks)."""
    _task_id.set(task_id)


def get_task_id() -> int | None:
    return _task_id.get()


def set_session_id(session_id: int | None) -> None:
    """Make ``session_id`` the session of this context; phases and scopes find it here."""
    _session_id.set(session_id)


def get_session_id() -> int | None:
    return _session_id.get()
