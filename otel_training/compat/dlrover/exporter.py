"""Where DLRover's events go: the log file, the console, and the background writer in front of them.

The training thread never waits for the disk: ``AsyncExporter`` takes each
formatted line behind a bounded queue (lines past it are dropped and counted)
and a thread writes them, flushed, so a tailing master sees them at once. Fork
handling lives here too, because only the exporters hold streams and threads a
forked child must not reuse. The process's default exporter (made from
``Config`` at import, as DLRover does) is kept here with them.
"""

from __future__ import annotations

import atexit
import os
import queue
import sys
import threading
import time
from typing import Any, TextIO

from otel_training._contain import contain, log_once
from otel_training._files import DIR_MODE, FILE_MODE, SymlinkRefused, open_for_append
from otel_training._fork import forget, reset_in_child
from otel_training.compat.dlrover.config import DEFAULT_QUEUE_SIZE, Config, get_rank
from otel_training.compat.dlrover.event import Event, JsonFormatter, LogFormatter


class EventExporter:
    """Where events go (DLRover's interface): subclass it to send them elsewhere."""

    def export(self, event: Event) -> None:
        raise NotImplementedError

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass


_STOP = object()


class _LineExporter(EventExporter):
    """Formats each event and writes it as one line, flushed: DLRover's synchronous exporters."""

    def __init__(self, formatter: LogFormatter | JsonFormatter | None = None) -> None:
        self._formatter = formatter if formatter is not None else LogFormatter()
        self._stream: TextIO | None = None

    def format(self, event: Event) -> str:
        return self._formatter.format(event)

    def export(self, event: Event) -> None:
        self.write(self.format(event))

    def write(self, line: str, flush: bool = True) -> None:
        stream = self._stream if self._stream is not None else self._open()
        stream.write(line + "\n")
        if flush:
            stream.flush()

    def flush(self) -> None:
        if self._stream is not None:
            self._stream.flush()

    def _open(self) -> TextIO:
        raise NotImplementedError

    def after_fork(self) -> None:
        """In a forked child (the writer's fork reset): set the parent's stream aside, open our own on next write."""
        # The parent's stream may hold its unwritten lines, or a lock its writer thread held: the child
        # never flushes nor closes it (that would write the parent's lines twice) and opens its own.
        if self._stream is not None:
            _inherited_streams.append(self._stream)
            self._stream = None


#: Streams a forked child inherited, kept so that they are never flushed or closed in it.
_inherited_streams: list[TextIO] = []


class TextFileExporter(_LineExporter):
    """DLRover's log file, ``<file_dir>/events_<RANK>.log``: created owner-only, never through a symlink."""

    def __init__(self, file_dir: str | os.PathLike[str], formatter: LogFormatter | JsonFormatter | None = None, *,
                 file_mode: int = FILE_MODE, dir_mode: int = DIR_MODE) -> None:
        super().__init__(formatter)
        self.path = os.path.join(os.fspath(file_dir), f"events_{get_rank()}.log")
        self.file_mode = file_mode
        self.dir_mode = dir_mode

    def _open(self) -> TextIO:
        fd = open_for_append(self.path, self.file_mode, self.dir_mode)
        # A lone surrogate (a path decoded with surrogateescape) is written as its \\udcXX escape.
        self._stream = os.fdopen(fd, "a", encoding="utf-8", errors="backslashreplace")
        return self._stream

    def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()


class ConsoleExporter(_LineExporter):
    """The lines on standard output (``DLROVER_EVENT_EVENT_EXPORTER=CONSOLE``)."""

    def write(self, line: str, flush: bool = True) -> None:
        sys.stdout.write(line + "\n")
        if flush:
            sys.stdout.flush()

    def flush(self) -> None:
        sys.stdout.flush()


class AsyncExporter(EventExporter):
    """Hands events to another exporter on a background thread, behind a bounded queue.

    The training thread never waits for a disk: an event past the bound is
    dropped and counted. Our own exporters' lines are formatted here, when the
    event happens, so a line says what its content was then (a dict the
    training loop later changes does not change it); the writer flushes each
    line, so a tailing master sees an instant within milliseconds.
    """

    def __init__(self, exporter: EventExporter, max_queue_size: int = 1024) -> None:
        self._inner_exporter = exporter
        self._queue: queue.Queue[Any] = queue.Queue(max_queue_size)
        self._running = False
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()
        # One counter per writing side, so that no increment is lost between threads.
        self._refused = 0  # callers: queue full, or an event that could not be formatted
        self._errors = 0  # writer thread: the inner exporter raised
        self._lost_at_close = 0
        self._leftover: list[Any] = []
        self.written = 0
        reset_in_child(self, AsyncExporter._after_fork)

    @property
    def dropped(self) -> int:
        """Events lost: past the queue's bound, unformattable, or left when ``close`` ran out of time."""
        return self._refused + self._lost_at_close

    def get_metrics(self) -> dict[str, int]:
        return {"queue_size": self._queue.qsize(), "queue_maxsize": self._queue.maxsize,
                "dropped_events": self.dropped, "error_events": self._errors}

    def start(self) -> None:
        if self._running:
            return
        self._inner_exporter.start()
        self._running = True
        self._start_thread()

    def _start_thread(self) -> None:
        with self._thread_lock:
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="otel-training-dlrover-events", daemon=True)
                thread.start()
                self._thread = thread

    def export(self, event: Event) -> None:
        if not self._running:
            return
        item: Any = event
        if isinstance(self._inner_exporter, _LineExporter):
            try:
                item = self._inner_exporter.format(event)
            except Exception:  # noqa: BLE001 - an event that cannot be formatted is counted and dropped, never raised
                self._refused += 1
                log_once("dlrover-compat:format", "otel_training: could not format a DLRover event; it is dropped")
                return
        if self._thread is None:  # first event in a forked child
            self._start_thread()
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._refused += 1

    def _export(self, item: Any) -> None:
        try:
            if isinstance(item, str):
                # Flushed whenever the writer has caught up: a tailing master sees each line at once.
                self._inner_exporter.write(item, flush=self._queue.empty())  # type: ignore[attr-defined]  # str items come only from a _LineExporter (export formats them)
            else:
                self._inner_exporter.export(item)
            self.written += 1
        except SymlinkRefused as error:
            self._errors += 1
            log_once(f"dlrover-compat:{error.filename}", "otel_training: not writing the DLRover event log %s: it "
                     "is a symbolic link, which is not followed (remove it); events are counted as errors",
                     error.filename, exc_info=False)
        except Exception:  # noqa: BLE001 - a failed write (full disk, closed file) is counted; the writer thread lives on
            self._errors += 1
            log_once(f"dlrover-compat:export:{id(self)}", "otel_training: cannot write a DLRover event")

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if isinstance(item, threading.Event):
                self._flush()
                item.set()
                continue
            if not self._running:  # closing: ``close`` writes it, if its time allows
                self._leftover.append(item)
                return
            self._export(item)

    def _flush(self) -> None:
        if isinstance(self._inner_exporter, _LineExporter):
            # A failed flush is logged; the writer thread and force_flush's waiter go on.
            with contain(f"dlrover-compat:flush:{id(self)}", "otel_training: cannot flush the DLRover event log"):
                self._inner_exporter.flush()

    def force_flush(self, timeout_s: float = 5.0) -> bool:
        """Wait (at most ``timeout_s``) until every event exported so far is written."""
        if not self._running or self._thread is None:
            return True
        done = threading.Event()
        try:
            self._queue.put(done, timeout=timeout_s)
        except queue.Full:
            return False
        return done.wait(timeout_s)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread and write what is queued, within ``timeout`` seconds in all; the rest is dropped."""
        deadline = time.monotonic() + timeout
        was_running, self._running = self._running, False
        forget(self)  # a shut-down exporter has nothing to redo in a child
        thread = self._thread
        if thread is not None and thread.is_alive():
            try:
                self._queue.put_nowait(_STOP)  # wake an idle writer; a busy one sees _running
            except queue.Full:
                pass
            thread.join(max(0.0, deadline - time.monotonic()))
        left = self._leftover + _drain(self._queue)
        self._leftover = []
        for item in left:
            if isinstance(item, threading.Event):
                item.set()
            elif item is not _STOP:
                if (thread is None or not thread.is_alive()) and time.monotonic() < deadline:
                    self._export(item)
                else:
                    self._lost_at_close += 1
        if was_running:
            self._inner_exporter.close()

    def _after_fork(self) -> None:
        # A forked child (a DataLoader worker) gets an empty queue; its writer starts on its first event.
        self._queue = queue.Queue(self._queue.maxsize)
        self._leftover = []
        self._thread = None
        self._thread_lock = threading.Lock()
        if isinstance(self._inner_exporter, _LineExporter):
            self._inner_exporter.after_fork()  # the child sets the parent's stream aside


def _drain(items: queue.Queue[Any]) -> list[Any]:
    drained = []
    while True:
        try:
            drained.append(items.get_nowait())
        except queue.Empty:
            return drained




# -- the process's default exporter -------------------------------------------

_default_lock = threading.Lock()
_default_exporter: EventExporter | None = None
_atexit_registered = False


def init_default_exporter() -> None:
    """Make the process's exporter from ``Config`` (done at import, as DLRover does); nothing is written yet."""
    global _default_exporter, _atexit_registered
    config = Config.singleton_instance()
    if not config.enable:
        return
    with _default_lock:
        if _default_exporter is not None:
            return
        # DLRover raises at import for an unknown name; here it is logged, naming the variable, and the default used.
        text = config.one_of("text_formatter", ("LOG", "JSON"))
        formatter = JsonFormatter() if text == "JSON" else LogFormatter()
        lines: EventExporter
        if config.one_of("event_exporter", ("TEXT_FILE", "CONSOLE")) == "CONSOLE":
            lines = ConsoleExporter(formatter)
        else:
            lines = TextFileExporter(config.file_dir, formatter)
        # Always asynchronous, whatever async_exporter says (DLRover's default is not): the training thread never
        # waits for the disk. So the queue is always bounded: DLRover's "0 or below: unbounded" becomes the default.
        _default_exporter = AsyncExporter(lines, config.positive("queue_size", DEFAULT_QUEUE_SIZE))
        _default_exporter.start()
        if not _atexit_registered:
            atexit.register(close_default_exporter)
            _atexit_registered = True


def get_default_exporter() -> EventExporter | None:
    return _default_exporter


def close_default_exporter() -> None:
    """Write what is queued and close the log; events from then on go nowhere (as in DLRover)."""
    global _default_exporter
    with _default_lock:
        exporter, _default_exporter = _default_exporter, None
    if isinstance(exporter, AsyncExporter):
        exporter.close(timeout=2.0)  # at exit, bounded as otel-training's own flush is
    elif exporter is not None:
        exporter.close()
