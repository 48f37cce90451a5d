"""The CUDA device of the device timeline (``events.device``): timing events, calibrated to the wall clock.

On the training thread a marker is one ``cudaEventRecord`` of a pooled timing
event on the current stream: no synchronisation, no allocation after warm-up.

On the resolver thread, ``cudaEventQuery`` says whether a marker completed, and
``cudaEventElapsedTime`` from an *anchor* event gives when, on the device's own
clock (0.5 µs resolution). The anchor's wall-clock time is taken Cristian-style:
record it on an idle side stream, synchronise, and take the midpoint of the
wall-clock reads around it, best of three. Re-anchoring every
``ANCHOR_EVERY_S`` keeps the float32 milliseconds of ``elapsed_time`` at about
1 µs and the drift between the two clocks out of the figures.

CUDA graph capture: a marker recorded inside a capture would be captured into
the graph, so nothing is recorded while the current stream captures; and as a
query from another thread can invalidate a capture in torch's default "global"
capture mode, the resolver does not query while any ``CUDAGraph`` captures
(``capture_begin``/``capture_end`` are wrapped to count them, under a lock the
query also takes).
"""

from __future__ import annotations

import collections
import functools
import threading
import time
from typing import Any

#: Seconds between re-anchoring the device clock to the wall clock.
ANCHOR_EVERY_S = 10.0
_capture_lock = threading.Lock()
_captures = [0]  # CUDAGraph captures in progress, in any thread


class CudaDevice:
    """The current CUDA device; one stream order per step (the current stream's)."""

    def __init__(self, cuda: Any) -> None:
        self._cuda = cuda
        self.index: int = cuda.current_device()
        self.label = f"cuda:{self.index}"
        self.name: str = cuda.get_device_name(self.index)
        self._pool: collections.deque[Any] = collections.deque()
        self._side = cuda.Stream(device=self.index)
        self._anchor: tuple[Any, int] | None = None
        self._previous_anchor: tuple[Any, int] | None = None
        self._anchored_at = float("-inf")
        _guard_graph_capture(cuda)

    @classmethod
    def current(cls) -> CudaDevice | None:
        import torch

        if not torch.cuda.is_available():
            return None
        return cls(torch.cuda)

    # -- the training thread -----------------------------------------------
    def record(self) -> Any | None:
        cuda = self._cuda
        if _captures[0] or cuda.is_current_stream_capturing():
            return None
        stream = cuda.current_stream()
        if stream.device_index != self.index:
            return None  # another device is current: this step is timed on the host
        try:
            event = self._pool.pop()
        except IndexError:
            event = cuda.Event(enable_timing=True)
        event.record(stream)
        return event

    # -- the resolver thread -------------------------------------------------
    def completed_ns(self, event: Any) -> int | None:
        with _capture_lock:
            if _captures[0] or not event.query():
                return None
            if time.monotonic() - self._anchored_at >= ANCHOR_EVERY_S:
                self._reanchor()
            anchor, anchor_ns = self._anchor  # type: ignore[misc]
            elapsed_ms = anchor.elapsed_time(event)
            if elapsed_ms < 0 and self._previous_anchor is not None:
                # Completed before the newest anchor: measure from the one before.
                anchor, anchor_ns = self._previous_anchor
                elapsed_ms = anchor.elapsed_time(event)
        return anchor_ns + int(elapsed_ms * 1e6)

    def _reanchor(self) -> None:
        best: tuple[int, Any, int] | None = None
        for _ in range(3):
            event = self._cuda.Event(enable_timing=True)
            before = time.time_ns()
            event.record(self._side)
            event.synchronize()
            after = time.time_ns()
            if best is None or after - before < best[0]:
                best = (after - before, event, (before + after) // 2)
        assert best is not None
        self._previous_anchor = self._anchor
        self._anchor = (best[1], best[2])
        self._anchored_at = time.monotonic()

    def release(self, event: Any) -> None:
        if len(self._pool) < 64:
            self._pool.append(event)


def _guard_graph_capture(cuda: Any) -> None:
    """Count CUDAGraph captures, so the resolver never queries during one (once per process)."""
    graph = getattr(getattr(cuda, "graphs", None), "CUDAGraph", None)
    if graph is None or getattr(graph, "_otel_training_guarded", False):
        return
    begin, end = graph.capture_begin, graph.capture_end

    @functools.wraps(begin)
    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _capture_lock:
            _captures[0] += 1
        try:
            return begin(self, *args, **kwargs)
        except BaseException:
            _captures[0] = max(0, _captures[0] - 1)
            raise

    @functools.wraps(end)
    def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return end(self, *args, **kwargs)
        finally:
            _captures[0] = max(0, _captures[0] - 1)

    graph.capture_begin, graph.capture_end = capture_begin, capture_end
    graph._otel_training_guarded = True
