"""A span exporter wrapper that accounts for every span and can be cut loose.

The SDK's batch processor neither counts what its exporter failed to deliver nor
bounds a flush, so ``Telemetry`` wraps the real exporter in this: it counts
spans delivered and failed, turns exceptions into failures (logged once), and
after ``close()`` refuses further batches at once, which is how a shutdown
against an unreachable collector is kept within its deadline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_training._contain import log_once


#: An export running longer than this is a collector that hangs, not one that is slow.
STALLED_S = 1.0


class GuardedSpanExporter(SpanExporter):
    def __init__(self, exporter: SpanExporter, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.exporter = exporter
        self.exported = 0
        self.failed = 0
        self.in_flight = 0
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._clock = clock
        self._export_started: float | None = None
        self._last_failed = False

    def progressing(self) -> bool:
        """Whether waiting for this exporter is worth it: open, its last export delivered, and
        the one under way (if any) not stalled."""
        started = self._export_started
        return (not self._closed.is_set() and not self._last_failed
                and (started is None or self._clock() - started < STALLED_S))

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        count = len(spans)
        if self._closed.is_set():
            with self._lock:
                self.failed += count
            return SpanExportResult.FAILURE
        with self._lock:
            self.in_flight = count
            self._export_started = self._clock()
        try:
            result = self.exporter.export(spans)
        except Exception:  # noqa: BLE001
            log_once(f"export:{type(self.exporter).__name__}", "otel_training: span exporter %s raised",
                     type(self.exporter).__name__)
            result = SpanExportResult.FAILURE
        with self._lock:
            self.in_flight = 0
            self._export_started = None
            self._last_failed = result is not SpanExportResult.SUCCESS
            if result is SpanExportResult.SUCCESS:
                self.exported += count
            else:
                self.failed += count
        return result

    def close(self) -> None:
        """Refuse every later batch and interrupt the wrapped exporter's retries."""
        if self._closed.is_set():
            return
        self._closed.set()
        try:
            self.exporter.shutdown()
        except Exception:  # noqa: BLE001
            log_once(f"shutdown:{type(self.exporter).__name__}", "otel_training: exporter shutdown raised")

    def shutdown(self) -> None:
        self.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        if self._closed.is_set():
            return False
        try:
            return self.exporter.force_flush(timeout_millis)
        except Exception:  # noqa: BLE001
            log_once(f"flush:{type(self.exporter).__name__}", "otel_training: exporter force_flush raised")
            return False
