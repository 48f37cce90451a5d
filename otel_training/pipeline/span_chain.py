"""Where a pipeline's spans leave the process, and what it counts of them.

One chain per in-process pipeline: a span held for device values read after it ended (``LateValuesSpanProcessor``)
goes to the counting batch processor (its queue policy and wait), whose thread exports through the guard (a
collector that hangs or refuses: the spool, or a counted drop) to the exporter. Its counts are the pipeline's
``exported``, ``dropped`` and ``pending``: what a flush reports, the drop metrics read, and the drain publishes.
``Telemetry`` builds one and keeps the providers, the flush and the shutdown.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter

from otel_training.exporters.guarded import GuardedSpanExporter
from otel_training.exporters.spool import Spool
from otel_training.processors.batch import CountingBatchSpanProcessor
from otel_training.processors.late_values import LateValuesSpanProcessor


class SpanChain:
    """late values → counting batch → guard (spool) → ``exporter``, built from the pipeline's options."""

    def __init__(self, exporter: SpanExporter, options: Mapping[str, Any], spool: Spool | None = None) -> None:
        self.guard = GuardedSpanExporter(exporter, spool=spool)
        self.batch = CountingBatchSpanProcessor(
            self.guard, policy=options["span_queue_policy"], max_wait_s=options["span_queue_max_wait_s"],
            exporter_progressing=self.guard.progressing)
        #: In front of the exporting processor only: a span waiting for values read after it ended is held for
        #: export, not for the stuck detector, goodput or the user's processors (``processors/late_values.py``).
        #: The tracer provider gets this one.
        self.late_values = LateValuesSpanProcessor(self.batch, hold_s=float(options["values_hold_s"]))

    def counts(self) -> tuple[int, int, int]:
        """(exported, dropped, pending) now: a span is dropped once accepted and neither delivered, spooled,
        queued, being exported nor held for its values."""
        guard, batch = self.guard, self.batch
        exported = guard.exported
        settled = exported + guard.spooled  # delivered, or kept in the spool: not lost
        held = self.late_values.held  # waiting for their values
        queued = batch.queued()
        if queued is None:
            # An SDK that hides its queue: what is not delivered yet counts as pending until
            # shutdown, which then counts it as lost (tests/test_sdk_compat.py fails first).
            return exported, 0, max(0, batch.accepted - settled) + held
        pending = queued + guard.in_flight + held
        return exported, max(0, batch.accepted - settled - pending), pending

    @property
    def spooled(self) -> int:
        """Spans the collector could not take, written to the spool instead."""
        return self.guard.spooled

    @property
    def queue_wait_s(self) -> float:
        """Seconds the threads ending spans have waited for room in the queue (``span_queue_policy`` "wait")."""
        return self.batch.waited_s

    def close(self) -> None:
        """Interrupt the exporter's retry back-off and refuse later batches (shutdown, after the last flush)."""
        self.guard.close()


__all__ = ["SpanChain"]
