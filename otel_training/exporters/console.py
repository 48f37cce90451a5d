"""Human-readable span lines on the console, for a look without any backend."""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from typing import IO

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import ConsoleSpanExporter
from opentelemetry.trace import StatusCode


def _timestamp(ns: int | None) -> str:
    if ns is None:
        return "-"
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%H:%M:%S.%f")[:-3]


def format_span(span: ReadableSpan) -> str:
    """``12:00:01.250 training.step 12.30 ms OK training.step=7 ...`` plus one line per event."""
    duration_ms = ((span.end_time or 0) - (span.start_time or 0)) / 1e6
    status = span.status.status_code
    status_text = "ERROR" if status is StatusCode.ERROR else "OK"
    if status is StatusCode.ERROR and span.status.description:
        status_text += f"({span.status.description})"
    attributes = " ".join(f"{key}={value}" for key, value in (span.attributes or {}).items())  # type: ignore[str-bytes-safe]  # a bytes attribute shows as b'...'
    parent = f" parent={span.parent.span_id:016x}" if span.parent else ""
    lines = [
        f"{_timestamp(span.start_time)} {span.name} {duration_ms:.2f} ms {status_text} {attributes}"
        f" [trace={span.context.trace_id:032x} span={span.context.span_id:016x}{parent}]"
    ]
    for event in span.events:
        event_attributes = " ".join(
            f"{key}={value}" for key, value in (event.attributes or {}).items() if key != "exception.stacktrace"  # type: ignore[str-bytes-safe]  # a bytes event value shows as b'...'
        )
        lines.append(f"    {_timestamp(event.timestamp)} event {event.name} {event_attributes}")
    return "\n".join(lines) + "\n"


def console_exporter(out: IO[str] | None = None) -> ConsoleSpanExporter:
    return ConsoleSpanExporter(out=out or sys.stderr, formatter=format_span)
