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

from otel_training._files import open_private
from otel_training.analysis import SpanRecord


def _event(record: SpanRecord) -> dict[str, Any]:
    args = dict(record.attributes)
    args["training.restart.count"] = record.run.restart
    if record.error:
        args["otel.status_code"] = "ERROR"
    return {
        "name": record.name,
        "cat": record.role,
        "ph": "X",
        "ts": record.start_ns / 1000,
        "dur": max(0, record.end_ns - record.start_ns) / 1000,
        "pid": record.run.rank,
        "tid": record.thread,
        "args": args,
    }


def _metadata(ranks: dict[int, str]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for rank, service in sorted(ranks.items()):
        label = f"rank {rank}" + (f" ({service})" if service else "")
        events.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": label}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
    return events


def chrome_events(records: Iterable[SpanRecord]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    ranks: dict[int, str] = {}
    for record in records:
        ranks.setdefault(record.run.rank, record.service)
        events.append(_event(record))
    return events + _metadata(ranks)


def write_chrome_trace(records: Iterable[SpanRecord], path: str | os.PathLike[str]) -> int:
    """Write the trace, one event at a time (``records`` may be a stream); returns the number of span events."""
    ranks: dict[int, str] = {}
    spans = 0
    with open_private(path) as handle:  # span attributes, stacks among them: owner-only, as the traces
        handle.write('{"traceEvents":[')
        for record in records:
            ranks.setdefault(record.run.rank, record.service)
            handle.write(("," if spans else "") + json.dumps(_event(record), separators=(",", ":"), default=str))
            spans += 1
        handle.writelines(("," if spans or index else "") + json.dumps(event, separators=(",", ":"), default=str)
                          for index, event in enumerate(_metadata(ranks)))
        handle.write('],"displayTimeUnit":"ms"}')
    return spans
