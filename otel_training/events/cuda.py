"""The CUDA device of the device timeline (``events.device``): timing events, calibrated to the wall clock.

On the training thread a marker is one ``cudaEventRecord`` of a pooled timing
event on the current stream: no synchronisation, no allocation after warm-up.
The device-generic ``torch.Event`` (torch >= 2.4) records on the current stream
from C++; ``torch.cuda.Event`` first builds a Python ``Stream`` object for it,
which costs more than the record itself (``bench/bench_device.py --cuda``
measures both: 4.8 against 15.0 µs a step on an H100). The ``device_events``
option keeps the older one.

On the resolver thread, ``cudaEventQuery`` says whether a marker completed, and
``cudaEventElapsedTime`` from an *anchor* event gives when, on the device's own
clock (0.5 µs resolution; negative for a marker that completed before the
anchor). The anchor's wall-clock time is bracketed Cristian-style: record it on
a side stream and poll it, without ever synchronising, for at most
``ANCHOR_WAIT_S``; the wall-clock reads before the record and after the first
query that saw it complete bound its completion. Only a bracket narrower than
``ANCHOR_MAX_BRACKET_S`` is kept (its midpoint is then within half of that): the
side stream comes from torch's stream pool and may be shared with a busy NCCL or
FSDP stream, which makes the bracket wide and the sample useless, never wrong or
blocking. Re-anchoring every ``ANCHOR_EVERY_S`` keeps the float32 milliseconds of
``elapsed_time`` at about 1 µs and clock drift out of the figures. Until a first
good anchor, a marker's own poll bracket stands in.

CUDA graph capture: a marker recorded inside a capture would be captured into
the graph, so nothing is recorded while the current stream captures; and as a
query from another thread can invalidate a capture in torch's default "global"
capture mode, the resolver does not query while any graph captures
(``capture_begin`` and every way a capture ends are wrapped to count captures,
under a lock each query also takes, never held across a wait).
"""

from __future__ import annotations

import collections
import functools
import sys
import threading
import time
from typing import Any

#: Seconds between re-anchoring the device clock to the wall clock.
ANCHOR_EVERY_S = 10.0
#: Longest a calibration sample waits for its anchor event, and the widest bracket kept.
ANCHOR_WAIT_S = 0.002
ANCHOR_MAX_BRACKET_S = 0.0002
_capture_lock = threading.Lock()
_captures = [0]  # graph captures in progress, in any thread
#: Told of each capture's begin (+1) and end (-1), under the lock: the native resolver (``device_native.py``),
#: whose thread must not query either while a graph is captured.
capture_listeners: list[Any] = []


class CudaDevice:
    """The current CUDA device; one stream order per step (the current stream's)."""

    def __init__(self, cuda: Any, events: str = "torch", generic: tuple[Any, Any] | None = None) -> None:
        """``events``: "torch" (the device-generic ``torch.Event``, where torch has it) or "torch.cuda"
        (``torch.cuda.Event``): the ``device_events`` option. ``generic``: the device-generic (Event,
        Stream) types; torch's by default (tests pass stand-ins).
        """
        self._cuda = cuda
        self.index: int = cuda.current_device()
        self.label = f"cuda:{self.index}"
        self.name: str = cuda.get_device_name(self.index)
        self._pool: collections.deque[Any] = collections.deque()
        if events not in ("torch", "torch.cuda"):
            raise ValueError(f"device_events={events!r}: expected 'torch' or 'torch.cuda'")
        if generic is None:
            torch = sys.modules.get("torch")
            generic = (getattr(torch, "Event", None), getattr(torch, "Stream", None))
        event_type, stream_type = generic
        self.events = "torch" if events == "torch" and event_type is not None and stream_type is not None \
            else "torch.cuda"
        if self.events == "torch":
            self._new_event = functools.partial(event_type, self.label, enable_timing=True)
            self._side = stream_type(self.label)
        else:
            self._new_event = functools.partial(cuda.Event, enable_timing=True)
            self._side = cuda.Stream(device=self.index)
        self._anchor: tuple[Any, int] | None = None
        self._anchored_at = float("-inf")
        self._polled_ns: dict[int, int] = {}  # id(marker) -> wall clock of its last incomplete query
        torch_c = getattr(sys.modules.get("torch"), "_C", None)
        #: torch's raw current-stream handle (torch >= 1.10), for the native resolver: no Stream object is made.
        self._raw_stream = getattr(torch_c, "_cuda_getCurrentRawStream", None) or (
            lambda index: cuda.current_stream(index).cuda_stream)
        _guard_graph_capture(cuda)

    @classmethod
    def current(cls, events: str = "torch") -> CudaDevice | None:
        import torch

        if not torch.cuda.is_available():
            return None
        return cls(torch.cuda, events)

    # -- the training thread -----------------------------------------------
    def record(self) -> Any | None:
        cuda = self._cuda
        if _captures[0] or cuda.is_current_stream_capturing():
            return None
        if self.events == "torch":
            if cuda.current_device() != self.index:
                return None  # another device is current: this step is timed on the host
            stream = None  # torch.Event records on the current device's current stream, in C++
        else:
            stream = cuda.current_stream()
            if stream.device_index != self.index:
                return None
        try:
            event = self._pool.pop()
        except IndexError:
            event = self._new_event()
        event.record(stream)
        return event

    def raw_stream(self) -> int | None:
        """The current stream's driver handle, for the native resolver (``device_native.py``) to record a marker
        on from C; None where this step is timed on the host (a capture anywhere, another device current)."""
        cuda = self._cuda
        if _captures[0] or cuda.current_device() != self.index:
            return None
        return int(self._raw_stream(self.index))

    # -- the resolver thread -------------------------------------------------
    def completed_ns(self, event: Any) -> int | None:
        before = time.time_ns()
        done = self._query(event)
        if not done:
            if done is False:  # really queried (not skipped for a capture): a lower bound
                self._polled_ns[id(event)] = before
            return None
        after = time.time_ns()
        last_incomplete = self._polled_ns.pop(id(event), None)
        if time.monotonic() - self._anchored_at >= ANCHOR_EVERY_S:
            self._reanchor()
        if self._anchor is None:
            # No good anchor yet: the marker's own bracket (its last incomplete query, this one).
            self._anchor = (event, (last_incomplete + after) // 2 if last_incomplete is not None else after)
            self._anchored_at = time.monotonic() - ANCHOR_EVERY_S + 1.0  # try a real one again in 1 s
        anchor, anchor_ns = self._anchor
        if anchor is event:
            return anchor_ns
        with _capture_lock:
            if _captures[0]:
                return None
            elapsed_ms = anchor.elapsed_time(event)
        return anchor_ns + int(elapsed_ms * 1e6)

    def _query(self, event: Any) -> bool | None:
        """Whether ``event`` completed; None when not asked (a graph is being captured)."""
        with _capture_lock:
            return None if _captures[0] else bool(event.query())

    def _reanchor(self) -> None:
        """Up to three bounded samples; the narrowest bracket under the limit becomes the anchor."""
        best: tuple[int, Any, int] | None = None
        for _ in range(3):
            event = self._new_event()
            with _capture_lock:
                if _captures[0]:
                    return
                before = time.time_ns()
                event.record(self._side)
            deadline = before + int(ANCHOR_WAIT_S * 1e9)
            while not self._query(event):
                if time.time_ns() > deadline:
                    self._anchored_at = time.monotonic()
                    return  # the side stream is busy (shared): try again at the next interval
            after = time.time_ns()
            if after - before <= ANCHOR_MAX_BRACKET_S * 1e9 and (best is None or after - before < best[0]):
                best = (after - before, event, (before + after) // 2)
        self._anchored_at = time.monotonic()  # a failed round waits for the next interval too
        if best is not None:
            self._anchor = (best[1], best[2])

    def release(self, event: Any) -> None:
        self._polled_ns.pop(id(event), None)
        anchor = self._anchor
        if len(self._pool) < 64 and (anchor is None or anchor[0] is not event):
            self._pool.append(event)


def _guard_graph_capture(cuda: Any) -> None:
    """Count graph captures, so the resolver never queries during one (once per class and process).

    Every way a capture ends is wrapped (``capture_end``, and ``capture_end_pre``, which
    ``torch.cuda.graph`` calls alone when entering it fails); a per-graph flag makes the count
    drop once per capture whichever of them ran.
    """
    import sys

    classes = [getattr(getattr(cuda, "graphs", None), "CUDAGraph", None)]
    accelerator = sys.modules.get("torch.accelerator")
    classes.append(getattr(accelerator, "Graph", None))
    for graph in classes:
        if graph is not None and graph not in _GUARDED:
            _guard(graph)


def _guard(graph: type) -> None:
    def counted_begin(begin: Any) -> Any:
        @functools.wraps(begin)
        def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
            with _capture_lock:
                _captures[0] += 1
                for listener in capture_listeners:
                    listener(1)
            _CAPTURING.add(id(self))
            try:
                return begin(self, *args, **kwargs)
            except BaseException:
                _uncount(self)
                raise

        return capture_begin

    def counted_end(end: Any) -> Any:
        @functools.wraps(end)
        def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return end(self, *args, **kwargs)
            finally:
                _uncount(self)

        return capture_end

    for name, wrap in (("capture_begin", counted_begin), ("capture_end", counted_end),
                       ("capture_end_pre", counted_end)):
        original = getattr(graph, name, None)
        if original is not None:
            setattr(graph, name, wrap(original))
    _GUARDED.add(graph)


#: The graph classes guarded already (each class once, a subclass on its own: its methods may be its own).
_GUARDED: set[type] = set()


_CAPTURING: set[int] = set()


def _uncount(graph: Any) -> None:
    with _capture_lock:
        if id(graph) in _CAPTURING:
            _CAPTURING.discard(id(graph))
            _captures[0] = max(0, _captures[0] - 1)
            for listener in capture_listeners:
                listener(-1)
