"""A local spool for spans the collector could not take, and the way to send them later.

Without it, a collector outage costs every span the SDK could not deliver in
time: counted, reported, alerted on, but gone, and an outage is exactly when a
job goes wrong. With ``spool_dir`` set, what the exporter fails to deliver (and
what is still queued when the process exits against a collector that is gone)
is appended to ``spool-r<rank>-<pid>.jsonl`` there, in the same OTLP JSON
Lines format as the file exporter: ``otel-training report`` reads it as it is,
the collector's ``otlpjsonfile`` receiver could too, and ``otel-training spool
send`` posts it to a collector's OTLP/HTTP endpoint once one is back.

The spool is bounded (``spool_max_mb``): past it, spans are dropped and
counted as before. Spans spooled are counted apart from spans delivered and
spans dropped (``FlushResult.spooled``, ``training.telemetry.spans.spooled``).
"""

from __future__ import annotations

import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan

from otel_training.exporters.otlp_json import JsonLinesFile
from otel_training.exporters.span_json import spans_to_otlp_json


def spool_file(spool_dir: str | os.PathLike[str], rank: int, pid: int | None = None) -> Path:
    """Where this process spools: one file per process, so restarts and ranks never share one."""
    return Path(spool_dir) / f"spool-r{rank}-{os.getpid() if pid is None else pid}.jsonl"


class Spool:
    """Append-only OTLP JSON Lines of undelivered batches, at most ``max_bytes``."""

    def __init__(self, path: str | os.PathLike[str], max_bytes: int) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.bytes = 0
        self.spans = 0
        self._file = JsonLinesFile(self.path)
        self._lock = threading.Lock()

    def write(self, spans: Sequence[ReadableSpan]) -> bool:
        """Spool ``spans``; False (nothing written) when that would pass the bound or the write failed."""
        if not spans:
            return True
        line = spans_to_otlp_json(spans)
        size = len(line.encode("utf-8")) + 1
        with self._lock:
            if self.bytes + size > self.max_bytes:
                return False
            self._file.append(line, len(spans))  # raises on a failed write: the caller counts a drop
            self.bytes += size
            self.spans += len(spans)
        return True

    def close(self) -> None:
        self._file.close()


@dataclass(frozen=True)
class SendResult:
    """What ``send`` did with one spool file."""

    path: Path
    lines_sent: int
    lines_total: int
    #: Line numbers the collector refused as malformed (a line a crash cut short): skipped.
    refused: tuple[int, ...] = ()
    error: str | None = None


def _post(url: str, body: bytes, timeout_s: float) -> None:
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        response.read()


def send(path: Path, traces_url: str, *, timeout_s: float = 10.0,
         post: Callable[[str, bytes, float], None] = _post) -> SendResult:
    """Post each line of a spool file to an OTLP/HTTP ``/v1/traces`` endpoint, resuming where a last run stopped.

    Progress is kept in ``<file>.sent`` (lines done), written after every line,
    so a run cut short sends nothing twice; a file sent whole is renamed
    ``*.jsonl.done`` and its progress file removed. A line the collector
    refuses as malformed (HTTP 400: a line a crash cut short) is skipped and
    named; any other failure stops, to be resumed by the next run. Only lines
    ended by a newline are sent: a last line without one is still being written.
    """
    progress = path.with_name(path.name + ".sent")
    try:
        done = int(progress.read_text().strip() or 0) if progress.exists() else 0
    except ValueError:
        return SendResult(path, 0, 0, error=f"{progress}: not a line count; remove it to send the file from its start")
    lines = path.read_bytes().split(b"\n")[:-1]
    refused: list[int] = []
    for number, line in enumerate(lines[done:], start=done + 1):
        if line.strip():
            try:
                post(traces_url, line, timeout_s)
            except urllib.error.HTTPError as error:
                if error.code != 400:
                    return SendResult(path, number - 1, len(lines), tuple(refused), f"{path}:{number}: {error}")
                refused.append(number)
            except (urllib.error.URLError, OSError) as error:
                return SendResult(path, number - 1, len(lines), tuple(refused), f"{path}:{number}: {error}")
        progress.write_text(str(number))
    path.rename(path.with_name(path.name + ".done"))
    progress.unlink(missing_ok=True)
    return SendResult(path, len(lines), len(lines), tuple(refused))


__all__ = ["SendResult", "Spool", "send", "spool_file"]
