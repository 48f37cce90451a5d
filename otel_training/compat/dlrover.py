"""DLRover's ``training_event`` API: DLRover's own event log, with OpenTelemetry spans on top.

A DLRover-instrumented script switches by changing one import::

    from dlrover.python.training_event import TrainerProcess, DLRoverAgentEvent   # before
    from otel_training.compat.dlrover import TrainerProcess, DLRoverAgentEvent    # after

Whatever DLRover's master and tools read stays as DLRover writes it: event
names, which events are instants and which BEGIN/END pairs, stage names
(``<parent>#<stage>``, content inherited), content keys as given, ``success`` /
``error`` on END, and the log itself (``events_<RANK>.log`` under
``DLROVER_EVENT_FILE_DIR``, DLRover's text or JSON lines, pid included),
written as each event happens, so the master's collector keeps detecting hangs
from it. The spans are the bonus: each Duration is also the span otel-training's
own API makes for it (``#step`` is a ``training.step`` span with the
``training.step`` attribute), so the stuck detector, goodput and the report
work on DLRover-instrumented code unchanged. ``_SPANS`` and
``events.attributes.ALIASES`` are the one place where DLRover's names and
keys meet ours; the log never sees our names.

As in DLRover, every public method of these classes and of subclasses of them
is a safe call: an exception inside is logged and the call returns an inert
``SafeCallable``, which accepts any further call, attribute or ``with``, so
instrumentation never breaks training. Unlike DLRover, the training thread
never waits for the disk: lines are formatted when the event happens and
written by a background thread behind a bounded queue (lines past it are
dropped and counted). docs/compat.md lists every difference and its reason.
"""

from __future__ import annotations

import atexit
import enum
import json
import logging
import os
import queue
import random
import re
import signal
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, TextIO, TypeVar

from otel_training import semconv as sc
from otel_training._contain import contained, log_once
from otel_training._files import DIR_MODE, FILE_MODE, SymlinkRefused, open_for_append
from otel_training._text import CONTROL_ESCAPES, escape_controls
from otel_training.events.attributes import METRIC_PREFIX, text, to_attributes
from otel_training.events.duration import Duration as _Span
from otel_training.events.duration import HostWork, StepDuration
from otel_training.events.process import Process as _SpanProcess

__all__ = [
    "AsyncExporter",
    "CommonEventName",
    "CommonPredefined",
    "Config",
    "ConsoleExporter",
    "DLRoverAgentEvent",
    "DLRoverAgentEventName",
    "DLRoverCommonEvent",
    "DLRoverCommonEventName",
    "DLRoverMasterEvent",
    "DLRoverMasterEventName",
    "Duration",
    "DurationSpan",
    "Event",
    "EventEmitter",
    "EventExporter",
    "EventTargetName",
    "EventType",
    "EventTypeName",
    "ErrorHandler",
    "JsonFormatter",
    "LogFormatter",
    "Process",
    "SafeCallable",
    "TextFileExporter",
    "TrainInitSpan",
    "TrainerEventName",
    "TrainerProcess",
    "WarningType",
    "close_default_exporter",
    "generate_event_id",
    "get_default_exporter",
    "init_default_exporter",
    "init_error_handler",
]

logger = logging.getLogger("otel_training.compat.dlrover")

D = TypeVar("D", bound="DurationSpan")


# -- DLRover's names ---------------------------------------------------------
class EventTargetName:
    """The targets whose ``#step``, ``#save`` and ``#evaluate`` events DLRover's master collects."""

    TRAINER = "AtorchTrainerV2"
    SAVER = "AsyncSaver"


class EventTypeName:
    BEGIN = "BEGIN"
    END = "END"
    INSTANT = "INSTANT"


class EventType(enum.Enum):
    """A BEGIN and its END share an event id; an INSTANT stands alone."""

    BEGIN = enum.auto()
    END = enum.auto()
    INSTANT = enum.auto()


class TrainerEventName(enum.Enum):
    TRAIN_START = "#start"
    TRAIN_INIT = "#init"
    TRAIN_LOAD_DATASET = "#load_dataset"
    TRAIN_LOAD_CKPT = "#load_ckpt"
    TRAIN_PERSIST_CKPT = "#persist_ckpt"
    TRAIN_FINISH = "#finish"
    TRAIN_INIT_END = "#init_end"
    TRAIN = "#train"
    EPOCH = "#epoch"
    TRAIN_STEP = "#step"
    TRAIN_SUBSTEP = "#substep"
    EVALUATE = "#evaluate"
    PREDICT = "#predict"
    PREDICT_STEP = "#predict_step"
    SAVE = "#save"
    LOG = "#log"


class DLRoverCommonEventName(enum.Enum):
    DLROVER_RENDEZVOUS = "#rendezvous"
    DLROVER_PROCESS_RESTART = "#process_restart"
    DLROVER_PROCESS_RESTART_MEMBERSHIP = "#process_restart_membership"
    DLROVER_PROCESS_SUCCEEDED = "#process_succeeded"
    DLROVER_PROCESS_FAIL = "#process_fail"
    DLROVER_FAULT_DETECT = "#fault_detect"
    DLROVER_FAULT_TOLERANCE = "#fault_tolerance"
    DLROVER_PRE_CHECK = "#pre_check"
    DLROVER_NETWORK_CHECK = "#network_check"
    DLROVER_JOB_ABORTION = "#job_abortion"
    DLROVER_JOB_RESTART = "#job_restart"


class DLRoverMasterEventName(enum.Enum):
    DLROVER_MASTER_START = "#master_start"
    DLROVER_MASTER_EXIT = "#master_exit"
    DLROVER_WORKER_CREATE = "#worker_create"
    DLROVER_WORKER_RELAUNCH = "#worker_relaunch"
    DLROVER_WORKER_NO_HEARTBEAT = "#worker_no_heartbeat"
    DLROVER_WORKER_EVENT = "#worker_event"
    DLROVER_JOB_TRAIN = "#job_train"
    DLROVER_NODE_JOIN = "#node_join"


class DLRoverAgentEventName(enum.Enum):
    DLROVER_AGENT_START = "#agent_start"
    DLROVER_AGENT_EXIT = "#agent_exit"


class CommonEventName:
    WARNING = "#warning"
    EXCEPTION = "#exception"


class WarningType:
    DEPRECATED = "deprecated"


# -- where DLRover's names meet ours -----------------------------------------
_CHECKPOINT_KEYS: Mapping[str, str] = {"global_step": sc.CHECKPOINT_STEP}

#: DLRover's Duration names -> (span name, span class, content keys meaning
#: something else on that span than ``ALIASES`` says). The span names and
#: classes are those of otel-training's own API, so the stuck detector, goodput
#: (host work, checkpoint steps) and the device timeline see the same spans.
#: Other names make a plain span of the DLRover name.
_SPANS: Mapping[str, tuple[str, type[_Span], Mapping[str, str]]] = {
    "#train": (sc.SPAN_TRAIN, HostWork, {}),
    "#epoch": (sc.SPAN_EPOCH, _Span, {}),
    "#step": (sc.SPAN_STEP, StepDuration, {}),
    "#evaluate": (sc.SPAN_EVALUATE, HostWork, {}),
    "#predict": (sc.SPAN_PREDICT, HostWork, {}),
    "#save": (sc.SPAN_SAVE_CHECKPOINT, HostWork, _CHECKPOINT_KEYS),
    "#persist_ckpt": (sc.SPAN_PERSIST_CHECKPOINT, HostWork, _CHECKPOINT_KEYS),
    "#init": (sc.SPAN_INIT, HostWork, {}),
    "#init##load_ckpt": (sc.SPAN_LOAD_CHECKPOINT, HostWork, {}),
    "#init##load_dataset": (sc.SPAN_LOAD_DATASET, HostWork, {}),
    "#rendezvous": (sc.SPAN_RENDEZVOUS, _Span, {"round_num": sc.ELASTIC_RENDEZVOUS_ROUND}),
    "#network_check": (sc.SPAN_NETWORK_CHECK, _Span, {}),
}
_PLAIN: tuple[None, type[_Span], Mapping[str, str]] = (None, _Span, {})
#: On END these are the span's status (OK, or ERROR with the message), not attributes.
_OUTCOME = ("success", "error")


def _span_attributes(content: Mapping[Any, Any], renames: Mapping[str, str], skip: tuple[str, ...] = ()
                     ) -> dict[str, Any]:
    return to_attributes({renames.get(key, key): value for key, value in content.items() if key not in skip})


def _instant_attributes(name: Any, content: Mapping[Any, Any]) -> dict[str, Any]:
    if name == TrainerEventName.LOG.value and isinstance(content.get("logs"), Mapping):
        # The metrics of a #log are metrics, as TrainerProcess.log makes them (training.loss, training.metric.*).
        attributes = to_attributes({key: value for key, value in content.items() if key != "logs"})
        attributes.update(to_attributes(content["logs"], unnamed_prefix=METRIC_PREFIX))
        return attributes
    return to_attributes(content)


# -- the event and its two line formats --------------------------------------
def generate_event_id() -> str:
    """A short random id (DLRover's 8 hex digits): a BEGIN and its END share one.

    Not from ``uuid4`` as DLRover's: reading the system's entropy costs more than
    the rest of a step's events, and an id needs to be distinct, not secret.
    """
    return f"{random.getrandbits(32):08x}"


#: Beyond what JSON escapes itself: DEL, the C1 controls (NEL ends a line for
#: ``str.splitlines``), the line separators and the bidirectional overrides. As
#: ``\\uXXXX`` they stay valid JSON and valid Python literals (the master reads
#: step content with ``ast.literal_eval``).
_JSON_ESCAPES = {code: f"\\u{code:04x}" for code in CONTROL_ESCAPES if code >= 0x7F}
#: A bracketed field may not hold the controls, nor the backslash and brackets of the line.
_FIELD_ESCAPES = {**CONTROL_ESCAPES, ord("\\"): "\\\\", ord("["): "\\x5b", ord("]"): "\\x5d"}


def _default(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    return f"<<non-serializable: {type(value).__qualname__}>>"


def _salvage(content: Any) -> Any:
    """What of ``content`` JSON can hold: a value it cannot (a cycle) is described, a key stringified."""
    out: dict[str, Any] = {}
    try:
        for key, value in content.items():
            try:
                json.dumps(value, default=_default)
                out[key if isinstance(key, str) else text(key)] = value
            except Exception:  # noqa: BLE001
                out[key if isinstance(key, str) else text(key)] = _default(value)
    except Exception:  # noqa: BLE001 - not a readable mapping at all
        return _default(content)
    return out


#: Finds what the tables above escape, so that the common line skips the translation.
_JSON_UNSAFE = re.compile("[" + "".join(re.escape(chr(code)) for code in _JSON_ESCAPES) + "]")
_FIELD_UNSAFE = re.compile("[" + "".join(re.escape(chr(code)) for code in _FIELD_ESCAPES) + "]")


#: The event whose content DLRover's master reads with ``ast.literal_eval``, not as JSON.
_MASTER_LITERAL_EVENT = "#step"


def _as_literal(value: Any) -> Any:
    """``value`` as content DLRover's master can read: JSON that is also a Python literal, no ``[``.

    The master removes every ``[...]`` from a ``#step`` line, then parses the rest with
    ``ast.literal_eval``. So JSON's true/false become 1/0 (the same truthiness in both), nulls
    are left out, and an array becomes its JSON text (its brackets escaped in the line, so the
    string reads back as written). DLRover's own writer puts ``"success": true`` on every
    step's END: lines its master refuses.
    """
    if value is True or value is False:
        return int(value)
    if isinstance(value, dict):
        return {key: _as_literal(item) for key, item in value.items() if item is not None}
    if isinstance(value, (list, tuple)):
        return json.dumps(value, default=_default)
    return value


def _dumps(record: Any) -> str:
    dumped = json.dumps(record, ensure_ascii=False, default=_default)
    return dumped.translate(_JSON_ESCAPES) if _JSON_UNSAFE.search(dumped) else dumped


def _field(value: Any) -> str:
    if type(value) is str and not _FIELD_UNSAFE.search(value):
        return f"[{value}]"
    return f"[{escape_controls(value, _FIELD_ESCAPES)}]"


@dataclass(frozen=True)
class Event:
    """One line of the log, as DLRover's own ``Event`` holds it."""

    pid: int | str
    event_id: str
    event_time: datetime
    name: str
    event_type: EventType
    content: dict[str, Any]
    target: str = ""
    #: Bracketed fields before the content (time, pid, id, target, name, type): the master checks the count.
    max_event_prefix: ClassVar[int] = 6

    def __str__(self) -> str:
        """DLRover's text line: ``[time] [pid] [event_id] [target] [name] [type] {content}``."""
        literal = self.name == _MASTER_LITERAL_EVENT
        body = _as_literal(self.content) if literal else self.content
        try:
            content = _dumps(body)
        except Exception:  # noqa: BLE001 - a cycle, or keys JSON cannot hold
            content = _dumps(_salvage(body))
        if literal and ("[" in content or "]" in content):
            content = content.replace("[", "\\u005b").replace("]", "\\u005d")  # only inside strings now
        return " ".join((_field(self.event_time.isoformat()), _field(self.pid), _field(self.event_id),
                         _field(self.target), _field(self.name), _field(self.event_type.name), content))

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "event_id": self.event_id,
            "event_time": self.event_time.isoformat(),
            "target": self.target,
            "name": self.name,
            "event_type": self.event_type.name,
            "content": self.content,
        }

    def to_json(self) -> str:
        record = self.to_dict()
        try:
            return _dumps(record)
        except Exception:  # noqa: BLE001
            record["content"] = _salvage(self.content)
            record["target"], record["name"], record["event_id"] = (
                text(record["target"]), text(record["name"]), text(record["event_id"]))
            return _dumps(record)

    @classmethod
    def _now(cls, event_type: EventType, event_id: str, target: str, name: str, content: Any) -> Event:
        return cls(pid=os.getpid(), event_id=event_id, event_time=datetime.now(), name=name,
                   event_type=event_type, content=content if content is not None else {}, target=target)

    @classmethod
    def instant(cls, event_id: str, target: str, name: str, content: dict[str, Any] | None = None) -> Event:
        return cls._now(EventType.INSTANT, event_id, target, name, content)

    @classmethod
    def begin(cls, event_id: str, target: str, name: str, content: dict[str, Any]) -> Event:
        return cls._now(EventType.BEGIN, event_id, target, name, content)

    @classmethod
    def end(cls, event_id: str, target: str, name: str, content: dict[str, Any]) -> Event:
        return cls._now(EventType.END, event_id, target, name, content)


class LogFormatter:
    """DLRover's text line (``DLROVER_EVENT_TEXT_FORMATTER=LOG``, the default)."""

    def format(self, event: Event) -> str:
        return str(event)


class JsonFormatter:
    """One JSON object per line (``DLROVER_EVENT_TEXT_FORMATTER=JSON``)."""

    def format(self, event: Event) -> str:
        return event.to_json()


# -- exporters ---------------------------------------------------------------
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

    def _after_fork(self) -> None:
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
        self.path = os.path.join(os.fspath(file_dir), f"events_{_rank()}.log")
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
    """The lines on standard output (``DLROVER_EVENT_EXPORTER=CONSOLE``)."""

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
        _exporters.add(self)

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
            except Exception:  # noqa: BLE001
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
                self._inner_exporter.write(item, flush=self._queue.empty())  # type: ignore[attr-defined]
            else:
                self._inner_exporter.export(item)
            self.written += 1
        except SymlinkRefused as error:
            self._errors += 1
            log_once(f"dlrover-compat:{error.filename}", "otel_training: not writing the DLRover event log %s: it "
                     "is a symbolic link, which is not followed (remove it); events are counted as errors",
                     error.filename, exc_info=False)
        except Exception:  # noqa: BLE001
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
            try:
                self._inner_exporter.flush()
            except Exception:  # noqa: BLE001
                log_once(f"dlrover-compat:flush:{id(self)}", "otel_training: cannot flush the DLRover event log")

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
        _exporters.discard(self)
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
            self._inner_exporter._after_fork()  # noqa: SLF001


def _drain(items: queue.Queue[Any]) -> list[Any]:
    drained = []
    while True:
        try:
            drained.append(items.get_nowait())
        except queue.Empty:
            return drained


_exporters: weakref.WeakSet[AsyncExporter] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for exporter in list(_exporters):
        exporter._after_fork()  # noqa: SLF001


os.register_at_fork(after_in_child=_after_fork_in_child)


# -- DLRover's configuration -------------------------------------------------
def _rank() -> str:
    rank = os.getenv("RANK", "0")
    return rank if rank else "empty"


def _env_bool(name: str, default: bool) -> bool:
    value = os.getenv(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes", "y", "on", "enable", "enabled"):
        return True
    if lowered in ("false", "0", "no", "n", "off", "disable", "disabled"):
        return False
    return default


class Config:
    """DLRover's ``DLROVER_EVENT_*`` settings, read from the environment once per process.

    A value DLRover would refuse (an unknown exporter or formatter) is logged and
    the default used: a misspelt variable must not stop training at import.
    """

    _instance: ClassVar[Config | None] = None
    _instance_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self.enable = _env_bool("DLROVER_EVENT_ENABLE", True)
        self.file_dir = os.getenv("DLROVER_EVENT_FILE_DIR") or "/tmp/dlrover"
        self.text_formatter = self._choice("DLROVER_EVENT_TEXT_FORMATTER", ("LOG", "JSON"))
        self.event_exporter = self._choice("DLROVER_EVENT_EXPORTER", ("TEXT_FILE", "CONSOLE"))
        try:
            self.queue_size = max(1, int(os.getenv("DLROVER_EVENT_QUEUE_SIZE", "1024")))
        except ValueError:
            self.queue_size = 1024
        self.hook_error = _env_bool("DLROVER_EVENT_HOOK_ERROR", False)
        self.rank = _rank()
        self.pid = str(os.getpid())

    @staticmethod
    def _choice(name: str, choices: tuple[str, ...]) -> str:
        value = os.getenv(name, choices[0])
        if value not in choices:
            log_once(f"dlrover-compat:{name}", "otel_training: %s=%r is not one of %s; using %s", name, value,
                     choices, choices[0], exc_info=False)
            return choices[0]
        return value

    @classmethod
    def singleton_instance(cls) -> Config:
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def __repr__(self) -> str:
        return f"Config({vars(self)!r})"


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
        formatter = JsonFormatter() if config.text_formatter == "JSON" else LogFormatter()
        lines: EventExporter
        if config.event_exporter == "CONSOLE":
            lines = ConsoleExporter(formatter)
        else:
            lines = TextFileExporter(config.file_dir, formatter)
        # Always asynchronous (DLRover's default is not): the training thread never waits for the disk.
        _default_exporter = AsyncExporter(lines, config.queue_size)
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


def _reset() -> None:
    """Close the log and read ``DLROVER_EVENT_*`` and ``RANK`` again (tests, or a new run in the same process)."""
    close_default_exporter()
    with ErrorHandler._lock:
        if ErrorHandler._instance is not None:
            ErrorHandler._instance.unregister()
            ErrorHandler._instance = None
    with Config._instance_lock:
        Config._instance = None
    init_default_exporter()
    init_error_handler()


# -- safe calls --------------------------------------------------------------
class SafeCallable:
    """What a failed safe call returns: any call, attribute or ``with`` on it does nothing.

    So ``trainer.step(...).begin()`` or ``with trainer.step(...):`` after a failure
    inside ``step`` still runs the user's code, without events.
    """

    _instance: ClassVar[SafeCallable | None] = None

    def __new__(cls) -> SafeCallable:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __call__(self, *args: Any, **kwargs: Any) -> SafeCallable:
        return self

    def __getattr__(self, name: str) -> SafeCallable:
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __enter__(self) -> SafeCallable:
        return self

    def __exit__(self, *exc_info: Any) -> bool:
        return False  # the user's exception goes on

    def __repr__(self) -> str:
        return "SafeCallable()"


#: A method of a Process or Duration (or of your subclass) that raises is logged once and returns
#: the chaining no-op, as DLRover's safe calls do: a training event must never raise into training.
_safe = contained(SafeCallable(), "otel_training: %s raised; the event is skipped and training continues")


class _SafeCalls(type):
    """Makes every public method of the class, and of its subclasses (yours), a safe call."""

    def __new__(mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any]) -> _SafeCalls:
        for key, value in list(namespace.items()):
            if key.startswith("_"):
                continue
            if isinstance(value, (staticmethod, classmethod)):
                namespace[key] = type(value)(_safe(value.__func__))
            elif callable(value) and not isinstance(value, type):
                namespace[key] = _safe(value)
        return super().__new__(mcs, name, bases, namespace)


class _SafeAttributes:
    """A method that does not exist logs and returns a ``SafeCallable``, as in DLRover.

    Dunder names still raise ``AttributeError``: copy, pickle and ``Mock(spec=...)`` rely on it.
    """

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        log_once(f"dlrover-compat:missing:{type(self).__qualname__}.{name}",
                 "otel_training: %s has no attribute %r; the call is ignored", type(self).__name__, name,
                 exc_info=False)
        return SafeCallable()


def _as_dict(content: Any) -> dict[Any, Any]:
    if content is None:
        return {}
    try:
        return dict(content)
    except Exception:  # noqa: BLE001
        log_once("dlrover-compat:content", "otel_training: DLRover event content must be a mapping, not %s; it "
                 "is dropped", type(content).__name__, exc_info=False)
        return {}


# -- emitter, durations and processes ----------------------------------------
class EventEmitter:
    """A target's events to the exporter (DLRover's emitter); instants also become span events."""

    def __init__(self, target: str, exporter: EventExporter | None) -> None:
        self.target = target
        self.exporter = exporter
        self._spans = _SpanProcess(target)

    def instant(self, name: str, content: Mapping[str, Any] | None = None) -> None:
        content = _as_dict(content)
        if self.exporter is not None:
            self.exporter.export(Event.instant(generate_event_id(), self.target, name, content))
        self._span_event(name, content)

    def begin(self, event_id: str, name: str, content: dict[str, Any]) -> None:
        if self.exporter is not None:
            self.exporter.export(Event.begin(event_id, self.target, name, content))

    def end(self, event_id: str, name: str, content: dict[str, Any]) -> None:
        if self.exporter is not None:
            self.exporter.export(Event.end(event_id, self.target, name, content))

    @contained(default=None)
    def _span_event(self, name: str, content: Mapping[Any, Any]) -> None:
        self._spans._event(text(name), text(name), _instant_attributes(name, content))  # noqa: SLF001

    @contained(default=None)
    def _span(self, name: str, content: Mapping[Any, Any]) -> _Span | None:
        span_name, kind, renames = _SPANS.get(name, _PLAIN) if isinstance(name, str) else _PLAIN
        return kind(self._spans, span_name or text(name), None, event_name=text(name),
                    attributes=_span_attributes(content, renames, _OUTCOME)).begin()


class DurationSpan(_SafeAttributes, metaclass=_SafeCalls):
    """DLRover's Duration: a BEGIN/END pair in the log, and a span.

    ``begin()``/``end()`` (or ``with``) emit BEGIN and END once each: a second
    begin, an end before begin or after end emit nothing. ``success(**content)``
    and ``fail(error, **content)`` end it with ``success`` (and ``error``) in the
    END content; leaving a ``with`` by an exception fails it with the message and
    traceback, and the exception goes on. Subclass it to add stages
    (``custom_duration``).
    """

    def __init__(self, emitter: EventEmitter, name: str, content: Mapping[str, Any] | None = None) -> None:
        self.emitter = emitter
        self.name = name
        self.content: dict[str, Any] = _as_dict(content)
        self._is_begin = False
        self._is_end = False
        self._event_id = generate_event_id()
        self._span: _Span | None = None
        self._error: BaseException | None = None
        self._added = False  # content added since BEGIN: the span's attributes need it at END

    def begin(self) -> DurationSpan:
        """Emit BEGIN with the content so far; a Duration already begun emits nothing."""
        if self._is_begin:
            return self
        self._is_begin = True
        self.emitter.begin(self._event_id, self.name, dict(self.content))
        span = getattr(self.emitter, "_span", None)
        if span is not None:
            self._span = span(self.name, self.content)
            self._added = False
        return self

    def end(self) -> None:
        """Emit END with the content; before begin or after end nothing is emitted."""
        if self._is_end or not self._is_begin:
            return
        self._is_end = True
        self.emitter.end(self._event_id, self.name, dict(self.content))
        self._end_span()

    @contained(default=None)
    def _end_span(self) -> None:
        span, self._span = self._span, None
        if span is None:
            return
        if self._added:
            renames = _SPANS.get(self.name, _PLAIN)[2] if isinstance(self.name, str) else {}
            span.span.set_attributes(_span_attributes(self.content, renames, _OUTCOME))
        outcome = self.content.get("success")
        if outcome is True:
            span.success()
        elif outcome is False:
            span.fail(self._error if self._error is not None else self.content.get("error"))
        else:
            span.end()

    def stage(self, stage: str, content: Mapping[str, Any] | None = None) -> DurationSpan:
        """A Duration ``<name>#<stage>`` with this one's content plus ``content``; only while this one is open."""
        if self._is_end or not self._is_begin:
            log_once(f"dlrover-compat:stage:{text(self.name)}", "otel_training: a stage of %s, which is not open, "
                     "is ignored", text(self.name), exc_info=False)
            return SafeCallable()  # type: ignore[return-value]
        merged = dict(self.content)
        merged.update(_as_dict(content))
        return DurationSpan(self.emitter, f"{self.name}#{stage}", merged)

    def extra_args(self, **kwargs: Any) -> DurationSpan:
        """Add content for the next BEGIN or END; refused after the end."""
        return self.extra_dict(kwargs)

    def extra_dict(self, content: Mapping[str, Any]) -> DurationSpan:
        """Add content (a dict) for the next BEGIN or END; refused after the end."""
        if self._is_end:
            log_once(f"dlrover-compat:extra:{text(self.name)}", "otel_training: content added to the ended %s "
                     "is ignored", text(self.name), exc_info=False)
            return self
        self.content.update(_as_dict(content))
        self._added = True
        return self

    def success(self, **kwargs: Any) -> None:
        """End with ``"success": true`` and ``kwargs`` in the END content (span status OK)."""
        self.content["success"] = True
        if kwargs:
            self.content.update(kwargs)
            self._added = True
        self.end()

    def fail(self, error: str, **kwargs: Any) -> None:
        """End with ``"success": false, "error": error`` in the END content (span status ERROR)."""
        self.content["success"] = False
        self.content["error"] = error
        if kwargs:
            self.content.update(kwargs)
            self._added = True
        self.end()

    def __enter__(self) -> DurationSpan:
        return self.begin()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        try:
            if exc_type is None:
                self.success()
            else:
                self._error = exc
                message = text(exc)
                if tb is not None:
                    message += "\n" + "".join(traceback.format_tb(tb))
                self.fail(message)
        except Exception:  # noqa: BLE001 - never replace the user's exception, nor raise one
            log_once("dlrover-compat:exit", "otel_training: could not end a DLRover Duration")
        return False

    def __repr__(self) -> str:
        state = "ended" if self._is_end else "open" if self._is_begin else "new"
        return f"<DurationSpan {self.name!r} {state}>"


#: DLRover calls its Duration ``DurationSpan``; otel-training users know it as ``Duration``.
Duration = DurationSpan


class Process(_SafeAttributes, metaclass=_SafeCalls):
    """A target's events: ``instant``, ``duration``, ``custom_duration`` (subclass it for your own events)."""

    def __init__(self, target: str, exporter: EventExporter | None = None) -> None:
        if exporter is None:
            exporter = get_default_exporter()
        self._emitter = EventEmitter(target, exporter)

    @property
    def target(self) -> str:
        return self._emitter.target

    def instant(self, name: str, content: Mapping[str, Any] | None = None) -> None:
        """An INSTANT line, written now, and an event on the current span."""
        self._emitter.instant(name, content)

    def duration(self, name: str, content: Mapping[str, Any] | None = None) -> DurationSpan:
        return DurationSpan(self._emitter, name, content)

    def custom_duration(self, clzz: type[D], name: str, content: Mapping[str, Any] | None = None) -> D:
        """A Duration of your ``DurationSpan`` subclass (methods for the stages of your event)."""
        return clzz(self._emitter, name, content)

    def error(self, msg: str) -> None:
        """Logged (not an event, as in DLRover), and an error event on the current span."""
        logger.error(msg)
        self._emitter._spans.error(msg)  # noqa: SLF001

    def info(self, msg: str) -> None:
        logger.info(msg)
        self._emitter._spans.info(msg)  # noqa: SLF001


class CommonPredefined(Process):
    def warning(self, warning_type: str, msg: str, **kwargs: Any) -> None:
        """A ``#warning`` instant, for the user to see."""
        self.instant(CommonEventName.WARNING, {"warning_type": warning_type, "msg": msg, **kwargs})


class TrainInitSpan(DurationSpan):
    """``#init``, with its two predefined stages (``#init##load_ckpt``, ``#init##load_dataset``)."""

    def load_ckpt(self) -> DurationSpan:
        return self.stage(TrainerEventName.TRAIN_LOAD_CKPT.value)

    def load_dataset(self) -> DurationSpan:
        return self.stage(TrainerEventName.TRAIN_LOAD_DATASET.value)


class TrainerProcess(CommonPredefined):
    """A training process's events (DLRover's master reads targets ``AtorchTrainerV2`` and ``AsyncSaver``)."""

    def __init__(self, target: str) -> None:
        super().__init__(target)

    def start(self, params: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.instant(TrainerEventName.TRAIN_START.value, {"params": params or {}, **kwargs})

    def init(self, **kwargs: Any) -> TrainInitSpan:
        return self.custom_duration(TrainInitSpan, TrainerEventName.TRAIN_INIT.value, kwargs)

    def init_end(self, **kwargs: Any) -> None:
        self.instant(TrainerEventName.TRAIN_INIT_END.value, kwargs)

    def train(self, **kwargs: Any) -> DurationSpan:
        return self.duration(TrainerEventName.TRAIN.value, kwargs)

    def epoch(self, **kwargs: Any) -> DurationSpan:
        return self.duration(TrainerEventName.EPOCH.value, kwargs)

    def step(self, global_step: int, **kwargs: Any) -> DurationSpan:
        return self.duration(TrainerEventName.TRAIN_STEP.value, {"global_step": global_step, **kwargs})

    def substep(self, global_step: int, **kwargs: Any) -> None:
        self.instant(TrainerEventName.TRAIN_SUBSTEP.value, {"global_step": global_step, **kwargs})

    def evaluate(self, global_step: int, **kwargs: Any) -> DurationSpan:
        return self.duration(TrainerEventName.EVALUATE.value, {"global_step": global_step, **kwargs})

    def predict(self, global_step: int, **kwargs: Any) -> DurationSpan:
        return self.duration(TrainerEventName.PREDICT.value, {"global_step": global_step, **kwargs})

    def predict_step(self, global_step: int, **kwargs: Any) -> None:
        self.instant(TrainerEventName.PREDICT_STEP.value, {"global_step": global_step, **kwargs})

    def save(self, global_step: int, **kwargs: Any) -> DurationSpan:
        return self.duration(TrainerEventName.SAVE.value, {"global_step": global_step, **kwargs})

    def persist_ckpt(self, global_step: int, path: str = "", size: int | None = None, **kwargs: Any
                     ) -> DurationSpan:
        """The asynchronous write of a checkpoint (often from another thread)."""
        return self.duration(TrainerEventName.TRAIN_PERSIST_CKPT.value,
                             {"global_step": global_step, "path": path, "size": size or 0, **kwargs})

    def log(self, global_step: int, logs: dict[str, Any], **kwargs: Any) -> None:
        self.instant(TrainerEventName.LOG.value, {"global_step": global_step, "logs": logs, **kwargs})

    def finish(self, **kwargs: Any) -> None:
        self.instant(TrainerEventName.TRAIN_FINISH.value, kwargs)


_singleton_lock = threading.Lock()


class DLRoverCommonEvent(CommonPredefined):
    """Events of DLRover's agent and master; one per process through ``singleton_instance()``."""

    @classmethod
    def singleton_instance(cls) -> Any:
        with _singleton_lock:
            instance = cls.__dict__.get("_singleton")
            if instance is None:
                instance = cls()
                cls._singleton = instance
            return instance


class DLRoverMasterEvent(DLRoverCommonEvent):
    """The job master's events (target ``dlrover-master``)."""

    def __init__(self) -> None:
        super().__init__("dlrover-master")

    def start(self, args: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.instant(DLRoverMasterEventName.DLROVER_MASTER_START.value, {"params": args or {}, **kwargs})

    def exit(self, exit_code: int, **kwargs: Any) -> None:
        self.instant(DLRoverMasterEventName.DLROVER_MASTER_EXIT.value, {"exit_code": exit_code, **kwargs})

    def node_join(self, node_id: str, node_rank: str, node_ip: str, rdzv_round: str, **kwargs: Any) -> None:
        self.instant(DLRoverMasterEventName.DLROVER_NODE_JOIN.value,
                     {"node_id": node_id, "node_rank": node_rank, "node_ip": node_ip, "rdzv_round": rdzv_round,
                      **kwargs})

    def rendezvous(self, rendezvous_type: str, round_num: int, timeout_sec: int, max_nodes: int, min_nodes: int,
                   **kwargs: Any) -> DurationSpan:
        """From the first node joining to the last."""
        return self.duration(DLRoverCommonEventName.DLROVER_RENDEZVOUS.value,
                             {"rendezvous_type": rendezvous_type, "round_num": round_num,
                              "timeout_sec": timeout_sec, "max_nodes": max_nodes, "min_nodes": min_nodes, **kwargs})

    def network_check(self, round: int, **kwargs: Any) -> DurationSpan:  # noqa: A002 - DLRover's name
        return self.duration(DLRoverCommonEventName.DLROVER_NETWORK_CHECK.value, {"round": round, **kwargs})

    def worker_event(self, pod_name: str, from_state: str, to_state: str, reason: str, **kwargs: Any) -> None:
        self.instant(DLRoverMasterEventName.DLROVER_WORKER_EVENT.value,
                     {"pod_name": pod_name, "from_state": from_state, "to_state": to_state, "exit_reason": reason,
                      **kwargs})

    def worker_relaunch(self, pod_name: str, relaunch_pod_name: str, **kwargs: Any) -> None:
        self.instant(DLRoverMasterEventName.DLROVER_WORKER_RELAUNCH.value,
                     {"pod_name": pod_name, "relaunch_pod_name": relaunch_pod_name, **kwargs})

    def worker_create(self, pod_name: str, success: bool, **kwargs: Any) -> None:
        self.instant(DLRoverMasterEventName.DLROVER_WORKER_CREATE.value,
                     {"pod_name": pod_name, "ok": success, **kwargs})

    def worker_no_heartbeat(self, pod_name: str, timeout: int, **kwargs: Any) -> None:
        self.instant(DLRoverMasterEventName.DLROVER_WORKER_NO_HEARTBEAT.value,
                     {"pod_name": pod_name, "timeout": timeout, **kwargs})

    def fault_detect(self, reason: str, **kwargs: Any) -> None:
        self.instant(DLRoverCommonEventName.DLROVER_FAULT_DETECT.value, {"reason": reason, **kwargs})

    def train_job(self, job_name: str, args: dict[str, Any] | None = None, **kwargs: Any) -> DurationSpan:
        return self.duration(DLRoverMasterEventName.DLROVER_JOB_TRAIN.value,
                             {"job_name": job_name, "params": args, **kwargs})

    def process_restart(self, pod_name: str, **kwargs: Any) -> None:
        self.instant(DLRoverCommonEventName.DLROVER_PROCESS_RESTART.value, {"pod_name": pod_name, **kwargs})


class DLRoverAgentEvent(DLRoverCommonEvent):
    """The elastic agent's events (target ``dlrover-agent``)."""

    def __init__(self) -> None:
        super().__init__("dlrover-agent")

    def start(self, args: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.instant(DLRoverAgentEventName.DLROVER_AGENT_START.value, {"params": args or {}, **kwargs})

    def exit(self, success: bool, **kwargs: Any) -> None:
        self.instant(DLRoverAgentEventName.DLROVER_AGENT_EXIT.value, {"success": success, **kwargs})

    def rendezvous(self, rendezvous_type: str, node_name: str, node_rank: int, timeout: int, **kwargs: Any
                   ) -> DurationSpan:
        return self.duration(DLRoverCommonEventName.DLROVER_RENDEZVOUS.value,
                             {"rendezvous_type": rendezvous_type, "node_name": node_name, "node_rank": node_rank,
                              "timeout": timeout, **kwargs})

    def network_check(self, round: int, node_rank: int, **kwargs: Any) -> DurationSpan:  # noqa: A002
        return self.duration(DLRoverCommonEventName.DLROVER_NETWORK_CHECK.value,
                             {"round": round, "node_rank": node_rank, **kwargs})

    def process_succeeded(self, node_rank: int, **kwargs: Any) -> None:
        self.instant(DLRoverCommonEventName.DLROVER_PROCESS_SUCCEEDED.value, {"node_rank": node_rank, **kwargs})

    def process_restart(self, node_rank: int, **kwargs: Any) -> None:
        self.instant(DLRoverCommonEventName.DLROVER_PROCESS_RESTART.value, {"node_rank": node_rank, **kwargs})

    def process_fail(self, node_rank: int, **kwargs: Any) -> None:
        self.instant(DLRoverCommonEventName.DLROVER_PROCESS_FAIL.value, {"node_rank": node_rank, **kwargs})

    def process_restart_membership(self, node_rank: int, **kwargs: Any) -> None:
        self.instant(DLRoverCommonEventName.DLROVER_PROCESS_RESTART_MEMBERSHIP.value,
                     {"node_rank": node_rank, **kwargs})

    def job_abortion(self, node_rank: int, reason: str, **kwargs: Any) -> None:
        self.instant(DLRoverCommonEventName.DLROVER_JOB_ABORTION.value,
                     {"caused_node_rank": node_rank, "reason": reason, **kwargs})

    def job_restart(self, node_rank: int, reason: str, **kwargs: Any) -> None:
        self.instant(DLRoverCommonEventName.DLROVER_JOB_RESTART.value,
                     {"caused_node_rank": node_rank, "reason": reason, **kwargs})


# -- uncaught exceptions and termination signals in the log ------------------
#: The signals DLRover hooks, less the synchronous faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL: a Python handler
#: never runs, the faulting instruction repeats) and SIGPIPE (Python ignores it, so a closed pipe is an error).
_EXIT_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGABRT", "SIGHUP", "SIGQUIT")
                      if hasattr(signal, name))


def _flush_default_exporter(timeout_s: float) -> None:
    """The process is about to die: the line must reach the file first (DLRover writes it synchronously)."""
    exporter = get_default_exporter()
    if isinstance(exporter, AsyncExporter):
        exporter.force_flush(timeout_s)


class ErrorHandler:
    """With ``DLROVER_EVENT_HOOK_ERROR``: an ``exception`` instant for an uncaught exception and an ``exit_sig``
    instant for a termination signal, in DLRover's log, before the previous hook or handler runs.

    otel-training's own hooks (``exception_hooks``, ``signal_hooks``) record the same on the spans; each
    chains to the other, whichever was installed first.
    """

    _instance: ClassVar[ErrorHandler | None] = None
    _lock: ClassVar[threading.RLock] = threading.RLock()

    def __init__(self) -> None:
        self._original_excepthook: Callable[..., Any] | None = None
        self._original_handlers: dict[int, Any] = {}
        self._process: Process = Process("ErrorReporter")
        self._registered = False

    @classmethod
    def singleton_instance(cls) -> ErrorHandler:
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def _handle_exception(self, exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        try:
            if tb is not None:
                self._process.instant("exception", {"stack": traceback.format_exception(exc_type, exc, tb),
                                                    "pid": os.getpid()})
                _flush_default_exporter(1.0)
        except Exception:  # noqa: BLE001
            log_once("dlrover-compat:exception-hook", "otel_training: could not log an uncaught exception")
        if self._original_excepthook is not None:
            self._original_excepthook(exc_type, exc, tb)

    def _handle_signal(self, signum: int, frame: Any) -> None:
        try:
            content: dict[str, Any] = {"sig": signum, "sig_name": signal.Signals(signum).name, "pid": os.getpid()}
            try:
                if frame:
                    content["stack"] = traceback.format_list(traceback.extract_stack(frame))
            except Exception as error:  # noqa: BLE001
                content["stack"] = f"get stack failed: {text(error)}"
            self._process.instant("exit_sig", content)
            _flush_default_exporter(1.0)
        except Exception:  # noqa: BLE001
            log_once("dlrover-compat:signal-hook", "otel_training: could not log a signal")
        finally:
            self._call_original_handler(signum, frame)

    def _call_original_handler(self, signum: int, frame: Any) -> None:
        original = self._original_handlers.get(signum, signal.SIG_DFL)
        if callable(original):
            original(signum, frame)
        elif original == signal.SIG_IGN:
            return
        else:  # the default action: die of the signal, as without the hook
            if self._registered:
                self.unregister()
            os.kill(os.getpid(), signum)

    def register(self) -> None:
        """Hook ``sys.excepthook`` and the termination signals (from the main thread)."""
        with self._lock:
            if self._registered:
                return
            self._original_excepthook = sys.excepthook
            sys.excepthook = self._handle_exception
            for signum in _EXIT_SIGNALS:
                self._original_handlers[signum] = signal.getsignal(signum)
                signal.signal(signum, self._handle_signal)
            self._registered = True

    def unregister(self) -> None:
        with self._lock:
            if not self._registered:
                return
            if self._original_excepthook is not None:
                sys.excepthook = self._original_excepthook
                self._original_excepthook = None
            for signum, handler in self._original_handlers.items():
                signal.signal(signum, handler)
            self._original_handlers.clear()
            self._registered = False


@contained(default=None)
def init_error_handler() -> None:
    """Register the ``ErrorHandler`` when ``DLROVER_EVENT_HOOK_ERROR`` says so (at import, as DLRover does)."""
    config = Config.singleton_instance()
    if config.enable and config.hook_error:
        ErrorHandler.singleton_instance().register()


# As DLRover does when its package is imported: the exporter exists (no file, no thread until the first
# event), and the error handler is registered if asked for.
init_default_exporter()
init_error_handler()
