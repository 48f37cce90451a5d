"""OTLP JSON Lines files: the embedded default sink.

The format is the OpenTelemetry file-exporter format that the collector's
``otlpjsonfile`` receiver reads: one ``ExportTraceServiceRequest`` (or
``ExportMetricsServiceRequest``) JSON object per line, lowerCamelCase keys,
integer enums, trace and span ids in hex. The SDK has no JSON exporter. Spans,
exported on the batch processor's thread while the training thread waits for
the GIL, are written as text straight from the SDK's spans
(``otel_training.exporters.span_json``), the same text to the byte as the route
metrics take: the request built by the OTLP protobuf encoder and converted with
protobuf's JSON mapping, whose base64 ids are re-encoded as hex. Metrics are
one line per collection interval, not per span, and keep that route.

Each batch is one ``write()`` of one whole line to a file opened with
``O_APPEND``, so a restarted rank appending to the same file cannot interleave
with, or corrupt, the lines of its previous life; a line left cut short by a
crash, or by a full disk, is closed with a newline before anything is appended
after it. The file is created owner-only and never through a symlink (see
``otel_training._files``); if it is deleted or renamed away while open, the
next batch goes to a new file at its path rather than to an unlinked inode.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_training._contain import log_once
from otel_training._files import DIR_MODE, FILE_MODE, SymlinkRefused, open_for_append
from otel_training.exporters.span_json import spans_to_otlp_json

_ID_KEYS = frozenset(("traceId", "spanId", "parentSpanId"))


def trace_file(output_dir: str | os.PathLike[str], rank: int) -> Path:
    """Where the file exporter writes the spans of ``rank``."""
    return Path(output_dir) / f"traces-r{rank}.jsonl"


def metrics_file(output_dir: str | os.PathLike[str], rank: int) -> Path:
    """Where the file exporter writes the metrics of ``rank``."""
    return Path(output_dir) / f"metrics-r{rank}.jsonl"


def _hex_ids(node: Any) -> None:
    """Re-encode protobuf-JSON base64 ids as the hex that OTLP/JSON requires."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ID_KEYS and isinstance(value, str):
                node[key] = base64.b64decode(value).hex()
            else:
                _hex_ids(value)
    elif isinstance(node, list):
        for item in node:
            _hex_ids(item)


def to_otlp_json(message: Any) -> str:
    """One OTLP request message as one line of OTLP JSON (no newline)."""
    data = MessageToDict(message, use_integers_for_enums=True)
    _hex_ids(data)
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def _log_write_failure(path: Path, what: str, error: Exception) -> None:
    if isinstance(error, SymlinkRefused):
        log_once(f"file-export:{path}", "otel_training: not writing %s to %s: it is a symbolic link, which is "
                 "not followed (remove it); they are counted as dropped", what, path, exc_info=False)
    else:
        log_once(f"file-export:{path}", "otel_training: cannot write %s to %s", what, path)


class JsonLinesFile:
    """An append-only file of whole lines, safe across restarts of the writer.

    ``lost_records`` counts what was written to the file before it was deleted
    or renamed away under the writer: acknowledged once, no longer at its path.
    """

    def __init__(self, path: str | os.PathLike[str], *, file_mode: int = FILE_MODE, dir_mode: int = DIR_MODE) -> None:
        self.path = Path(path)
        self.file_mode = file_mode
        self.dir_mode = dir_mode
        self.lost_records = 0
        self._fd: int | None = None
        self._batches = 0  # written to the file now open
        self._records = 0
        self._lock = threading.Lock()

    def _open(self) -> int:
        fd = open_for_append(self.path, self.file_mode, self.dir_mode, readable=True)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                os.write(fd, b"\n")  # isolate a line a crash or a full disk left unfinished
        except BaseException:
            os.close(fd)
            raise
        self._batches = self._records = 0
        return fd

    def _still_linked(self, fd: int) -> bool:
        """Whether ``fd`` is still the file at ``path`` (not deleted, not renamed away)."""
        opened = os.fstat(fd)
        if opened.st_nlink == 0:
            return False
        try:
            current = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        except OSError:
            return True  # cannot tell (a directory made unsearchable): keep writing where we were
        return (current.st_dev, current.st_ino) == (opened.st_dev, opened.st_ino)

    def _forget_replaced(self) -> None:
        assert self._fd is not None
        os.close(self._fd)
        self._fd = None
        self.lost_records += self._records
        log_once(f"file-replaced:{self.path}",
                 "otel_training: %s was deleted or replaced while being written; writing to a new file there. "
                 "%d batch(es) of %d record(s) written to it before are no longer at that path",
                 self.path, self._batches, self._records, exc_info=False)

    def _write(self, data: bytes) -> None:
        if self._fd is None:
            self._fd = self._open()
        view = memoryview(data)
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except BaseException:
            # A full disk may have cut the line; reopening closes it before the next one.
            os.close(self._fd)
            self._fd = None
            raise

    def append(self, line: str, records: int = 1) -> None:
        """Write ``line``; ``records`` is what it holds, for the count of what a deletion lost."""
        data = (line + "\n").encode("utf-8")
        with self._lock:
            if self._fd is not None and not self._still_linked(self._fd):
                self._forget_replaced()
            self._write(data)
            if not self._still_linked(self._fd):  # type: ignore[arg-type]  # _write() opened it, or raised
                # Deleted while this very line was written: it went nowhere; write it again.
                self._forget_replaced()
                self._write(data)
            self._batches += 1
            self._records += records

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class OtlpJsonFileSpanExporter(SpanExporter):
    """Writes each batch of spans as one OTLP JSON line."""

    def __init__(self, path: str | os.PathLike[str], *, file_mode: int = FILE_MODE, dir_mode: int = DIR_MODE) -> None:
        self._file = JsonLinesFile(path, file_mode=file_mode, dir_mode=dir_mode)

    @property
    def path(self) -> Path:
        return self._file.path

    @property
    def lost_spans(self) -> int:
        """Spans exported to the file before it was deleted or renamed away while open."""
        return self._file.lost_records

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            self._file.append(spans_to_otlp_json(spans), len(spans))
        except Exception as error:  # noqa: BLE001 - logged once; the SDK counts the failed batch, training goes on
            _log_write_failure(self._file.path, "spans", error)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._file.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class OtlpJsonFileMetricExporter(MetricExporter):
    """Writes each metrics collection as one OTLP JSON line."""

    def __init__(self, path: str | os.PathLike[str], *, file_mode: int = FILE_MODE, dir_mode: int = DIR_MODE) -> None:
        super().__init__(preferred_temporality={}, preferred_aggregation={})
        self._file = JsonLinesFile(path, file_mode=file_mode, dir_mode=dir_mode)

    @property
    def path(self) -> Path:
        return self._file.path

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        try:
            if metrics_data.resource_metrics:
                self._file.append(to_otlp_json(encode_metrics(metrics_data)))
        except Exception as error:  # noqa: BLE001 - logged once; the metrics SDK sees a failure, training goes on
            _log_write_failure(self._file.path, "metrics", error)
            return MetricExportResult.FAILURE
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._file.close()


__all__ = [
    "JsonLinesFile",
    "OtlpJsonFileMetricExporter",
    "OtlpJsonFileSpanExporter",
    "metrics_file",
    "to_otlp_json",
    "trace_file",
]
