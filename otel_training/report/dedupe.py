"""Which spans were read before: what keeps a span written twice counted once, at any distance.

A span is written again by an exporter's retry after a timeout that had in fact delivered (the
same batch, a line later), by a spool replayed (the whole file again, millions of spans later),
by rotated files concatenated or read beside the concatenation. A copy is the same span of the
same process (resource): the same trace and span id, and the same end.

Remembering a key of every span read is what the report cannot afford: in a Python set it took
0.5-0.9 µs more a span (+15-20 % of a worker's 4.1 µs, on the bench's rank files) and 60-90 bytes
a span. So spans are first told apart by the order they are written in (``SeenSpans``), with no
key at all (+2.6 % of a worker's instructions on a file in end order, +4 % on the bench's):

* The exporters write a process's spans nearly in the order they end. A span that ends after
  every span its process wrote before cannot be a copy (its first copy would end when it does);
  the others ("behind": written late, or copies) are looked for by their end, then trace and
  span id, among the process's latest batches (``WINDOW`` spans at least), which hold every
  span read that ends after the end the process had reached before them (its floor).
* A batch is sorted by its ends (nearly sorted: about a comparison a span, in C); only one with
  two spans ending together is checked for a span twice in itself (a set of its span ids).
* A span that ends no later than its process's floor reaches back past what is held: a spool
  replayed, a file read after its concatenation. From then on every span is read by key
  (``KeyStore``): what was read before is read again once (``history``), its keys kept, and
  every later span's key checked and kept: exact at any distance, slower (0.5-1 µs a span).
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from itertools import chain, islice
from operator import itemgetter, lt
from typing import Any

#: Where a span's tuple (``spans.convert``'s) holds its end, span id and trace id.
END, SPAN_ID, TRACE_ID = 2, 3, 6
#: Spans a process's window holds at least (its latest batches): a span written up to this many
#: spans late is looked for among them, and needs no key of every span.
WINDOW = 1024
#: Spans all windows hold together at most (a job's file from a collector has every rank's):
#: the process read the longest ago gives its window up first.
HELD = 65536
#: Keys in each of the key store's two sets of the latest spans, before they go to its compact store.
GENERATION = 16384

Span = tuple[Any, ...]
Entries = Sequence[tuple[Hashable, list[Span]]]
_end, _span_id = itemgetter(END), itemgetter(SPAN_ID)


class _Batch:
    __slots__ = ("ends", "floor", "hi", "spans")

    def __init__(self, floor: int, hi: int, spans: list[Span], ends: list[int]) -> None:
        #: The latest end of the process's spans read before this batch, the latest in it, its spans, their ends.
        self.floor, self.hi, self.spans, self.ends = floor, hi, spans, ends


class _Process:
    """One process's spans as read: the latest end, and its latest batches."""

    __slots__ = ("end", "held", "window")

    def __init__(self) -> None:
        self.end = 0
        self.held = 0
        self.window: deque[_Batch] = deque()

    @property
    def floor(self) -> int:
        """Every span of the process read before its window ends no later than this."""
        return self.window[0].floor if self.window else self.end


class SeenSpans:
    """The spans read so far; ``unique`` keeps the new ones of a request, ``dropped`` counts the others.

    ``history``: every (process, spans) read before the request being read, read again (the
    caller's files up to that request), wanted once if ever a span reaches back past the windows.
    """

    def __init__(self, history: Callable[[], Iterable[tuple[Hashable, list[Span]]]] | None = None) -> None:
        self.history = history or (lambda: ())
        self.processes: dict[Hashable, _Process] = {}
        #: The processes holding a window, the one read the longest ago first, and the spans they hold.
        self.recent: dict[Hashable, _Process] = {}
        self.held = 0
        self.keys: KeyStore | None = None
        self.dropped = 0

    def unique(self, entries: Entries) -> list[list[Span]]:
        """The spans of each (process, spans) of one request not read before, in order."""
        out = []
        for index, (process, spans) in enumerate(entries):
            kept = self._ordered(process, spans) if self.keys is None else None
            if kept is None:
                if self.keys is None:
                    self._by_key(entries[:index])
                kept = self._keyed(process, spans)
            out.append(kept)
        return out

    def _ordered(self, process: Hashable, spans: list[Span]) -> list[Span] | None:
        """``spans`` not read before, or None (nothing changed) when one reaches back past the window."""
        if not spans:
            return spans
        state = self.processes.get(process)
        if state is None:
            state = self.processes[process] = _Process()
        ends = list(map(_end, spans))
        ordered = sorted(ends)  # nearly sorted already: about one comparison a span, in C
        if ordered[0] <= state.floor:
            return None
        kept = spans
        # Two copies of a span end together: only a batch with two spans ending together is looked into.
        if not all(map(lt, ordered, islice(ordered, 1, None))) and len(set(map(_span_id, spans))) != len(spans):
            kept = _distinct(spans)
            ends = list(map(_end, kept))
            ordered = sorted(ends)
        behind = bisect_right(ordered, state.end)
        if behind:
            kept = _behind(state, kept, ends, set(ordered[:behind]))
        hi = ordered[-1]
        if kept is not spans:
            self.dropped += len(spans) - len(kept)
            if not kept:
                return kept
            ends = list(map(_end, kept))
            hi = max(ends)
        window = state.window
        window.append(_Batch(state.end, hi, kept, ends))
        state.held += len(kept)
        self.held += len(kept)
        state.end = max(state.end, hi)
        while state.held - len(window[0].spans) >= WINDOW:
            self._forget(state, window.popleft())
        self.recent.pop(process, None)
        self.recent[process] = state
        while self.held > HELD:
            oldest = next(iter(self.recent))
            other = self.recent.pop(oldest)
            while other.window:
                self._forget(other, other.window.popleft())
        return kept

    def _forget(self, state: _Process, batch: _Batch) -> None:
        state.held -= len(batch.spans)
        self.held -= len(batch.spans)

    def _by_key(self, earlier: Entries) -> None:
        """From now on by key: the keys of every span read before this request and of ``earlier`` in it."""
        keys = self.keys = KeyStore()
        for process, spans in chain(self.history(), earlier):
            keys.unique(spans, _keys(process, spans))
        self.processes.clear()
        self.recent.clear()
        self.held = 0

    def _keyed(self, process: Hashable, spans: list[Span]) -> list[Span]:
        assert self.keys is not None
        kept = self.keys.unique(spans, _keys(process, spans))
        self.dropped += len(spans) - len(kept)
        return kept


def _distinct(spans: list[Span]) -> list[Span]:
    """``spans`` without a span a second time (spans without a span id are never the same span)."""
    seen: set[tuple[str, str]] = set()
    kept = []
    for span in spans:
        if span[SPAN_ID]:
            key = (span[TRACE_ID], span[SPAN_ID])
            if key in seen:
                continue
            seen.add(key)
        kept.append(span)
    return kept


def _behind(state: _Process, spans: list[Span], ends: list[int], behind: set[int]) -> list[Span]:
    """``spans`` (``ends``: theirs, all later than the floor) not in the process's window.

    Those ending after the process's latest end are new; the others (``behind``: their ends; a
    few, in a file written in end order) are found by their end, in C, among the ends of the
    window's batches that reach it.
    """
    copies = set()
    for end in behind:
        for index in _positions(ends, end):
            span = spans[index]
            if span[SPAN_ID] and _in_window(state, end, span[TRACE_ID], span[SPAN_ID]):
                copies.add(index)
    return [span for index, span in enumerate(spans) if index not in copies] if copies else spans


def _positions(ends: list[int], end: int) -> Iterator[int]:
    """Where ``end`` is in ``ends``."""
    index = -1
    try:
        while True:
            index = ends.index(end, index + 1)
            yield index
    except ValueError:
        return


def _in_window(state: _Process, end: int, trace_id: str, span_id: str) -> bool:
    for batch in state.window:
        if batch.hi >= end:
            for index in _positions(batch.ends, end):
                other = batch.spans[index]
                if other[SPAN_ID] == span_id and other[TRACE_ID] == trace_id:
                    return True
    return False


def _keys(process: Hashable, spans: list[Span]) -> list[int | None]:
    """64-bit keys: Python's hash (keyed SipHash: crafted or sequential ids do not collide) of the ids and
    the process. Two distinct spans take one key with probability n²/2⁶⁵ among n: 7·10⁻⁵ at 50M."""
    scope = hash(process)
    return [hash((scope, span[TRACE_ID], span[SPAN_ID])) if span[SPAN_ID] else None for span in spans]


class KeyStore:
    """The keys of the spans read, in memory that grows by 8 bytes a key while nothing reaches back far.

    The latest keys are in two Python sets of ``GENERATION`` keys at most, checked and filled a
    batch at a time in C. Older keys go to an ``array('q')``, searched only for a span that ends
    no later than the latest end they hold (its copy would end when it does); the first such
    search makes the array an open-addressing table (``array('q')``, at most half full: 16 to 32
    bytes a key) probed in Python, about 0.3 µs a span. A Python set there would take 60-90 bytes
    a key: 4 GB for a replayed file of 50M spans, against 0.8-1.6 GB.
    """

    def __init__(self, generation: int | None = None) -> None:
        self.generation = generation or GENERATION
        self.current: set[int] = set()
        self.previous: set[int] = set()
        #: The latest end among the spans of each set; 0 for none.
        self.current_end = 0
        self.previous_end = 0
        #: Keys older than both sets, as read, and the latest end among them.
        self.older = array("q")
        self.older_end = 0
        #: ``older`` as an open-addressing table, built the first time a span reaches back to it.
        self.table: array[int] | None = None
        self._used = 0

    def unique(self, spans: list[Span], keys: list[int | None]) -> list[Span]:
        """``spans`` not read before (``keys[i]`` is ``spans[i]``'s, None without a span id), in order."""
        if not spans:
            return spans
        first = min(map(_end, spans))
        if first > self.previous_end and first > self.older_end and None not in keys:
            current = self.current
            if first > self.current_end or current.isdisjoint(keys):
                size = len(current)
                current.update(keys)  # type: ignore[arg-type]  # no None: checked above
                if len(current) - size == len(keys):
                    self.current_end = max(self.current_end, *map(_end, spans))
                    if len(current) >= self.generation:
                        self._age()
                    return spans
                current.difference_update(keys)  # a span twice in this batch: undone, read one by one
        return self._one_by_one(spans, keys)

    def _one_by_one(self, spans: list[Span], keys: list[int | None]) -> list[Span]:
        kept = []
        for span, key in zip(spans, keys):
            if key is None:  # no span id: nothing to know it by (the in-memory reader keeps these too)
                kept.append(span)
                continue
            end: int = span[END]
            # A copy ends when its span does: a set holding only earlier ends cannot hold it.
            if ((end <= self.current_end and key in self.current)
                    or (end <= self.previous_end and key in self.previous)
                    or (end <= self.older_end and self._older_has(key))):
                continue
            self.current.add(key)
            self.current_end = max(self.current_end, end)
            kept.append(span)
            if len(self.current) >= self.generation:
                self._age()
        return kept

    def _age(self) -> None:
        """The previous set's keys to the compact store; the current set becomes the previous."""
        if self.table is not None:
            for key in self.previous:
                self._insert(key)
        else:
            self.older.extend(self.previous)
        self.older_end = max(self.older_end, self.previous_end)
        self.previous, self.previous_end = self.current, self.current_end
        self.current, self.current_end = set(), 0

    def _older_has(self, key: int) -> bool:
        table = self.table if self.table is not None else self._build()
        key = key or 1  # 0 marks an empty slot
        mask = len(table) - 1
        index = key & mask
        while (value := table[index]) != 0:
            if value == key:
                return True
            index = (index + 1) & mask
        return False

    def _build(self) -> array[int]:
        """The table of ``older``'s keys, which it replaces (the array is freed)."""
        older, self.older = self.older, array("q")
        self._resize(len(older))
        for key in older:
            self._insert(key)
        assert self.table is not None
        return self.table

    def _resize(self, keys: int) -> None:
        size = 1 << max(10, (2 * keys - 1).bit_length())  # at most half full
        old, self.table, self._used = self.table, array("q", bytes(8 * size)), 0
        for key in old or ():
            if key:
                self._insert(key)

    def _insert(self, key: int) -> None:
        table = self.table
        assert table is not None
        if 2 * (self._used + 1) > len(table):
            self._resize(2 * (self._used + 1))
            table = self.table
            assert table is not None
        key = key or 1
        mask = len(table) - 1
        index = key & mask
        while (value := table[index]) != 0:
            if value == key:
                return
            index = (index + 1) & mask
        table[index] = key
        self._used += 1
