"""One process group as this rank sees it (``GroupState``), and how a span or an alert describes it.

Why a module of its own: ``collectives.py`` attaches to the groups and decides when to read them; this is
the state both routes write (the hooks, or torch's sequence number read when someone looks) and the
attributes it becomes (``describe``), which a step's end, a stuck alert and the way out all use.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from otel_training import semconv as sc


class GroupState:
    """One process group as this rank sees it; written by the hooks, read by anyone."""

    __slots__ = ("name", "backend", "entered", "op", "args", "op_id", "entered_ns", "step", "completed",
                 "work", "work_seq", "previous", "previous_seq", "sequence", "step_number", "__weakref__")

    def __init__(self, name: str, backend: str, sequence: Callable[[], int] | None = None,
                 step_number: Callable[[], int | None] = lambda: None) -> None:
        self.name = name
        self.backend = backend
        #: The sequence route: torch's per-group counter, read when someone looks (None: the hooks write).
        self.sequence = sequence
        self.step_number = step_number
        self.entered = 0
        self.op: Any = None  # HookOpName of the last entered (named only when read)
        self.args: Any = None  # its PreHookArgs (tensors: the size, read lazily)
        self.op_id = -1
        self.entered_ns = 0
        self.step: int | None = None
        self.completed = 0
        self.work: Any = None
        self.work_seq = 0
        self.previous: Any = None
        self.previous_seq = 0

    def refresh(self) -> None:
        """The sequence route: what was entered since the last look (the hooks route needs none)."""
        if self.sequence is None:
            return
        entered = int(self.sequence())
        if entered > self.entered:
            self.entered, self.op, self.entered_ns = entered, None, time.monotonic_ns()
            self.step = self.step_number()

    def step_ended(self) -> None:
        """The sequence route: a step's end vouches for what it entered (its collectives were waited for)."""
        if self.sequence is not None:
            self.refresh()
            self.completed = self.entered

    def poll(self) -> None:
        """Advance ``completed`` by the Works of the last two collectives that say they finished."""
        for slot in ("previous", "work"):
            work, seq = (self.previous, self.previous_seq) if slot == "previous" else (self.work, self.work_seq)
            if work is not None and work.is_completed():
                if seq > self.completed:
                    self.completed = seq
                if getattr(self, slot) is work:
                    setattr(self, slot, None)

    @property
    def pending(self) -> bool:
        return self.entered > self.completed

    @property
    def op_name(self) -> str:
        op = self.op
        return "" if op is None else str(getattr(op, "name", op)).lower()

    def bytes(self) -> int | None:
        args = self.args
        if args is None:
            return None
        return sum(int(tensor.nbytes) for tensor in args.input_tensors)

    def wait_s(self, now_ns: int | None = None) -> float:
        if not self.pending or not self.entered_ns:
            return 0.0
        return max(0.0, ((now_ns or time.monotonic_ns()) - self.entered_ns) / 1e9)


def describe(state: GroupState, wait: bool = False) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        sc.COLLECTIVE_GROUP: state.name,
        sc.COLLECTIVE_OP: state.op_name,
        sc.COLLECTIVE_SEQ: state.entered,
        sc.COLLECTIVE_COMPLETED_SEQ: state.completed,
        sc.COLLECTIVE_PENDING: state.pending,
    }
    size = state.bytes()
    if size is not None:
        attributes[sc.COLLECTIVE_BYTES] = size
    if state.step is not None:
        attributes[sc.COLLECTIVE_STEP] = state.step
    if wait:
        attributes[sc.COLLECTIVE_WAIT_S] = round(state.wait_s(), 3)
    return attributes
