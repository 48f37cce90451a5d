"""The shared-memory slot: what the training process tells its watchdog, without a system call.

One small file, mmap'd by both processes. The training process writes, with
``struct.pack_into`` on the mapping (a memory copy, no syscall per step), the
open step's span name, ids, ``training.step``/``training.epoch``, its begin and
end ``CLOCK_MONOTONIC`` timestamps (system-wide, so comparable across
processes) and its threshold; the watchdog reads it. A sequence counter (odd
while a write is in progress, a seqlock) lets the reader discard torn reads.
Two fields live outside the seqlock because another thread writes them, each
with one aligned 8-byte store: the span id the in-process detector has alerted
on (so the watchdog speaks only when the process could not), and the state
(running, or closed cleanly at shutdown). Two more are the watchdog's, written
by it: the span it alerted on and how many alerts it raised, so that a process
that comes back (a GIL released after a long C call) continues the watchdog's
episode as repeats and ends it with the one recovery, instead of opening a
second episode that no recovery would close (issue 29).
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import struct
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Span

from otel_training import semconv as sc
from otel_training._fork import reset_in_child

MAGIC = b"OTTWDG01"
HEADER = struct.Struct("<8sIIqQQQQ")  # magic, version, reserved, pid, state, alerted span id, watchdog's span, count
SLOT = struct.Struct("<QqqqqqQQQBB2x4x64s")  # seq, begin, end, threshold, step, epoch, trace hi/lo, span, has_*, name
SEQ = struct.Struct("<Q")
END = struct.Struct("<q")
WORD = struct.Struct("<Q")
VERSION = 2
STATE_RUNNING = 0
STATE_CLOSED = 1
_STATE_OFFSET = 24
_ALERTED_OFFSET = 32
_WATCHDOG_SPAN_OFFSET = 40
_WATCHDOG_COUNT_OFFSET = 48
_SLOT_OFFSET = HEADER.size
_END_OFFSET = _SLOT_OFFSET + 16
SIZE = HEADER.size + SLOT.size
NAME_BYTES = 64


@dataclasses.dataclass(frozen=True)
class SlotState:
    """A consistent snapshot of the slot."""

    pid: int
    state: int
    alerted_span_id: int
    begin_ns: int
    end_ns: int
    threshold_ns: int
    step: int | None
    epoch: int | None
    trace_id: int
    span_id: int
    name: str

    @property
    def open(self) -> bool:
        """A watched span has begun and not ended."""
        return self.span_id != 0 and self.begin_ns > self.end_ns


def _attribute_int(attributes: Mapping[str, object] | None, key: str) -> int | None:
    value = attributes.get(key) if attributes else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class SlotWriter:
    """The training process's side: a ``Slot`` for ``StuckSpanProcessor``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, SIZE)
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        HEADER.pack_into(self._map, 0, MAGIC, VERSION, 0, os.getpid(), STATE_RUNNING, 0, 0, 0)
        self._seq = 0
        self._span_id = 0
        #: The watchdog process reading this slot, when ``watchdog.start`` made it.
        self.process: subprocess.Popen[bytes] | None = None
        reset_in_child(self, SlotWriter._detach_after_fork)

    def _detach_after_fork(self) -> None:
        # A forked child (a DataLoader worker) must not write the parent's slot,
        # least of all "closed" at its exit, which would stop the parent's watchdog.
        # A private buffer keeps begin/end free of any per-step pid check.
        self._map = mmap.mmap(-1, SIZE)
        self.process = None

    def begin(self, span: Span, parent_context: Context | None, start_s: float, threshold_s: float) -> None:
        context = span.context
        step = _attribute_int(span.attributes, sc.STEP)
        epoch = _attribute_int(span.attributes, sc.EPOCH)  # a device step carries its epoch itself
        if epoch is None and parent_context is not None:
            epoch = _attribute_int(getattr(trace_api.get_current_span(parent_context), "attributes", None), sc.EPOCH)
        self._seq += 1
        SEQ.pack_into(self._map, _SLOT_OFFSET, self._seq)
        SLOT.pack_into(
            self._map, _SLOT_OFFSET, self._seq, int(start_s * 1e9), 0, int(threshold_s * 1e9),
            step or 0, epoch or 0, context.trace_id >> 64, context.trace_id & 0xFFFFFFFFFFFFFFFF, context.span_id,
            step is not None, epoch is not None, span.name.encode("utf-8")[:NAME_BYTES],
        )
        self._seq += 1
        SEQ.pack_into(self._map, _SLOT_OFFSET, self._seq)
        self._span_id = context.span_id

    def end(self, span_id: int) -> None:
        if span_id != self._span_id:
            return  # an older, overlapping span: the slot tracks the newest
        self._seq += 1
        SEQ.pack_into(self._map, _SLOT_OFFSET, self._seq)
        END.pack_into(self._map, _END_OFFSET, time.monotonic_ns())
        self._seq += 1
        SEQ.pack_into(self._map, _SLOT_OFFSET, self._seq)

    def alerted(self, span_id: int) -> None:
        WORD.pack_into(self._map, _ALERTED_OFFSET, span_id)

    def watchdog_alerts(self, span_id: int) -> int:
        """Stuck alerts the watchdog raised on ``span_id`` while this process could not (0: none)."""
        if WORD.unpack_from(self._map, _WATCHDOG_SPAN_OFFSET)[0] != span_id:
            return 0
        return int(WORD.unpack_from(self._map, _WATCHDOG_COUNT_OFFSET)[0])

    def close(self) -> None:
        """Clean shutdown: the watchdog exits without reporting a death."""
        try:
            WORD.pack_into(self._map, _STATE_OFFSET, STATE_CLOSED)
            self._map.flush()
        except ValueError:
            pass  # already closed




class SlotReader:
    """The watchdog's side."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        with open(path, "r+b") as file:  # read, and the two words of its own (``reported``)
            self._map = mmap.mmap(file.fileno(), SIZE, access=mmap.ACCESS_WRITE)
        magic, version = HEADER.unpack_from(self._map, 0)[:2]
        if magic != MAGIC or version != VERSION:
            raise ValueError(f"{path}: not an otel-training watchdog slot (version {VERSION})")

    def read(self) -> SlotState:
        for _ in range(1000):
            before = SEQ.unpack_from(self._map, _SLOT_OFFSET)[0]
            fields = SLOT.unpack_from(self._map, _SLOT_OFFSET)
            # Read after the span's fields: the detector marks a span alerted before it can end it, so a
            # read that sees the end sees the mark too (the watchdog then leaves the recovery to it).
            _, _, pid, state, alerted = HEADER.unpack_from(self._map, 0)[1:6]
            if before % 2 == 0 and SEQ.unpack_from(self._map, _SLOT_OFFSET)[0] == before:
                break
            time.sleep(0.0001)
        (_, begin, end, threshold, step, epoch, trace_hi, trace_lo, span_id, has_step, has_epoch, name) = fields
        return SlotState(pid, state, alerted, begin, end, threshold, step if has_step else None,
                         epoch if has_epoch else None, (trace_hi << 64) | trace_lo, span_id,
                         name.rstrip(b"\0").decode("utf-8", "replace"))

    def reported(self, span_id: int, count: int) -> None:
        """The watchdog raised ``count`` stuck alerts on ``span_id`` (the count first: a reader that sees the
        span sees a count of it)."""
        WORD.pack_into(self._map, _WATCHDOG_COUNT_OFFSET, count)
        WORD.pack_into(self._map, _WATCHDOG_SPAN_OFFSET, span_id)
