"""Pulling a job's spans from Jaeger's query API instead of files.

``GET {url}/api/traces?service=S`` returns whole traces with each span's
process (the OTel resource, as tags). ``fetch`` maps them to the same records
the file reader produces, in memory; ``spool`` writes them, a page at a time,
as OTLP JSON files, one per rank, in the order spans ended, which the streamed
reader reads in bounded memory like any trace files. Standard library only:
the report needs no HTTP client beyond what Python ships.
"""

from __future__ import annotations

import heapq
import json
import pickle
import struct
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from otel_training import semconv as sc
from otel_training.analysis import RunKey, SpanRecord
from otel_training.report.reader import Problem, otlp_attributes

_MICRO = 1000


def _tags(tags: list[dict[str, Any]] | None) -> dict[str, Any]:
    """A span's tags as attributes; a typed tag whose value is not of its type keeps the value it came with."""
    values: dict[str, Any] = {}
    for tag in tags or ():
        value, kind = tag.get("value"), tag.get("type")
        if kind in ("int64", "float64") and isinstance(value, (int, float, str)):
            try:
                value = int(value) if kind == "int64" else float(value)
            except (ValueError, OverflowError):
                pass  # not a (finite) number: kept as it came, the rest of the answer still read
        values[tag.get("key", "")] = value
    return values


_DAMAGED = "{} span(s) without Jaeger's span fields were skipped (the first: {}); the rest are read"


def records_from_jaeger(payload: dict[str, Any], damaged: list[str] | None = None) -> list[SpanRecord]:
    """The spans of a ``/api/traces`` response; a span without Jaeger's span fields is skipped and said in
    ``damaged``."""
    records = []
    for trace in payload.get("data") or ():
        processes = _processes(trace)
        runs: dict[Any, RunKey] = {}
        for span in trace.get("spans") or ():
            pid = span.get("processID")
            service, resource = processes.get(pid, ("", {sc.SERVICE_NAME: ""}))
            run = runs.get(pid)
            if run is None:
                run = runs[pid] = RunKey.from_resource(resource)
            if (fields := _fields(span, damaged)) is None:
                continue
            name, start, end, tags, error, parent = fields
            records.append(SpanRecord(
                name=name, start_ns=start, end_ns=end, run=run, attributes=tags, trace_id=span.get("traceID", ""),
                span_id=span.get("spanID", ""), parent_id=parent, error=error, service=service,
                role=str(resource.get(sc.TRAINING_ROLE, sc.ROLE_TRAINER)),
            ))
    return records


def _processes(trace: dict[str, Any]) -> dict[Any, tuple[str, dict[str, Any]]]:
    """Each process of a trace: its service and its resource (the service name and the process's tags)."""
    return {pid: (service := process.get("serviceName", ""), {sc.SERVICE_NAME: service, **_tags(process.get("tags"))})
            for pid, process in (trace.get("processes") or {}).items()}


def _fields(span: dict[str, Any], damaged: list[str] | None) -> tuple[str, int, int, dict[str, Any], bool, str] | None:
    """(name, start ns, end ns, attributes, error, parent span id) of a Jaeger span; None for a span without the
    fields every span has (its name, its start), said in ``damaged``: it is skipped and counted."""
    tags = _tags(span.get("tags"))
    error = tags.pop("otel.status_code", None) == "ERROR" or tags.pop("error", False) in (True, "true")
    parent = next((ref.get("spanID", "") for ref in span.get("references") or () if ref.get("refType") == "CHILD_OF"), "")
    try:
        start = int(span["startTime"]) * _MICRO
        if not isinstance(name := span["operationName"], str):
            raise TypeError(f"operationName {name!r:.40}")
        return name, start, start + int(span.get("duration", 0)) * _MICRO, tags, error, parent
    except (KeyError, TypeError, ValueError, OverflowError) as problem:
        if damaged is not None:
            damaged.append(f"span {span.get('spanID', '?')!s:.32} of trace {span.get('traceID', '?')!s:.32}: "
                           f"{type(problem).__name__} {problem!s:.100}")
        return None


#: Traces per request at first: Jaeger's own default page (the UI's search limit).
PAGE_TRACES = 100


def _latest_start_us(trace: dict[str, Any], service: str) -> int | None:
    """The latest start among the trace's spans of ``service``: where Jaeger's search placed the trace."""
    processes = {pid for pid, process in (trace.get("processes") or {}).items() if process.get("serviceName") == service}
    starts = [start for span in trace.get("spans") or ()
              if span.get("processID") in processes and isinstance(start := span.get("startTime"), (int, float))]
    return int(max(starts)) if starts else None


def _get(address: str, timeout_s: float) -> tuple[dict[str, Any] | None, Problem | None]:
    try:
        with urllib.request.urlopen(address, timeout=timeout_s) as response:
            return json.load(response), None
    except urllib.error.HTTPError as error:
        return None, Problem(address, None, f"Jaeger answered HTTP {error.code}: {error.reason}")
    except (urllib.error.URLError, OSError) as error:
        return None, Problem(address, None, f"cannot reach Jaeger: {getattr(error, 'reason', error)}")
    except ValueError as error:
        return None, Problem(address, None, f"not a Jaeger JSON answer: {error}")


def _pages(url: str, service: str, problems: list[Problem], *, limit: int, lookback_s: float | None,
           timeout_s: float, page_traces: int, now_s: float | None) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """(address, traces not seen before) for each page of Jaeger's answer; problems appended as found.

    Jaeger's search has no offset: it answers the traces whose latest span of
    the service (up to the query's end) started last. So pages go back in
    time: the next page ends where the previous one placed its oldest trace,
    that microsecond included, and traces already read are skipped. A trace
    spread over that instant comes back in the next page too and takes a
    place in it; when a page brings nothing new (more traces overlap than a
    page holds: many ranks' long segments), the page doubles. ``lookback_s``
    bounds the range (default: Jaeger's own lookback, two days for Jaeger v2).
    A job cut short by ``limit`` or by an unreadable page is reported as a
    problem, never as a silently smaller report.
    """
    import time

    end_us = int((time.time() if now_s is None else now_s) * 1e6)
    start_us = None if lookback_s is None else end_us - int(lookback_s * 1e6)
    seen: set[str] = set()
    traces = 0
    page_end: int | None = None
    page = max(1, page_traces)
    address = url
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
            return
        assert payload is not None
        problems += [Problem(address, None, f"Jaeger error: {item.get('msg', item)}") for item in payload.get("errors") or ()]
        answer = payload.get("data") or []
        fresh = [trace for trace in answer if trace.get("traceID") not in seen]
        seen.update(trace.get("traceID") for trace in fresh)
        fresh = fresh[: limit - traces]
        traces += len(fresh)
        if fresh:
            yield address, fresh
        if len(answer) < query["limit"]:
            return  # the range is exhausted
        placed = [start for start in (_latest_start_us(trace, service) for trace in answer) if start is not None]
        if not placed:
            problems.append(Problem(address, None, f"a full page of traces without a span of service {service!r}"))
            return
        if not fresh:
            if query["limit"] >= limit:
                problems.append(Problem(address, None, f"more than {query['limit']} traces overlap at "
                                                       f"{min(placed)} µs: raise the limit to read them all"))
                return
            page *= 2
            continue
        page_end = min(placed)
    problems.append(Problem(address, None, f"stopped at {limit} traces (the limit): older traces of service "
                                           f"{service!r} in the range may not have been read"))


def fetch(url: str, service: str, *, limit: int = 10_000, lookback_s: float | None = None,
          timeout_s: float = 60.0, page_traces: int = PAGE_TRACES,
          now_s: float | None = None) -> tuple[list[SpanRecord], list[Problem]]:
    """Spans of up to ``limit`` traces of ``service`` from the Jaeger query API at ``url``, in memory;
    problems instead of exceptions (paging: ``_pages``).

    Each page is turned into records as it arrives: Jaeger's JSON (every tag a
    dict, the process of every trace) is several times the size of a record.
    """
    problems: list[Problem] = []
    records: list[SpanRecord] = []
    damaged: list[str] = []
    address = url  # the last page's address names a problem below
    for page_address, traces in _pages(url, service, problems, limit=limit, lookback_s=lookback_s,
                                       timeout_s=timeout_s, page_traces=page_traces, now_s=now_s):
        records += records_from_jaeger({"data": traces}, damaged)
        address = page_address
    if damaged:
        problems.append(Problem(address, None, _DAMAGED.format(len(damaged), damaged[0])))
    if not records:
        problems.append(Problem(address, None, f"no spans for service {service!r}"))
    return records, problems


#: A spooled file's line ends at this many spans or bytes (the reader refuses lines over 64 MiB).
SPOOL_BATCH = 512
SPOOL_LINE_BYTES = 4 << 20
#: Spans held for the rank files at most; past it every rank's are written (the write side's memory).
SPOOL_HELD = 32_768
#: Page files merged at once (open files); more are merged in rounds.
MERGE_FAN_IN = 128
_LENGTH = struct.Struct("<I")


def spool(url: str, service: str, directory: Path, *, limit: int = 10_000, lookback_s: float | None = None,
          timeout_s: float = 60.0, page_traces: int = PAGE_TRACES, now_s: float | None = None,
          progress: bool | None = None) -> tuple[list[Path], list[Problem]]:
    """The spans of ``fetch`` as OTLP JSON files under ``directory``, one per rank, in the order they ended.

    Pages come newest first; each is sorted by end (ties in the order Jaeger
    listed them, which is ``fetch``'s) and written to a page file as it
    arrives, and the page files are merged (``heapq.merge``: one span of each
    in memory) into the files the streamed reader wants: one per rank, as the
    file exporter writes them, in end order. Memory is one page and a bounded
    write buffer, not the job. No files (and a problem) when Jaeger has no spans
    of ``service`` or they could not be written. ``progress``: a bar of the
    traces fetched (None: where stderr is a terminal; tqdm, from the report extra).
    """
    problems: list[Problem] = []
    resources: dict[str, tuple[int, int]] = {}  # a resource's attributes (OTLP JSON) -> (its index, its rank)
    pages: list[Path] = []
    files: list[Path] = []
    damaged: list[str] = []
    address = url
    bar = _traces_bar(progress)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        arrived = 0
        for page_address, traces in _pages(url, service, problems, limit=limit, lookback_s=lookback_s,
                                           timeout_s=timeout_s, page_traces=page_traces, now_s=now_s):
            address = page_address  # the last page's address names a problem below
            rows = []
            for end, resource, text in _rows(traces, resources, damaged):
                rows.append((end, arrived, resource, text))
                arrived += 1
            if rows:
                rows.sort()  # by end, then arrival (unique: ties keep Jaeger's order, nothing more is compared)
                pages.append(_write_rows(directory / f"page-{len(pages)}.bin", rows))
            if bar is not None:
                bar.update(len(traces))
        if damaged:
            problems.append(Problem(address, None, _DAMAGED.format(len(damaged), damaged[0])))
        if not pages:
            problems.append(Problem(address, None, f"no spans for service {service!r}"))
            return [], problems
        merges = 0
        while len(pages) > MERGE_FAN_IN:
            merged = []
            for index in range(0, len(pages), MERGE_FAN_IN):
                group = pages[index:index + MERGE_FAN_IN]
                merges += 1
                merged.append(_write_rows(directory / f"merged-{merges}.bin", _merged(group)))
                for page in group:
                    page.unlink()
            pages = merged
        _write_ranks(_merged(pages), resources, directory, files)
        return files, problems
    except OSError as error:  # a full disk (TMPDIR is often memory): a problem, not a traceback
        problems.append(Problem(str(directory), None, f"could not spool Jaeger's spans to disk: {error}"))
        for path in files:
            path.unlink(missing_ok=True)
        return [], problems
    finally:
        if bar is not None:
            bar.close()
        for page in pages:
            page.unlink(missing_ok=True)


def _write_ranks(rows: Iterator[tuple[int, int, int, str]], resources: dict[str, tuple[int, int]],
                 directory: Path, files: list[Path]) -> None:
    """Rows (in end order) to ``traces-r<rank>.jsonl`` files, lines bounded in spans and bytes."""
    texts = {index: text for text, (index, _) in resources.items()}
    rank_of = {index: rank for index, rank in resources.values()}
    held: dict[int, tuple[list[tuple[int, str]], list[int]]] = {}
    paths: dict[int, Path] = {}
    count = 0

    def write(rank: int) -> None:
        spans, _ = held.pop(rank)
        path = paths.get(rank)
        if path is None:
            path = paths[rank] = directory / f"traces-r{rank}.jsonl"
            files.append(path)
        with path.open("a", encoding="utf-8") as out:
            out.write(_request(spans, texts))

    for _, _, resource, text in rows:
        rank = rank_of[resource]
        spans, size = held.setdefault(rank, ([], [0]))
        spans.append((resource, text))
        size[0] += len(text)
        count += 1
        if len(spans) >= SPOOL_BATCH or size[0] >= SPOOL_LINE_BYTES:
            count -= len(spans)
            write(rank)
        elif count >= SPOOL_HELD:
            for waiting in list(held):
                write(waiting)
            count = 0
    for waiting in list(held):
        write(waiting)


def _traces_bar(progress: bool | None) -> Any:
    if progress is False:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(unit=" traces", desc="fetching from Jaeger", disable=None if progress is None else False)


def _rows(traces: list[dict[str, Any]], resources: dict[str, tuple[int, int]],
          damaged: list[str] | None = None) -> Iterator[tuple[int, int, str]]:
    """(end ns, resource index, the span as OTLP JSON) of each span of ``traces``, mapped as
    ``records_from_jaeger`` maps them; ``resources`` gains each new resource (and its rank); a span without
    Jaeger's span fields is skipped and said in ``damaged``."""
    for trace in traces:
        indices = {pid: _resource_index(resources, {**resource, sc.SERVICE_NAME: service})
                   for pid, (service, resource) in _processes(trace).items()}
        for span in trace.get("spans") or ():
            index = indices.get(span.get("processID"))
            if index is None:  # a span without its process: an empty service name, as its record gets
                index = _resource_index(resources, {sc.SERVICE_NAME: ""})
            if (fields := _fields(span, damaged)) is None:
                continue
            name, start, end, tags, error, parent = fields
            otlp: dict[str, Any] = {"traceId": span.get("traceID", ""), "spanId": span.get("spanID", ""),
                                    "name": name, "startTimeUnixNano": str(start), "endTimeUnixNano": str(end),
                                    "attributes": otlp_attributes(tags)}
            if parent:
                otlp["parentSpanId"] = parent
            if error:
                otlp["status"] = {"code": 2}
            if span.get("logs"):  # span events (a step's training.gpu.error): Jaeger's logs, "event" their name
                otlp["events"] = [{"name": str(fields.pop("event", "")), "attributes": otlp_attributes(fields),
                                   "timeUnixNano": str(at * _MICRO if isinstance(at := log.get("timestamp"), int)
                                                       else 0)}
                                  for log in span["logs"] if isinstance(log, dict)
                                  for fields in (_tags(log.get("fields")),)]
            yield end, index, json.dumps(otlp)


def _resource_index(resources: dict[str, tuple[int, int]], resource: dict[str, Any]) -> int:
    text = json.dumps(otlp_attributes(resource))
    known = resources.get(text)
    if known is None:
        known = resources[text] = (len(resources), RunKey.from_resource(resource).rank)
    return known[0]


def _write_rows(path: Path, rows: Any) -> Path:
    """Rows to a page file, each pickled on its own behind its length: this process's own temporary
    files, read back by itself (JSON took 3x longer; one pickler for the file would remember every row)."""
    with path.open("wb") as out:
        for row in rows:
            data = pickle.dumps(row, protocol=pickle.HIGHEST_PROTOCOL)
            out.write(_LENGTH.pack(len(data)))
            out.write(data)
    return path


def _merged(pages: list[Path]) -> Iterator[Any]:
    """The rows of the page files, each sorted by (end, arrival), merged in that order (one row of each held;
    arrival is unique, so no two rows compare further)."""

    def rows(path: Path) -> Iterator[Any]:
        with path.open("rb") as data:
            while header := data.read(_LENGTH.size):
                yield pickle.loads(data.read(_LENGTH.unpack(header)[0]))

    yield from heapq.merge(*(rows(path) for path in pages))


def _request(spans: list[tuple[int, str]], resources: dict[int, str]) -> str:
    """One OTLP JSON export request of ``spans`` ((resource index, span JSON)), grouped by resource."""
    grouped: dict[int, list[str]] = {}
    for index, text in spans:
        grouped.setdefault(index, []).append(text)
    return '{"resourceSpans":[' + ",".join(
        '{"resource":{"attributes":' + resources[index] + '},"scopeSpans":[{"scope":{"name":"jaeger"},"spans":['
        + ",".join(texts) + "]}]}" for index, texts in grouped.items()) + "]}\n"
