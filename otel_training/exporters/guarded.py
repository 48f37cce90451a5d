"""A span exporter wrapper that accounts for every span and can be cut loose.

The SDK's batch processor neither counts what its exporter failed to deliver nor
bounds a flush, so ``Telemetry`` wraps the real exporter in this: it counts
spans delivered and failed, turns exceptions into failures (logged once), and
after ``close()`` refuses further batches at once, which is how a shutdown
against an unreachable collector is kept within its deadline.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_training._contain import log_once


class GuardedSpanExporter(SpanExporter):
    def __init__(self, exporter: SpanExporter) -> None:
        self.exporter = exporter
        self.exported = 0
        self.failed = 0
        self.in_flight = 0
        self._closed = threading.Event()
        self._lock = threading.Lock()

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
        try:
            result = self.exporter.export(spans)
        except Exception:  # noqa: BLE001
            log_once(f"export:{type(self.exporter).__name__}", "otel_training: span exporter %s raised",
                     type(self.exporter).__name__)
            result = SpanExportResult.FAILURE
        with self._lock:
            self.in_flight = 0
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
