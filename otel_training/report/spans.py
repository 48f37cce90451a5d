"""One OTLP JSON request into the tuples the streamed report reads, the spans read before left out.

Why tuples: the report reads millions of spans, of which it needs a name, two times, an id, a
status, the attributes of a few names, and the trace id (a copy of a span is known by its trace
and span id: ``dedupe.py``). A tuple is the cheapest thing to build and unpack in Python.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from otel_training import semconv as sc
from otel_training.analysis import RunKey
from otel_training.report.dedupe import SeenSpans
from otel_training.report.reader import (
    MAX_TIME_NS,
    MIN_TIME_NS,
    any_value,
    attributes,
    gpu_errors,
    impossible_alert,
    impossible_times,
    not_strings,
)

#: Spans whose attributes are read.
WITH_ATTRIBUTES = frozenset({sc.SPAN_STEP, sc.SPAN_DEVICE_STEP, sc.SPAN_SAVE_CHECKPOINT,
                             sc.SPAN_LOAD_CHECKPOINT, sc.SPAN_ALERT})
_STATUS_ERROR = 2
_STEP_ATTRIBUTES = frozenset({sc.STEP, sc.STEP_DEVICE_TIMED, sc.STEP_DATA_WAIT_S, sc.CHECKPOINT_STEP,
                              sc.COLLECTIVE_GROUP, sc.COLLECTIVE_OP,
                              sc.COLLECTIVE_SEQ, sc.COLLECTIVE_COMPLETED_SEQ, sc.COLLECTIVE_STEP,
                              sc.COLLECTIVE_WAIT_S, sc.GPU_SM_CLOCK_MIN_MHZ, sc.GPU_THROTTLED,
                              sc.GPU_THROTTLE_REASONS})
#: The spans whose ``training.gpu.error`` events are read (``analysis.gpu.ERRORS_KEY``).
_WITH_GPU_EVENTS = frozenset({sc.SPAN_STEP, sc.SPAN_DEVICE_STEP})
#: A span: (name, start, end, span id, error, attributes read or None, trace id).
Span = tuple[str, int, int, str, bool, "dict[str, Any] | None", str]


def json_loads() -> Callable[[bytes], Any]:
    """orjson's parser where installed (the report extra: 1.2x faster to a span's values), else the standard one.

    A line orjson refuses goes to the standard parser: its error names the problem as the
    in-memory reader does, and what orjson refuses but JSON allows (integers past 64 bits) is read.
    """
    try:
        import orjson
    except ImportError:
        return json.loads

    def loads(line: bytes) -> Any:
        try:
            return orjson.loads(line)
        except orjson.JSONDecodeError:
            return json.loads(line)

    return loads


def _some_attributes(items: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The attributes of a step or checkpoint span the report reads (the rest is left unconverted)."""
    return {item["key"]: any_value(item.get("value", {})) for item in items or () if item["key"] in _STEP_ATTRIBUTES}


def convert(request: dict[str, Any], seen: SeenSpans | None = None, job_id: str | None = None,
            ) -> tuple[list[tuple[RunKey, str, str, list[Span]]], list[tuple[str, str]]]:
    """The spans of one request, by process, attributes read only where the report uses them, and the
    impossible ones (name, why). Those of another job than ``job_id`` are left out; those ``seen``
    before too (all read, then checked: a line that cannot be read changes nothing)."""
    resources = []
    impossible: list[tuple[str, str]] = []
    for resource_spans in request.get("resourceSpans", ()):
        resource = attributes(resource_spans.get("resource", {}).get("attributes"))
        key = RunKey.from_resource(resource)
        spans = []
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                name, span_id, trace_id = span["name"], span.get("spanId", ""), span.get("traceId", "")
                # The parent id is not read here (the in-memory reader checks it).
                if not (type(name) is str and type(trace_id) is str and type(span_id) is str):
                    raise not_strings(name=name, traceId=trace_id, spanId=span_id)
                start, end = int(span["startTimeUnixNano"]), int(span["endTimeUnixNano"])
                values = None
                if name in WITH_ATTRIBUTES:
                    values = attributes(span.get("attributes")) if name == sc.SPAN_ALERT else \
                        _some_attributes(span.get("attributes"))
                    if "events" in span and name in _WITH_GPU_EVENTS and (errors := gpu_errors(span)):
                        values[sc.EVENT_GPU_ERROR] = errors
                if not (MIN_TIME_NS <= start <= end <= MAX_TIME_NS) or (
                        name == sc.SPAN_ALERT and impossible_alert(values or {})):
                    why = impossible_times(start, end) or impossible_alert(values or {})
                    impossible.append((name, why or ""))
                    continue
                status = span.get("status")
                spans.append((name, start, end, span_id, status is not None and status.get("code") == _STATUS_ERROR,
                              values, trace_id))
        if job_id is None or key.job_id == job_id:
            resources.append((key, str(resource.get(sc.SERVICE_NAME, "")),
                              str(resource.get(sc.TRAINING_ROLE, sc.ROLE_TRAINER)), spans))
    if seen is not None:
        kept = seen.unique([(key, spans) for key, _, _, spans in resources])
        resources = [(key, service, role, spans) for (key, service, role, _), spans in zip(resources, kept)]
    return resources, impossible
