"""Reading OTLP JSON trace files of every rank and restart into analysis records.

Post-mortem input is often damaged: the last line cut short by a crash, a
metrics file next to the traces, a directory that holds nothing. Each problem
becomes a message naming the file and line, and everything readable is still
used, because a partial report beats none when a job has just died.

Input may also be hostile or absurd, and the report must survive it with
bounded memory: a line that cannot be converted for any reason (nesting past
the recursion limit, an infinite rank) is a problem of its line; a line longer
than ``MAX_LINE_BYTES`` is skipped unread; spans with impossible timestamps are
problems, not figures; and a span read twice (the same file passed twice, a
copy) counts once.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Generic, TypeVar

from otel_training import semconv as sc
from otel_training.analysis import RunKey, SpanRecord

#: Problems reported per file before the rest are only counted.
MAX_PROBLEMS_PER_FILE = 5
#: Inputs larger than this (bytes) get a progress bar (when stderr is a terminal and tqdm is installed).
PROGRESS_MIN_BYTES = 16 * 1024 * 1024
#: Lines longer than this (bytes) are skipped unread: parsing costs a few times a line's size in memory.
#: The file exporter writes one batch of spans per line, a few MB at most.
MAX_LINE_BYTES = 64 * 1024 * 1024
#: Timestamps outside [2000-01-01, 2262-04-11] (the signed 64-bit nanosecond range)
#: are a clock not set, a corrupt value or a forgery; their spans are problems.
MIN_TIME_NS = 946_684_800 * 10**9
MAX_TIME_NS = 2**63 - 1
#: Alert attributes the analysis turns into nanoseconds.
_ALERT_SECONDS = (sc.ALERT_ELAPSED_S, sc.ALERT_THRESHOLD_S)
_STATUS_ERROR = 2
_THREAD_ID = "thread.id"
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Problem:
    """Something that could not be read; the rest of the input still counts."""

    path: str
    line: int | None
    message: str

    def __str__(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        return f"{where}: {self.message}"


@dataclasses.dataclass
class ReadResult:
    records: list[SpanRecord]
    problems: list[Problem]
    files: list[Path]


def any_value(value: dict[str, Any]) -> Any:
    """An OTLP JSON AnyValue as a Python value."""
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "arrayValue" in value:
        return [any_value(item) for item in value["arrayValue"].get("values", [])]
    if "kvlistValue" in value:
        return attributes(value["kvlistValue"].get("values"))
    return None


def attributes(items: Iterable[dict[str, Any]] | None) -> dict[str, Any]:
    return {item["key"]: any_value(item.get("value", {})) for item in items or ()}


def otlp_value(value: Any) -> dict[str, Any]:
    """The OTLP JSON AnyValue of a scalar (``any_value`` reads it back): anything not a number or a bool as text."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    return {"stringValue": str(value)}


def otlp_attributes(values: dict[str, Any]) -> list[dict[str, Any]]:
    """OTLP JSON attributes of ``values`` (``attributes`` reads them back)."""
    return [{"key": key, "value": otlp_value(value)} for key, value in values.items()]


def find_trace_files(paths: Sequence[str | os.PathLike[str]]) -> tuple[list[Path], list[Problem]]:
    """Files named on the command line, and the ``*.jsonl``/``*.json`` files under named directories."""
    files: list[Path] = []
    problems: list[Problem] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            # The file exporter's own names first; its metrics-r*.jsonl siblings are not traces.
            found = sorted(p for p in path.rglob("traces-*.jsonl") if p.is_file())
            if not found:
                found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in (".jsonl", ".json")
                               and not p.name.startswith("metrics-"))
            if not found:
                problems.append(Problem(str(path), None, "no OTLP JSON trace files (*.jsonl, *.json) in this directory"))
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            problems.append(Problem(str(path), None, "no such file or directory"))
    return files, problems


def gpu_errors(span: dict[str, Any]) -> list[tuple[int, str, Any]] | None:
    """A step span's ``training.gpu.error`` events as (time, ``hw.error.type``, XID), or None without any."""
    found = [(int(event.get("timeUnixNano", 0)), str(values.get(sc.HW_ERROR_TYPE, "")), values.get(sc.GPU_XID))
             for event in span.get("events") or () if event.get("name") == sc.EVENT_GPU_ERROR
             for values in (attributes(event.get("attributes")),)]
    return found or None


def not_strings(**fields: Any) -> TypeError:
    wrong = ", ".join(f"{key} is {type(value).__name__}" for key, value in fields.items() if not isinstance(value, str))
    return TypeError(f"{wrong}, not a string")


def records_from_request(request: dict[str, Any]) -> list[SpanRecord]:
    """The spans of one OTLP JSON ``ExportTraceServiceRequest``."""
    records = []
    for resource_spans in request.get("resourceSpans", ()):
        resource = attributes(resource_spans.get("resource", {}).get("attributes"))
        run = RunKey.from_resource(resource)
        service = str(resource.get(sc.SERVICE_NAME, ""))
        role = str(resource.get(sc.TRAINING_ROLE, sc.ROLE_TRAINER))
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                span_attributes = attributes(span.get("attributes"))
                thread = span_attributes.get(_THREAD_ID, 0)
                name, trace_id = span["name"], span.get("traceId", "")
                span_id, parent_id = span.get("spanId", ""), span.get("parentSpanId", "")
                # Ids are joined and compared later: another type is a malformed span, not a crash there.
                if not (type(name) is str and type(trace_id) is str and type(span_id) is str
                        and type(parent_id) is str):
                    raise not_strings(name=name, traceId=trace_id, spanId=span_id, parentSpanId=parent_id)
                if "events" in span and (errors := gpu_errors(span)):  # analysis.gpu.ERRORS_KEY
                    span_attributes[sc.EVENT_GPU_ERROR] = errors
                records.append(SpanRecord(
                    name=name,
                    start_ns=int(span["startTimeUnixNano"]),
                    end_ns=int(span["endTimeUnixNano"]),
                    run=run,
                    attributes=span_attributes,
                    trace_id=trace_id,
                    span_id=span_id,
                    parent_id=parent_id,
                    error=span.get("status", {}).get("code") == _STATUS_ERROR,
                    service=service,
                    role=role,
                    thread=thread if isinstance(thread, int) else 0,
                ))
    return records


def impossible_times(start_ns: int, end_ns: int) -> str | None:
    """Why a span with these timestamps cannot be real, or None."""
    if not (MIN_TIME_NS <= start_ns <= MAX_TIME_NS and MIN_TIME_NS <= end_ns <= MAX_TIME_NS):
        return "has a timestamp before 2000 or after 2262 (negative, unset or corrupt)"
    if end_ns < start_ns:
        return "ends before it starts"
    return None


def impossible_alert(attributes: dict[str, Any]) -> str | None:
    """Why an alert's attributes cannot be real, or None."""
    for key in _ALERT_SECONDS:
        value = attributes.get(key)
        if isinstance(value, (int, float)) and not 0 <= value <= MAX_TIME_NS / 1e9:
            return f"claims {key}={value!r}, not a duration in the 64-bit nanosecond range"
    return None


def _impossible(record: SpanRecord) -> str | None:
    """Why the span cannot be real, or None."""
    why = impossible_times(record.start_ns, record.end_ns)
    if why is None and record.name == sc.SPAN_ALERT:
        why = impossible_alert(record.attributes)
    return why


def _impossible_problem(impossible: list[tuple[str, str]]) -> str:
    name, why = impossible[0]
    more = f" (and {len(impossible) - 1} more impossible span(s) on this line)" if len(impossible) > 1 else ""
    return f"span {name!r} {why}{more}; skipped"


def _lines(handle: BinaryIO) -> Iterator[tuple[bytes | None, int]]:
    """Each line and its size; a line longer than ``MAX_LINE_BYTES`` comes as None, skipped without holding it."""
    while line := handle.readline(MAX_LINE_BYTES + 1):
        if len(line) <= MAX_LINE_BYTES or line.endswith(b"\n"):
            yield line, len(line)
            continue
        size = len(line)
        while (rest := handle.readline(1 << 20)) and not rest.endswith(b"\n"):
            size += len(rest)
        yield None, size + len(rest)


def _line_problem(line: bytes, error: Exception) -> str:
    if isinstance(error, json.JSONDecodeError):
        # JSON that ends before its document does was cut short (a crash mid-write).
        if error.pos >= len(line.rstrip()) or error.msg.startswith("Unterminated string"):
            return f"truncated JSON line ({error.msg} at column {error.pos + 1}); skipped"
        return f"not JSON ({error.msg} at column {error.pos + 1}); skipped"
    if isinstance(error, UnicodeDecodeError):
        return "not text (invalid UTF-8); skipped"
    if isinstance(error, RecursionError):
        return "nested too deeply to read; skipped"
    return f"malformed OTLP span ({type(error).__name__}: {error}); skipped"


def _kind_problem(request: Any) -> str:
    if isinstance(request, dict) and "resourceMetrics" in request:
        return "OTLP metrics, not traces; skipped"
    if isinstance(request, dict) and "resourceLogs" in request:
        return "OTLP logs, not traces; skipped"
    return "not an OTLP JSON trace request (no resourceSpans); skipped"


class FileScan(Generic[T]):
    """The requests of one OTLP JSON Lines file, line by line, each damaged line a problem of its own.

    ``convert`` turns one request into what the caller keeps of it and the impossible spans it
    found (as (name, why)); whatever it raises costs its line only. Iterating yields the
    converted lines; ``problems`` holds what could not be used once iteration ends. ``offset``: where
    the line being converted begins; ``until``: stop before the line beginning there (a file's
    beginning read again gives the lines the first reading gave).
    """

    def __init__(self, path: Path, convert: Callable[[dict[str, Any]], tuple[T, list[tuple[str, str]]]],
                 progress: Any = None, loads: Callable[[bytes], Any] = json.loads, until: int | None = None) -> None:
        self.path = path
        self.until = until
        self.offset = 0
        self.problems: list[Problem] = []
        self._convert = convert
        self._progress = progress
        self._loads = loads
        self._hidden = 0

    def problem(self, line: int | None, message: str) -> None:
        if line is None or len(self.problems) < MAX_PROBLEMS_PER_FILE:
            self.problems.append(Problem(str(self.path), line, message))
        else:
            self._hidden += 1

    def __iter__(self) -> Iterator[T]:
        try:
            handle = self.path.open("rb")
        except OSError as error:
            self.problems.append(Problem(str(self.path), None, f"cannot open: {error.strerror or error}"))
            return
        convert, loads, progress, until, position = self._convert, self._loads, self._progress, self.until, 0
        with handle:
            for number, (line, size) in enumerate(_lines(handle), start=1):
                self.offset, position = position, position + size
                if until is not None and self.offset >= until:
                    break
                if progress is not None:
                    progress.update(size)
                if line is None:
                    self.problem(number, f"line of {size:,} bytes, longer than the {MAX_LINE_BYTES:,} read; skipped")
                    continue
                if not line.strip():
                    continue
                try:
                    request = loads(line)
                    if not isinstance(request, dict) or "resourceSpans" not in request:
                        self.problem(number, _kind_problem(request))
                        continue
                    converted, impossible = convert(request)
                except Exception as error:  # noqa: BLE001 - whatever a line holds, it costs that line only
                    self.problem(number, _line_problem(line, error))
                    continue
                if impossible:
                    self.problem(number, _impossible_problem(impossible))
                yield converted
        if self._hidden:
            self.problems.append(Problem(str(self.path), None, f"{self._hidden} more unreadable line(s) not listed"))


def _checked_records(request: dict[str, Any]) -> tuple[list[SpanRecord], list[tuple[str, str]]]:
    records = records_from_request(request)
    impossible = [(record.name, why) for record in records if (why := _impossible(record))]
    if impossible:
        records = [record for record in records if not _impossible(record)]
    return records, impossible


def read_file(path: Path, progress: Any = None) -> tuple[list[SpanRecord], list[Problem]]:
    """The spans of one OTLP JSON Lines file (a single JSON document works too)."""
    records: list[SpanRecord] = []
    scan = FileScan(path, _checked_records, progress)
    for line_records in scan:
        records.extend(line_records)
    return records, scan.problems


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0  # gone since it was found: read_file says so


def _progress_bar(total: int, progress: bool | None) -> Any:
    """A tqdm bar, or None: tqdm is the report extra's, and reading needs the core alone."""
    if not (progress or (progress is None and total >= PROGRESS_MIN_BYTES)):
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="B", unit_scale=True, desc="reading traces",
                disable=None if progress is None else False)


def duplicates_problem(path: str, count: int) -> Problem:
    """What the report says of spans it dropped as read before: nothing is counted twice, or dropped, unsaid."""
    return Problem(path, None, f"{count} span(s) already read (the same trace and span id: a batch exported "
                               "twice, a file replayed, copied or concatenated); counted once")


def _unique(records: list[SpanRecord], seen: set[str]) -> tuple[list[SpanRecord], int]:
    """``records`` not seen before (by trace and span id), and how many were."""
    unique = []
    for record in records:
        if record.span_id:
            key = record.trace_id + record.span_id
            if key in seen:
                continue
            seen.add(key)
        unique.append(record)
    return unique, len(records) - len(unique)


def stream_records(paths: Sequence[str | os.PathLike[str]]) -> Iterator[SpanRecord]:
    """Every span under ``paths``, one line of a file at a time (problems are ``read_paths``'s to report)."""
    files, _ = find_trace_files(paths)
    unique: dict[Path, Path] = {}
    for path in files:
        unique.setdefault(path.resolve(), path)
    for path in unique.values():
        for line_records in FileScan(path, _checked_records):
            yield from line_records


def read_paths(paths: Sequence[str | os.PathLike[str]], *, progress: bool | None = None) -> ReadResult:
    """Every span under ``paths``; ``progress`` None shows a bar for large inputs on a terminal."""
    files, problems = find_trace_files(paths)
    unique: dict[Path, Path] = {}
    for path in files:  # a file named twice (itself and its directory, ./a and a) is read once
        unique.setdefault(path.resolve(), path)
    files = list(unique.values())
    bar = _progress_bar(sum(_size(path) for path in files), progress)
    records: list[SpanRecord] = []
    seen: set[str] = set()
    # Millions of new dicts would trigger full garbage collections over and over
    # (reading turns quadratic); records hold no reference cycles.
    collecting = gc.isenabled()
    gc.disable()
    try:
        for path in files:
            file_records, file_problems = read_file(path, bar)
            file_records, duplicates = _unique(file_records, seen)
            records.extend(file_records)
            problems.extend(file_problems)
            if duplicates:
                problems.append(duplicates_problem(str(path), duplicates))
    finally:
        if collecting:
            gc.enable()
        if bar is not None:
            bar.close()
    if files and not records:
        problems.append(Problem(", ".join(str(path) for path in files[:3]) + ("..." if len(files) > 3 else ""),
                                None, "no spans found"))
    return ReadResult(records, problems, files)
