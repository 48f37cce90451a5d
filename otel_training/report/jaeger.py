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


#: Traces per request at first: Jaeger's own default page (the UI's search limit).
PAGE_TRACES = 100


def _latest_start_us(trace: dict[str, Any], service: str) -> int | None:
    """The latest start among the trace's spans of ``service``: where Jaeger's search placed the trace."""
    processes = {pid for pid, process in (trace.get("processes") or {}).items() if process.get("serviceName") == service}
    starts = [int(span["startTime"]) for span in trace.get("spans") or () if span.get("processID") in processes]
    return max(starts) if starts else None


def _get(address: str, timeout_s: float) -> tuple[dict[str, Any] | None, Problem | None]:
    try:
        with urllib.request.urlopen(address, timeout=timeout_s) as response:  # noqa: S310 - a user-given URL
            return json.load(response), None
    except urllib.error.HTTPError as error:
        return None, Problem(address, None, f"Jaeger answered HTTP {error.code}: {error.reason}")
    except (urllib.error.URLError, OSError) as error:
        return None, Problem(address, None, f"cannot reach Jaeger: {getattr(error, 'reason', error)}")
    except ValueError as error:
        return None, Problem(address, None, f"not a Jaeger JSON answer: {error}")


def fetch(url: str, service: str, *, limit: int = 10_000, lookback_s: float | None = None,
          timeout_s: float = 60.0, page_traces: int = PAGE_TRACES,
          now_s: float | None = None) -> tuple[list[SpanRecord], list[Problem]]:
    """Spans of up to ``limit`` traces of ``service`` from the Jaeger query API at ``url``;
    problems instead of exceptions.

    Jaeger's search has no offset: it answers the traces whose latest span of
    the service (up to the query's end) started last. So pages go back in
    time: the next page ends where the previous one placed its oldest trace,
    that microsecond included, and traces already read are skipped. A trace
    spread over that instant comes back in the next page too and takes a
    place in it; when a page brings nothing new (more traces overlap than a
    page holds: many ranks' long segments), the page doubles. ``lookback_s``
    bounds the range (default: Jaeger's own lookback, two days for Jaeger v2).
    A job cut short by ``limit`` or by an unreadable page is reported as a
    problem, never as a silently smaller report. Each page is turned into
    records as it arrives: Jaeger's JSON (every tag a dict, the process of
    every trace) is several times the size of what the report keeps.
    """
    import time

    end_us = int((time.time() if now_s is None else now_s) * 1e6)
    start_us = None if lookback_s is None else end_us - int(lookback_s * 1e6)
    seen: set[str] = set()
    traces = 0
    records: list[SpanRecord] = []
    problems: list[Problem] = []
    page_end: int | None = None
    page = max(1, page_traces)
    address = ""
    while traces < limit:
        query: dict[str, Any] = {"service": service, "limit": min(page, limit)}
        if start_us is not None:
            query["start"] = start_us
        if page_end is not None or start_us is not None:
            query["end"] = end_us if page_end is None else page_end
        address = url.rstrip("/") + "/api/traces?" + urllib.parse.urlencode(query)
        payload, problem = _get(address, timeout_s)
        if problem is not None:
            problems.append(problem)
            break
        assert payload is not None
        problems += [Problem(address, None, f"Jaeger error: {item.get('msg', item)}") for item in payload.get("errors") or ()]
        answer = payload.get("data") or []
        fresh = [trace for trace in answer if trace.get("traceID") not in seen]
        seen.update(trace.get("traceID") for trace in fresh)
        fresh = fresh[: limit - traces]
        traces += len(fresh)
        records += records_from_jaeger({"data": fresh})
        if len(answer) < query["limit"]:
            break  # the range is exhausted
        placed = [start for start in (_latest_start_us(trace, service) for trace in answer) if start is not None]
        if not placed:
            problems.append(Problem(address, None, f"a full page of traces without a span of service {service!r}"))
            break
        if not fresh:
            if query["limit"] >= limit:
                problems.append(Problem(address, None, f"more than {query['limit']} traces overlap at "
                                                       f"{min(placed)} µs: raise the limit to read them all"))
                break
            page *= 2
            continue
        page_end = min(placed)
    else:
        problems.append(Problem(address, None, f"stopped at {limit} traces (the limit): older traces of service "
                                               f"{service!r} in the range may not have been read"))
    if not records:
        problems.append(Problem(address, None, f"no spans for service {service!r}"))
    return records, problems
