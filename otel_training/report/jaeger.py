"""Pulling a job's spans from Jaeger's query API instead of files.

``GET {url}/api/traces?service=S`` returns whole traces with each span's
process (the OTel resource, as tags); that is mapped to the same records the
file reader produces. Standard library only: the report needs no HTTP client
beyond what Python ships.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from otel_training import semconv as sc
from otel_training.analysis import RunKey, SpanRecord
from otel_training.report.reader import Problem

_MICRO = 1000


def _tags(tags: list[dict[str, Any]] | None) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for tag in tags or ():
        value = tag.get("value")
        if tag.get("type") == "int64":
            value = int(value)  # type: ignore[arg-type]
        elif tag.get("type") == "float64":
            value = float(value)  # type: ignore[arg-type]
        values[tag.get("key", "")] = value
    return values


def records_from_jaeger(payload: dict[str, Any]) -> list[SpanRecord]:
    """The spans of a ``/api/traces`` response."""
    records = []
    for trace in payload.get("data") or ():
        processes = {pid: (process.get("serviceName", ""), _tags(process.get("tags")))
                     for pid, process in (trace.get("processes") or {}).items()}
        for span in trace.get("spans") or ():
            service, resource = processes.get(span.get("processID"), ("", {}))
            resource = {sc.SERVICE_NAME: service, **resource}
            tags = _tags(span.get("tags"))
            error = tags.pop("otel.status_code", None) == "ERROR" or tags.pop("error", False) in (True, "true")
            parent = next((ref.get("spanID", "") for ref in span.get("references") or ()
                           if ref.get("refType") == "CHILD_OF"), "")
            start = int(span["startTime"]) * _MICRO
            records.append(SpanRecord(
                name=span["operationName"], start_ns=start, end_ns=start + int(span.get("duration", 0)) * _MICRO,
                run=RunKey.from_resource(resource), attributes=tags, trace_id=span.get("traceID", ""),
                span_id=span.get("spanID", ""), parent_id=parent, error=error, service=service,
                role=str(resource.get(sc.TRAINING_ROLE, sc.ROLE_TRAINER)),
            ))
    return records


def fetch(url: str, service: str, *, limit: int = 10_000, lookback_s: float | None = None,
          timeout_s: float = 60.0) -> tuple[list[SpanRecord], list[Problem]]:
    """Spans of ``service`` from the Jaeger query API at ``url``; problems instead of exceptions."""
    query: dict[str, Any] = {"service": service, "limit": limit}
    if lookback_s is not None:
        import time

        end_us = int(time.time() * 1e6)
        query.update(start=end_us - int(lookback_s * 1e6), end=end_us)
    address = url.rstrip("/") + "/api/traces?" + urllib.parse.urlencode(query)
    try:
        with urllib.request.urlopen(address, timeout=timeout_s) as response:  # noqa: S310 - a user-given URL
            payload = json.load(response)
    except urllib.error.HTTPError as error:
        return [], [Problem(address, None, f"Jaeger answered HTTP {error.code}: {error.reason}")]
    except (urllib.error.URLError, OSError) as error:
        return [], [Problem(address, None, f"cannot reach Jaeger: {getattr(error, 'reason', error)}")]
    except ValueError as error:
        return [], [Problem(address, None, f"not a Jaeger JSON answer: {error}")]
    problems = [Problem(address, None, f"Jaeger error: {item.get('msg', item)}")
                for item in payload.get("errors") or ()]
    records = records_from_jaeger(payload)
    if not records:
        problems.append(Problem(address, None, f"no spans for service {service!r}"))
    return records, problems
