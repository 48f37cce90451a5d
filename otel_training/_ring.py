"""A byte ring in shared memory: the training process writes span records, the drain process reads them.

Why: building, processing and exporting OpenTelemetry spans costs the training
process 20-40 µs of CPU a span, and the threads doing it hold the GIL the
training thread needs (docs/offload.md). Writing a record here costs well under
a microsecond; the drain process turns the records into the same spans.

Layout: a header page, then ``capacity`` bytes of records, each a little-endian
``u32`` length and that many bytes (a record may wrap around the end). The
writer and the reader each own one position (monotonic byte counts, kept in the
header on cache lines of their own); a record is published by advancing the
write position after its bytes are in place.

Two implementations of one behaviour, chosen by ``_native_loader``:

- **native** (``native/ring.c`` through ``otel_training._native``): the write
  position is published with a release store and read with an acquire load,
  so it is correct on any CPU (x86-64, aarch64). Writers are serialised by the
  GIL, held across the one C call an append is.
- **fallback** (this file): the same bytes, written from Python. Publishing
  needs stores to become visible in program order, which x86-64 guarantees
  and aarch64 does not (``supported()``). Writers serialise on one
  uncontended lock (no system call).

Either reader never trusts the shared memory: its own position and the
capacity are private copies, and a write position or a record length that
does not fit what was published is counted (``corrupt``) and skipped, never
followed. The waiting and dropping policy is one (``Ring.write``).

The memory is a ``memfd`` handed to the drain as a file descriptor: no name on
any file system, nothing left behind when both processes are gone.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import platform
import struct
import threading
import time
from collections.abc import Callable
from threading import get_ident
from typing import TYPE_CHECKING

from otel_training._native_loader import native as _native

if TYPE_CHECKING:
    from typing import Protocol

    from otel_training.pipeline.records import FastRecords

    class RingCore(FastRecords, Protocol):
        """``_native.RingCore`` (``native/module.c``): the ring's C core, as this module calls it."""

        #: Appends are refused once set.
        closed: bool

        @property
        def read_seen(self) -> int: ...
        @property
        def ends_written(self) -> int: ...
        @property
        def corrupt(self) -> int: ...
        def append(self, payload: bytes, begin: bool | None, /) -> int: ...
        def take(self, max_bytes: int, /) -> list[bytes]: ...
        def load(self, offset: int, /) -> int: ...
        def store(self, offset: int, value: int, /) -> None: ...
        def release(self) -> None: ...

_MAGIC = 0x4F54_5452_494E_4731  # "OTTRING1"
HEADER = 4096
_LEN = struct.Struct("<I")
_U64 = struct.Struct("<Q")

# Header fields: (offset). Writer's fields, reader's fields and the drain's report each on their own line.
_F_MAGIC, _F_CAPACITY = 0, 8
_F_WRITE = 64
_F_READ = 128
#: What the drain reports back: its pid, the last flush it finished, its pipeline's counts, done.
#: ``replayed``: end records replayed; ``orphans``: end records whose begin never came (it was dropped);
#: ``bad``: records that did not decode as a record of their kind (each counted as one span lost);
#: ``caps``: what the drain reads besides marshal records (``CAP_FAST_RECORDS``: the C core's fast records).
DRAIN_FIELDS = {name: 192 + 8 * index for index, name in enumerate(
    ("pid", "flushed", "replayed", "orphans", "exported", "dropped", "pending", "spooled", "done", "lost", "bad",
     "caps"))}
CAP_FAST_RECORDS = 1
#: How often a writer facing a full ring looks again (sleeping also lets the drain run).
_POLL_S = 0.0002
#: A reader that has not advanced for this long while records waited is stalled: nobody waits for it.
STALLED_S = 1.0
#: The seals a ring's memfd carries: its size cannot change while it is mapped.
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
#: ``append`` results, the C binding's and the fallback's alike.
_OK, _FULL, _TOO_BIG, _CLOSED = 0, 1, 2, 3


def supported(mode: str = "auto") -> str | None:
    """None where the ring may be used here with the implementation ``mode`` picks, else why not."""
    if not hasattr(os, "memfd_create") or not hasattr(fcntl, "F_ADD_SEALS"):
        return "no sealed memfd on this platform (Linux only)"
    if _native(mode) is None and platform.machine().lower() not in ("x86_64", "amd64"):
        return (f"the pure-Python ring relies on x86-64 store ordering and this machine is {platform.machine()}; "
                "the C extension (otel_training._native) is correct here: build it, and leave the native option "
                "at auto or on")
    return None


class Ring:
    """One ring: ``create`` in the training process, ``attach`` in the drain to its descriptor."""

    def __init__(self, fd: int, mm: mmap.mmap, create: bool = False, mode: str = "auto") -> None:
        self.fd = fd
        self._mm = mm
        extension = _native(mode)
        #: The C core, or None: this file's Python does the same.
        self._core: RingCore | None = extension.RingCore(mm, create) if extension is not None else None
        if self._core is None and create:
            _U64.pack_into(mm, _F_MAGIC, _MAGIC)
            _U64.pack_into(mm, _F_CAPACITY, len(mm) - HEADER)
        if self._core is None and (len(mm) <= HEADER or _U64.unpack_from(mm, _F_MAGIC)[0] != _MAGIC
                                   or _U64.unpack_from(mm, _F_CAPACITY)[0] != len(mm) - HEADER):
            raise ValueError("the buffer does not hold an otel-training ring")
        self.capacity = len(mm) - HEADER
        self._data = memoryview(mm)[HEADER:HEADER + self.capacity]
        self._lock = threading.Lock()
        self._write: int = _U64.unpack_from(mm, _F_WRITE)[0]
        self._read_seen: int = _U64.unpack_from(mm, _F_READ)[0]
        self._read = self._read_seen  # the reader's own position: never taken back from shared memory
        #: When the reader was last seen to advance (monotonic), and the thread inside a write.
        self._progress_at = time.monotonic()
        self._owner: int | None = None
        self._full_since: float | None = None
        self._closed = False
        self._ends_written = 0
        self._corrupt = 0
        #: The writer's account (read in its own process only): span begin and end records dropped, and
        #: seconds spent waiting for room.
        self.dropped_begins = 0
        self.dropped_ends = 0
        self.waited_s = 0.0
        #: How long a writer waits for room in a full ring, while ``alive()`` (the drain runs).
        self.wait_s = 0.0
        self.alive: Callable[[], bool] = lambda: True

    @property
    def native(self) -> bool:
        """Whether the C core serves this ring."""
        return self._core is not None

    def fast_records(self) -> FastRecords | None:
        """The C core's writer of fast span records (``pipeline.records.FastRecords``), or None on the fallback.

        It writes them only once the drain has said it reads them (``DRAIN_FIELDS["caps"]``); until then, and
        for any span it cannot encode, its ``begin`` and ``end`` return None and the caller writes marshal.
        """
        return self._core

    @classmethod
    def create(cls, capacity: int, mode: str = "auto") -> Ring:
        fd = os.memfd_create("otel-training-ring", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, HEADER + capacity)
        # Its size is final: nobody holding the descriptor can shrink the mapping under a reader (SIGBUS).
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS | fcntl.F_SEAL_SEAL)
        return cls(fd, mmap.mmap(fd, HEADER + capacity), create=True, mode=mode)

    @classmethod
    def attach(cls, fd: int, mode: str = "auto") -> Ring:
        size = os.fstat(fd).st_size
        if size <= HEADER or fcntl.fcntl(fd, fcntl.F_GET_SEALS) & _SEALS != _SEALS:
            raise ValueError(f"file descriptor {fd} does not hold an otel-training ring")
        mm = mmap.mmap(fd, size)
        try:
            return cls(fd, mm, mode=mode)
        except ValueError:
            mm.close()
            raise ValueError(f"file descriptor {fd} does not hold an otel-training ring") from None

    # -- header -------------------------------------------------------------
    def get(self, offset: int) -> int:
        core = self._core
        return core.load(offset) if core is not None else _U64.unpack_from(self._mm, offset)[0]

    def put(self, offset: int, value: int) -> None:
        if self._core is not None:
            self._core.store(offset, value)
        else:
            _U64.pack_into(self._mm, offset, value)

    def used(self) -> int:
        """Bytes written and not yet read."""
        return self.get(_F_WRITE) - self.get(_F_READ)

    @property
    def closed(self) -> bool:
        return self._core.closed if self._core is not None else self._closed

    @property
    def ends_written(self) -> int:
        """End records written (in this process)."""
        return self._core.ends_written if self._core is not None else self._ends_written

    @property
    def corrupt(self) -> int:
        """Reads that found published bytes that did not frame as records (they were skipped)."""
        return self._core.corrupt if self._core is not None else self._corrupt

    # -- writing (training process) ----------------------------------------
    def write(self, payload: bytes, begin: bool | None, deadline: float | None = None) -> bool:
        """Append one record; False when it was dropped (and counted).

        ``begin``: True when the record starts a span (a dropped one loses the span), False when it
        ends one, None for a control record (not counted as a span). A full ring is waited on while
        the reader is alive and reading: for span records at most ``wait_s``, for a control record
        until ``deadline`` (monotonic). The wait holds no lock, so a signal handler that writes the
        records of the spans it ends is never blocked by the write it interrupted. With the C core a
        handler cannot run inside an append (the GIL is held across it); on the fallback, a handler that
        interrupts the few bytecodes of a write itself drops its record (counted) rather than deadlock or
        tear it.
        """
        core = self._core
        status = core.append(payload, begin) if core is not None else self._append_python(payload, begin)
        if status == _OK:
            return True
        if status != _FULL:
            return self._drop(begin)
        return self._wait_for_room(payload, begin, deadline)

    def _wait_for_room(self, payload: bytes, begin: bool | None, deadline: float | None) -> bool:
        started = now = time.monotonic()
        if deadline is None:
            deadline = now + self.wait_s
        if self._full_since is None:
            self._full_since = now
        core = self._core
        while True:
            if now >= deadline or not self.alive() or self.stalled(now):
                self.waited_s += now - started
                return self._drop(begin)
            time.sleep(_POLL_S)
            seen = core.read_seen if core is not None else 0
            status = core.append(payload, begin) if core is not None else self._append_python(payload, begin)
            if core is not None and core.read_seen != seen:
                self._progress_at = time.monotonic()
            now = time.monotonic()
            if status == _OK:
                self.waited_s += now - started
                self._full_since = None
                return True
            if status != _FULL:
                return self._drop(begin)

    def _append_python(self, payload: bytes, begin: bool | None) -> int:
        """The fallback's append: ``_OK``, ``_FULL``, ``_TOO_BIG`` or ``_CLOSED`` (a re-entered write)."""
        me = get_ident()
        if self._owner == me:
            return _CLOSED  # re-entered from a signal handler, mid-write: drop this record
        size = 4 + len(payload)
        if size > self.capacity:
            return _TOO_BIG
        with self._lock:
            self._owner = me
            try:
                if self._closed:
                    return _CLOSED
                if self._write + size - self._read_seen > self.capacity and not self._room(size):
                    return _FULL
                self._append(payload, size)
                if begin is False:
                    self._ends_written += 1
                return _OK
            finally:
                self._owner = None

    def _room(self, size: int) -> bool:
        read: int = _U64.unpack_from(self._mm, _F_READ)[0]
        if read > self._write:  # a damaged header: full, and not kept (the next write looks again)
            return False
        if read != self._read_seen:
            self._read_seen = read
            self._progress_at = time.monotonic()
        return self._write + size - read <= self.capacity

    def stalled(self, now: float) -> bool:
        """The ring has been full for ``STALLED_S`` without the reader reading: it is alive but hung or
        stopped, and nobody waits for it (until it reads again)."""
        since = self._full_since
        return since is not None and now - max(since, self._progress_at) > STALLED_S

    def _append(self, payload: bytes, size: int) -> None:
        write, capacity = self._write, self.capacity
        offset = write % capacity
        if offset + size <= capacity:
            data = self._data
            _LEN.pack_into(data, offset, size - 4)
            data[offset + 4:offset + size] = payload
        else:
            self._put_bytes(write, _LEN.pack(size - 4) + payload)
        self._write = write = write + size
        _U64.pack_into(self._mm, _F_WRITE, write)  # publishes the record (x86-64 store order)

    def _drop(self, begin: bool | None) -> bool:
        if begin:
            self.dropped_begins += 1
        elif begin is False:
            self.dropped_ends += 1
        return False

    def _put_bytes(self, position: int, data: bytes) -> None:
        offset = position % self.capacity
        first = min(len(data), self.capacity - offset)
        self._data[offset:offset + first] = data[:first]
        if first < len(data):
            self._data[:len(data) - first] = data[first:]

    def close_writer(self) -> None:
        """Refuse (and count) every later record: a pipeline shut down, or a drain found dead."""
        self._closed = True
        if self._core is not None:
            self._core.closed = True

    def forget_in_child(self) -> None:
        """In a forked child: the ring is the parent's; write nothing more (the lock may be held: a new one)."""
        self._lock = threading.Lock()
        self._owner = None
        self.close_writer()

    # -- reading (drain process) --------------------------------------------
    def read(self, max_bytes: int = 1 << 20) -> list[bytes]:
        """The records published since the last read (up to about ``max_bytes``), consumed."""
        if self._core is not None:
            return self._core.take(max_bytes)
        start = self._read
        end = _U64.unpack_from(self._mm, _F_WRITE)[0]
        if end < start or end - start > self.capacity:  # no position a writer could publish
            self._corrupt += 1
            if end > start:
                self._consumed(end)
            return []
        records = []
        position = start
        while position < end and position - start < max_bytes:
            available = end - position
            length = _LEN.unpack(self._get_bytes(position, _LEN.size))[0] if available >= _LEN.size else -1
            if length < 0 or length > available - _LEN.size:  # does not frame: skip what was published
                self._corrupt += 1
                position = end
                break
            records.append(self._get_bytes(position + _LEN.size, length))
            position += _LEN.size + length
        if position != start:
            self._consumed(position)
        return records

    def _consumed(self, position: int) -> None:
        self._read = position
        _U64.pack_into(self._mm, _F_READ, position)  # the writer may reuse the space now

    def _get_bytes(self, position: int, size: int) -> bytes:
        offset = position % self.capacity
        first = min(size, self.capacity - offset)
        data = bytes(self._data[offset:offset + first])
        return data + bytes(self._data[:size - first]) if first < size else data

    def close(self) -> None:
        """Unmap and close (the memory is freed once both processes have closed it)."""
        self.close_writer()
        if self._core is not None:
            self._core.release()
        try:
            self._data.release()
            self._mm.close()
        except (BufferError, ValueError):
            pass
        try:
            os.close(self.fd)
        except OSError:
            pass
