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
work on DLRover-instrumented code unchanged. ``emitter._SPANS`` and
``events.attributes.ALIASES`` are the one place where DLRover's names and
keys meet ours; the log never sees our names.

As in DLRover, every public method of these classes and of subclasses of them
is a safe call: an exception inside is logged and the call returns an inert
``SafeCallable``, which accepts any further call, attribute or ``with``, so
instrumentation never breaks training. Unlike DLRover, the training thread
never waits for the disk: lines are formatted when the event happens and
written by a background thread behind a bounded queue (lines past it are
dropped and counted). docs/compat.md lists every difference and its reason.

The package is this one import path; its modules follow DLRover's own
(``names``, ``event``, ``config``, ``exporter``, ``emitter``, ``predefined``,
``error_handler``), and everything public is re-exported here.
"""

from __future__ import annotations

from otel_training.compat.dlrover._safe import SafeCallable
from otel_training.compat.dlrover.config import Config
from otel_training.compat.dlrover.emitter import Duration, DurationSpan, EventEmitter, Process
from otel_training.compat.dlrover.error_handler import ErrorHandler, init_error_handler
from otel_training.compat.dlrover.event import Event, JsonFormatter, LogFormatter, generate_event_id
from otel_training.compat.dlrover.exporter import (
    AsyncExporter,
    ConsoleExporter,
    EventExporter,
    TextFileExporter,
    close_default_exporter,
    get_default_exporter,
    init_default_exporter,
)
from otel_training.compat.dlrover.names import (
    CommonEventName,
    DLRoverAgentEventName,
    DLRoverCommonEventName,
    DLRoverMasterEventName,
    EventTargetName,
    EventType,
    EventTypeName,
    TrainerEventName,
    WarningType,
)
from otel_training.compat.dlrover.predefined import (
    CommonPredefined,
    DLRoverAgentEvent,
    DLRoverCommonEvent,
    DLRoverMasterEvent,
    TrainerProcess,
    TrainInitSpan,
)

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
    "ErrorHandler",
    "Event",
    "EventEmitter",
    "EventExporter",
    "EventTargetName",
    "EventType",
    "EventTypeName",
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


def _reset() -> None:
    """Close the log and read ``DLROVER_EVENT_*`` and ``RANK`` again (tests, or a new run in the same process)."""
    close_default_exporter()
    with ErrorHandler._lock:  # noqa: SLF001 - ErrorHandler's singleton lock (DLRover's singleton_instance), held to reset it
        if ErrorHandler._instance is not None:  # noqa: SLF001 - ErrorHandler's singleton, reset for a new run
            ErrorHandler._instance.unregister()  # noqa: SLF001 - the same singleton: its hooks come off before it is dropped
            ErrorHandler._instance = None  # noqa: SLF001 - the same singleton, dropped: singleton_instance() makes a new one
    with Config._instance_lock:  # noqa: SLF001 - Config's singleton lock (DLRover's singleton_instance), held to reset it
        Config._instance = None  # noqa: SLF001 - Config's singleton, dropped: DLROVER_EVENT_* are read again on next use
    init_default_exporter()
    init_error_handler()


# As DLRover does when its package is imported: the exporter exists (no file, no thread until the first
# event), and the error handler is registered if asked for.
init_default_exporter()
init_error_handler()
