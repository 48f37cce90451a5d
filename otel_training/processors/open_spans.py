"""Which spans are open right now, so a dying process can end them.

A span is exported only when it ends; on a fatal signal or an uncaught
exception the open spans (the step that was running, its epoch, ...) are the
most interesting ones, so the failure hooks end them with status ERROR. Costs
one dict insert and one delete per span.
"""

from __future__ import annotations

import threading

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor


class OpenSpanTracker(SpanProcessor):
    def __init__(self) -> None:
        # span_id -> (span, thread ident); dict operations are atomic under the GIL.
        self._open: dict[int, tuple[Span, int]] = {}

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self._open[span.context.span_id] = (span, threading.get_ident())

    def on_end(self, span: ReadableSpan) -> None:
        self._open.pop(span.context.span_id, None)

    def open_spans(self, thread_id: int | None = None) -> list[Span]:
        """Open spans, newest first (children before their parents)."""
        entries = list(self._open.values())
        spans = [span for span, ident in entries if thread_id is None or ident == thread_id]
        spans.sort(key=lambda span: span.start_time or 0, reverse=True)
        return spans

    def shutdown(self) -> None:
        self._open.clear()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
