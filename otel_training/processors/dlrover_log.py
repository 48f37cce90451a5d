"""The DLRover event-log format, written live by a span processor.

DLRover's master tails the event logs of its workers, so the BEGIN line is
written when a span starts and the END line when it ends; instant events are
written when the span holding them ends, with their own timestamps. Lines:

    [event_time] [event_id] [target] [name] [BEGIN|END|INSTANT] {json content}

or, with ``json_lines=True``, one JSON object per line with those fields.
Targets and names come from user code, so in the text format backslashes,
brackets and control characters in them are escaped (``\\n``, ``\\x5d``): a
name can neither end its line and forge the next one (a fake ``[END]``) nor
shift the bracketed fields a parser splits on. The JSON format is escaped by
JSON itself. The log is created owner-only and never through a symlink (see
``otel_training._files``).

Formatting and writing happen on a background thread behind a bounded queue:
the training thread only enqueues, never blocks, and lines past the bound are
dropped and counted (``dropped``), as are lines that cannot be written.
"""

from __future__ import annotations

import json
import os
import queue
import threading
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import StatusCode

from otel_training import semconv as sc
from otel_training._contain import log_once
from otel_training._files import DIR_MODE, FILE_MODE, SymlinkRefused, open_for_append
from otel_training._fork import forget, reset_in_child
from otel_training._text import CONTROL_ESCAPES, escape_controls

_SKIP = (sc.EVENT_TARGET, sc.EVENT_NAME)
_STOP = object()
#: A target or name may not hold verbatim the controls, nor the backslash and brackets of the format.
_TEXT_ESCAPES = {**CONTROL_ESCAPES, ord("\\"): "\\\\", ord("["): "\\x5b", ord("]"): "\\x5d"}


def _time(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9).astimezone().isoformat(timespec="milliseconds")


def _field(value: Any) -> str:
    """A target or name as a bracketed field of a text line: one line, no brackets of its own."""
    return escape_controls(value, _TEXT_ESCAPES)


def _content(attributes: Any) -> dict[str, Any]:
    content = {}
    for key, value in (attributes or {}).items():
        if key not in _SKIP:
            content[key] = list(value) if isinstance(value, tuple) else value
    return content


class DLRoverLogProcessor(SpanProcessor):
    def __init__(self, path: str | os.PathLike[str], *, json_lines: bool = False, max_queue_size: int = 8192,
                 file_mode: int = FILE_MODE, dir_mode: int = DIR_MODE) -> None:
        self.path = Path(path)
        self.json_lines = json_lines
        self.file_mode = file_mode
        self.dir_mode = dir_mode
        self.written = 0
        # Two counters, each with one writer thread, so that no increment is lost.
        self._overflowed = 0  # training thread: queue full
        self._unwritable = 0  # writer thread: could not be written
        self._queue: queue.Queue[Any] = queue.Queue(max_queue_size)
        self._stopped = False
        self._start_thread()
        reset_in_child(self, DLRoverLogProcessor._reset_in_child)

    @property
    def dropped(self) -> int:
        """Lines lost: past the queue's bound, or not writable (a symlink refused, a full disk)."""
        return self._overflowed + self._unwritable

    def _start_thread(self) -> None:
        self._thread = threading.Thread(target=self._run, name="otel-training-dlrover-log", daemon=True)
        self._thread.start()

    def _reset_in_child(self) -> None:
        """A forked child's copy (a DataLoader worker): a fresh queue and writer, unless shut down (nothing starts)."""
        if not self._stopped:
            self._queue = queue.Queue(self._queue.maxsize)
            self._start_thread()

    def _put(self, item: Any) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._overflowed += 1

    # -- training thread ----------------------------------------------------
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self._put(("BEGIN", span.start_time, span.context.span_id, span.name, dict(span.attributes or {})))

    def on_end(self, span: ReadableSpan) -> None:
        self._put(span)

    # -- writer thread ------------------------------------------------------
    def _lines(self, item: Any) -> list[str]:
        if isinstance(item, tuple):
            kind, time_ns, span_id, name, attributes = item
            return [self._line(time_ns, span_id, attributes, name, kind, _content(attributes))]
        span: ReadableSpan = item
        attributes = span.attributes or {}
        lines = []
        for event in span.events:
            event_attributes = event.attributes or {}
            lines.append(self._line(event.timestamp, span.context.span_id, {**attributes, **event_attributes},
                                    event.name, "INSTANT", _content(event_attributes)))
        content = _content(attributes)
        content["status"] = "ERROR" if span.status.status_code is StatusCode.ERROR else "OK"
        content["duration_s"] = round(((span.end_time or 0) - (span.start_time or 0)) / 1e9, 6)
        lines.append(self._line(span.end_time or 0, span.context.span_id, attributes, span.name, "END", content))
        return lines

    def _line(self, time_ns: int, span_id: int, attributes: Any, span_name: str, kind: str,
              content: dict[str, Any]) -> str:
        target = attributes.get(sc.EVENT_TARGET, "")
        name = attributes.get(sc.EVENT_NAME, span_name)
        event_id = f"{span_id:016x}"
        if self.json_lines:
            return json.dumps({"event_time": _time(time_ns), "event_id": event_id, "target": target, "name": name,
                               "event_type": kind, "content": content}, default=str)
        return (f"[{_time(time_ns)}] [{event_id}] [{_field(target)}] [{_field(name)}] [{kind}] "
                f"{json.dumps(content, default=str)}")

    def _open(self) -> TextIO:
        fd = open_for_append(self.path, self.file_mode, self.dir_mode)
        return os.fdopen(fd, "a", encoding="utf-8", buffering=1 << 16)

    def _run(self) -> None:
        handle = None
        while True:
            item = self._queue.get()
            lines: list[str] = []
            done = 0
            try:
                if item is _STOP:
                    return
                if isinstance(item, threading.Event):
                    if handle is not None:
                        handle.flush()
                    item.set()
                    continue
                lines = self._lines(item)
                if handle is None:
                    handle = self._open()
                for line in lines:
                    handle.write(line + "\n")
                    done += 1
                    self.written += 1
                if self._queue.empty():
                    handle.flush()
            except SymlinkRefused:
                self._unwritable += len(lines)
                log_once(f"dlrover-log:{self.path}", "otel_training: not writing the DLRover log %s: it is a "
                         "symbolic link, which is not followed (remove it); lines are counted as dropped",
                         self.path, exc_info=False)
            except Exception:  # noqa: BLE001 - the writer thread goes on: the lines are counted as unwritable
                self._unwritable += len(lines) - done
                log_once(f"dlrover-log:{self.path}", "otel_training: cannot write the DLRover log %s", self.path)
            finally:
                if item is _STOP and handle is not None:
                    handle.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        done = threading.Event()
        try:
            self._queue.put(done, timeout=timeout_millis / 1000)
        except queue.Full:
            return False
        return done.wait(timeout_millis / 1000)

    def shutdown(self) -> None:
        self._stopped = True
        forget(self)  # a shut-down processor starts nothing in a child
        self.force_flush(1000)
        try:
            self._queue.put(_STOP, timeout=1.0)
        except queue.Full:
            pass
        self._thread.join(1.0)
