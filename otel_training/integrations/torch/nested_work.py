"""Work nested in a training step: a checkpoint save, a process group's set-up, a collective's span.

The step span is begun detached (``steps.py``): it never becomes the user's current span. Work that belongs
inside it (``torch.save`` during a step, a distributed call) begins in a private copy of the context where the
step is current, made the first time a step needs one, or in the loop's epoch or train context between steps.
Kept apart from the step state machine: these entry points are the checkpoint and distributed wrappers', not
the per-step hooks'.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from otel_training._contain import contained
from otel_training.events.duration import Duration

#: A begun span and the step context it was begun in (None: the caller's context).
Token = tuple[Duration, "contextvars.Context | None"]


class NestedWork:
    """The step tracker's spans for work nested in its steps (mixed into ``steps.StepTracker``, whose state
    these read: the open step, its owner thread, its context, the loop's spans)."""

    _step: Duration | None
    _ctx: contextvars.Context | None
    _owner: int | None
    dormant: bool
    loop: Any

    if TYPE_CHECKING:  # the tracker's, for the type checker only: nothing here stands in for them
        def _still_dormant(self) -> bool: ...
        def _records_here(self) -> bool: ...
        def _training(self) -> Any: ...
        def _boundary(self, fetch: bool) -> None: ...

    @contained(default=None)
    def span_begin(self, duration: Duration, boundary: bool) -> Token | None:
        """Begin a checkpoint or distributed span: inside the step in progress, or after
        closing a step that only waited for its boundary (``boundary=True``). None while dormant."""
        if self.dormant and self._still_dormant():
            return None
        if self._records_here():
            self._training()
            if boundary:  # other host work (a checkpoint save): an evaluation before it has ended
                self.loop.end_evaluation()
                self._boundary(fetch=True)
        return self._begin_in_step(duration)

    def _begin_in_step(self, duration: Duration) -> Token:
        step = self._step
        if step is not None and threading.get_ident() == self._owner:
            ctx = self._ctx
            if ctx is None:
                ctx = self._ctx = step.context()
            ctx.run(duration.begin)
            return duration, ctx
        loop = self.loop.context
        if loop is not None and threading.get_ident() == self._owner:
            loop.run(duration.begin)
            return duration, loop
        duration.begin()
        return duration, None

    @contained(default=None)
    def span_end(self, token: Token | None, error: BaseException | None = None) -> None:
        if token is None:
            return
        duration, ctx = token
        end: Callable[..., object] = duration.end
        args: tuple[BaseException, ...] = ()
        if error is not None and not isinstance(error, StopIteration):
            end, args = duration.fail, (error,)
        if ctx is not None:
            ctx.run(end, *args)
        else:
            end(*args)
