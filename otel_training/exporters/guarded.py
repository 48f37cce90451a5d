"""A span exporter wrapper that accounts for every span and can be cut loose.

The SDK's batch processor neither counts what its exporter failed to deliver nor
bounds a flush, so ``Telemetry`` wraps the real exporter in this: it counts
spans delivered and failed, turns exceptions into failures (logged once), and
after ``close()`` refuses further batches at once, which is how a shutdown
against an unreachable collector is kept within its deadline.

Given a ``Spool``, a batch the exporter failed (or refused after ``close()``)
is spooled instead of lost. After a failure the guard spools the following
batches at once, without trying the collector, and tries it again with one
batch every ``probe_interval_s``: each try against a collector that is gone
holds the batch worker for the exporter's whole retry budget
(``OTEL_EXPORTER_OTLP_TIMEOUT``, 10 s), during which the queue fills.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_training._contain import contain, log_once
from otel_training.exporters.spool import Spool

#: An export running longer than this is a collector that hangs, not one that is slow.
STALLED_S = 1.0
#: With a spool, how often a collector that failed is tried again (with one batch).
PROBE_INTERVAL_S = 30.0


class GuardedSpanExporter(SpanExporter):
    def __init__(self, exporter: SpanExporter, *, spool: Spool | None = None,
                 probe_interval_s: float = PROBE_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.exporter = exporter
        self.exported = 0
        self.failed = 0
        #: Spans written to the spool instead of the collector.
        self.spooled = 0
        self.in_flight = 0
        self.spool = spool
        self._probe_interval_s = probe_interval_s
        self._next_probe = 0.0
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._clock = clock
        self._export_started: float | None = None
        self._last_failed = False
        #: ``export``'s containment, made once: its key and message depend only on the exporter, and it runs for
        #: every batch.
        self._export_failed = contain(f"export:{type(exporter).__name__}", "otel_training: span exporter %s raised",
                                      type(exporter).__name__)

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
        if self._closed.is_set() or (self.spool is not None and self._last_failed
                                     and self._clock() < self._next_probe):
            return self._spool_or_fail(spans)
        with self._lock:
            self.in_flight = count
            self._export_started = self._clock()
        result = SpanExportResult.FAILURE  # the exporter's failure is a failed batch (spooled or counted)
        with self._export_failed:
            result = self.exporter.export(spans)
        with self._lock:
            self.in_flight = 0
            self._export_started = None
            self._last_failed = result is not SpanExportResult.SUCCESS
            if result is SpanExportResult.SUCCESS:
                self.exported += count
                return result
            self._next_probe = self._clock() + self._probe_interval_s
        return self._spool_or_fail(spans)

    def _spool_or_fail(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        spooled = False
        if self.spool is not None:
            try:
                spooled = self.spool.write(spans)
            except Exception:  # noqa: BLE001 - a spool that cannot be written: the batch is counted as dropped
                log_once(f"spool:{self.spool.path}", "otel_training: cannot write the span spool %s; the spans are "
                         "counted as dropped", self.spool.path)
            else:
                if not spooled:
                        log_once(f"spool-full:{self.spool.path}", "otel_training: the span spool %s is full (%d bytes); "
                             "further undelivered spans are dropped and counted", self.spool.path,
                             self.spool.max_bytes, exc_info=False)
        with self._lock:
            if spooled:
                self.spooled += len(spans)
            else:
                self.failed += len(spans)
        # Spooled is not delivered: the batch processor has nothing to retry either way.
        return SpanExportResult.SUCCESS if spooled else SpanExportResult.FAILURE

    def close(self) -> None:
        """Refuse every later batch and interrupt the wrapped exporter's retries."""
        if self._closed.is_set():
            return
        self._closed.set()
        # Closing goes on (the spool, the pipeline) whatever the exporter raises.
        with contain(f"shutdown:{type(self.exporter).__name__}", "otel_training: exporter shutdown raised"):
            self.exporter.shutdown()

    def shutdown(self) -> None:
        """After the batch processor's last export: the spool, too, is done."""
        self.close()
        if self.spool is not None:
            self.spool.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        if self._closed.is_set():
            return False
        # A flush that raised is one that did not complete: False.
        with contain(f"flush:{type(self.exporter).__name__}", "otel_training: exporter force_flush raised"):
            return self.exporter.force_flush(timeout_millis)
        return False
