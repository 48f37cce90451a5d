"""A byte ring in shared memory: the training process writes span records, the drain process reads them.

Why: building, processing and exporting OpenTelemetry spans costs the training
process 20-40 µs of CPU a span, and the threads doing it hold the GIL the
training thread needs (docs/offload.md). Writing a record here costs about a
microsecond; the drain process turns the records into the same spans.

Layout: a header page, then ``capacity`` bytes of records, each a little-endian
``u32`` length and that many bytes (a record may wrap around the end). The
writer and the reader each own one position (monotonic byte counts, kept in the
header on cache lines of their own); a record is published by advancing the
write position after its bytes are in place. That needs stores to become
visible in program order, which x86-64 guarantees (``supported()`` says where
the ring may be used). Writers in the training process serialise on one
uncontended lock (no system call); there is one reader.

The memory is a ``memfd`` handed to the drain as a file descriptor: no name on
any file system, nothing left behind when both processes are gone.
"""

from __future__ import annotations

import mmap
import os
import platform
import struct
import threading
import time
from collections.abc import Callable

_MAGIC = 0x4F54_5452_494E_4731  # "OTTRING1"
HEADER = 4096
_LEN = struct.Struct("<I")
_U64 = struct.Struct("<Q")

# Header fields: (offset). Writer's fields, reader's fields and the drain's report each on their own line.
_F_MAGIC, _F_CAPACITY = 0, 8
_F_WRITE = 64
_F_READ = 128
#: What the drain reports back: its pid, the last flush it finished, its pipeline's counts, done.
#: ``replayed``: end records replayed; ``orphans``: end records whose begin never came (it was dropped).
DRAIN_FIELDS = {name: 192 + 8 * index for index, name in enumerate(
    ("pid", "flushed", "replayed", "orphans", "exported", "dropped", "pending", "spooled", "done", "lost"))}
#: How often a writer facing a full ring looks again (sleeping also lets the drain run).
_POLL_S = 0.0002


def supported() -> str | None:
    """None where the ring may be used here, else why not."""
    if not hasattr(os, "memfd_create"):
        return "no memfd_create on this platform (Linux only)"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the ring relies on x86-64 store ordering; this machine is {platform.machine()}"
    return None


class Ring:
    """One ring: ``create`` in the training process, ``attach`` in the drain to its descriptor."""

    def __init__(self, fd: int, mm: mmap.mmap) -> None:
        self.fd = fd
        self._mm = mm
        self.capacity = _U64.unpack_from(mm, _F_CAPACITY)[0]
        self._data = memoryview(mm)[HEADER:HEADER + self.capacity]
        self._lock = threading.Lock()
        self._write = _U64.unpack_from(mm, _F_WRITE)[0]
        self._read_seen = _U64.unpack_from(mm, _F_READ)[0]
        self.closed = False
        #: The writer's account (read in its own process only): span begin and end records dropped,
        #: end records written, and seconds spent waiting for room.
        self.dropped_begins = 0
        self.dropped_ends = 0
        self.ends_written = 0
        self.waited_s = 0.0
        #: How long a writer waits for room in a full ring, while ``alive()`` (the drain runs).
        self.wait_s = 0.0
        self.alive: Callable[[], bool] = lambda: True

    @classmethod
    def create(cls, capacity: int) -> Ring:
        fd = os.memfd_create("otel-training-ring", getattr(os, "MFD_CLOEXEC", 1))
        os.ftruncate(fd, HEADER + capacity)
        mm = mmap.mmap(fd, HEADER + capacity)
        _U64.pack_into(mm, _F_MAGIC, _MAGIC)
        _U64.pack_into(mm, _F_CAPACITY, capacity)
        return cls(fd, mm)

    @classmethod
    def attach(cls, fd: int) -> Ring:
        size = os.fstat(fd).st_size
        mm = mmap.mmap(fd, size)
        if size <= HEADER or _U64.unpack_from(mm, _F_MAGIC)[0] != _MAGIC:
            raise ValueError(f"file descriptor {fd} does not hold an otel-training ring")
        return cls(fd, mm)

    # -- header -------------------------------------------------------------
    def get(self, offset: int) -> int:
        return _U64.unpack_from(self._mm, offset)[0]

    def put(self, offset: int, value: int) -> None:
        _U64.pack_into(self._mm, offset, value)

    def used(self) -> int:
        """Bytes written and not yet read."""
        return self.get(_F_WRITE) - self.get(_F_READ)

    # -- writing (training process) ----------------------------------------
    def write(self, payload: bytes, begin: bool | None) -> bool:
        """Append one record; False when it was dropped (counted in the header).

        ``begin``: True when the record starts a span (a dropped one loses the span), False when it
        ends one (counted apart: the drain then holds a span that never ends), None for a control
        record (not counted). A full ring is waited on for at most ``wait_s`` while ``alive()``,
        else the record is dropped at once.
        """
        length = len(payload)
        size = 4 + length
        capacity = self.capacity
        with self._lock:
            write = self._write
            if self.closed or (write + size - self._read_seen > capacity and not self._make_room(write + size)):
                return self._drop(begin)
            offset = write % capacity
            if offset + size <= capacity:
                data = self._data
                _LEN.pack_into(data, offset, length)
                data[offset + 4:offset + size] = payload
            else:
                self._put_bytes(write, _LEN.pack(length) + payload)
            self._write = write = write + size
            _U64.pack_into(self._mm, _F_WRITE, write)  # publishes the record
            if begin is False:
                self.ends_written += 1
            return True

    def _make_room(self, needed: int) -> bool:
        self._read_seen = _U64.unpack_from(self._mm, _F_READ)[0]
        return needed - self._read_seen <= self.capacity or self._wait_for(needed)

    def _wait_for(self, needed: int) -> bool:
        if needed - self._write > self.capacity:
            return False  # a record bigger than the whole ring never fits
        wait_s, alive = self.wait_s, self.alive
        started = time.monotonic()
        deadline = started + wait_s
        room = False
        while wait_s > 0 and alive():
            time.sleep(_POLL_S)
            self._read_seen = _U64.unpack_from(self._mm, _F_READ)[0]
            if needed - self._read_seen <= self.capacity:
                room = True
                break
            if time.monotonic() >= deadline:
                break
        self.waited_s += time.monotonic() - started
        return room

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
        """Refuse (and count) every later record: a forked child, or a pipeline shut down."""
        with self._lock:
            self.closed = True

    # -- reading (drain process) --------------------------------------------
    def read(self, max_bytes: int = 1 << 20) -> list[bytes]:
        """The records published since the last read (up to about ``max_bytes``), consumed."""
        read = _U64.unpack_from(self._mm, _F_READ)[0]
        end = _U64.unpack_from(self._mm, _F_WRITE)[0]
        records = []
        position = read
        while position < end and position - read < max_bytes:
            (length,) = _LEN.unpack(self._get_bytes(position, _LEN.size))
            records.append(self._get_bytes(position + _LEN.size, length))
            position += _LEN.size + length
        if position != read:
            _U64.pack_into(self._mm, _F_READ, position)  # the writer may reuse the space now
        return records

    def _get_bytes(self, position: int, size: int) -> bytes:
        offset = position % self.capacity
        first = min(size, self.capacity - offset)
        data = bytes(self._data[offset:offset + first])
        return data + bytes(self._data[:size - first]) if first < size else data

    def close(self) -> None:
        """Unmap and close (the memory is freed once both processes have closed it)."""
        self.closed = True
        try:
            self._data.release()
            self._mm.close()
        except (BufferError, ValueError):
            pass
        try:
            os.close(self.fd)
        except OSError:
            pass
