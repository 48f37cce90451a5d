"""otel-training: ML training, elastic-agent and master events as OpenTelemetry spans.

Start with ``configure()`` (or nothing: events configure the embedded default on
first use), then emit events through ``TrainerProcess`` and friends.

The public names are loaded on first use (PEP 562), so that importing a light
part of the package (``otel_training.semconv``, ``otel_training.analysis``, the
watchdog sidecar, the report) does not load the pipeline and the SDK's tracing
with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from otel_training._version import __version__

if TYPE_CHECKING:
    from otel_training.assembly.configure import configure, get_telemetry
    from otel_training.config.parsers import ConfigError
    from otel_training.events.duration import Duration, current_duration
    from otel_training.events.lineage import set_lineage
    from otel_training.events.predefined import AgentProcess, MasterProcess, TrainerProcess
    from otel_training.events.process import Process
    from otel_training.pipeline.deadlines import FlushResult
    from otel_training.pipeline.telemetry import Telemetry
    from otel_training.processors.dlrover_log import DLRoverLogProcessor
    from otel_training.processors.goodput import GoodputSpanProcessor
    from otel_training.processors.stuck import StuckEvent, StuckSpanProcessor
    from otel_training.processors.stuck_options import StuckOptions
    from otel_training.processors.thresholds import AdaptiveSettings

#: Public name -> the module that defines it.
_EXPORTS = {
    "AdaptiveSettings": "otel_training.processors.thresholds",
    "AgentProcess": "otel_training.events.predefined",
    "ConfigError": "otel_training.config.options",
    "DLRoverLogProcessor": "otel_training.processors.dlrover_log",
    "Duration": "otel_training.events.duration",
    "FlushResult": "otel_training.pipeline.deadlines",
    "GoodputSpanProcessor": "otel_training.processors.goodput",
    "MasterProcess": "otel_training.events.predefined",
    "Process": "otel_training.events.process",
    "StuckEvent": "otel_training.processors.stuck",
    "StuckOptions": "otel_training.processors.stuck_options",
    "StuckSpanProcessor": "otel_training.processors.stuck",
    "Telemetry": "otel_training.pipeline.telemetry",
    "TrainerProcess": "otel_training.events.predefined",
    "configure": "otel_training.assembly.configure",
    "current_duration": "otel_training.events.duration",
    "get_telemetry": "otel_training.assembly.configure",
    "set_lineage": "otel_training.events.lineage",
}

#: The same names as ``_EXPORTS`` and the version, written out so that linters and type checkers read them
#: (tests/test_public_api.py checks the two agree).
__all__ = [
    "AdaptiveSettings",
    "AgentProcess",
    "ConfigError",
    "DLRoverLogProcessor",
    "Duration",
    "FlushResult",
    "GoodputSpanProcessor",
    "MasterProcess",
    "Process",
    "StuckEvent",
    "StuckOptions",
    "StuckSpanProcessor",
    "Telemetry",
    "TrainerProcess",
    "__version__",
    "configure",
    "current_duration",
    "get_telemetry",
    "set_lineage",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups are plain module attributes
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
