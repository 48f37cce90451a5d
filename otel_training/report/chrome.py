"""Chrome trace-event JSON, for Perfetto (ui.perfetto.dev) and chrome://tracing.

One process per rank (pid = rank), one track per thread (tid), spans as
complete ("X") events with their attributes as args; restarts of a rank share
its process, following one another in time.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from otel_training.analysis import SpanRecord


def chrome_events(records: Iterable[SpanRecord]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    ranks: dict[int, str] = {}
    for record in records:
        rank = record.run.rank
        ranks.setdefault(rank, record.service)
        args = dict(record.attributes)
        args["training.restart.count"] = record.run.restart
        if record.error:
            args["otel.status_code"] = "ERROR"
        events.append({
            "name": record.name,
            "cat": record.role,
            "ph": "X",
            "ts": record.start_ns / 1000,
            "dur": max(0, record.end_ns - record.start_ns) / 1000,
            "pid": rank,
            "tid": record.thread,
            "args": args,
        })
    for rank, service in sorted(ranks.items()):
        label = f"rank {rank}" + (f" ({service})" if service else "")
        events.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": label}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
    return events


def write_chrome_trace(records: Iterable[SpanRecord], path: str | os.PathLike[str]) -> int:
    """Write the trace; returns the number of span events."""
    events = chrome_events(records)
    # dumps, not dump: dump streams through the pure-Python encoder, several times slower.
    text = json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}, separators=(",", ":"), default=str)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    return sum(1 for event in events if event["ph"] == "X")
