"""otel-training: ML training, elastic-agent and master events as OpenTelemetry spans.

Start with ``configure()`` (or nothing: events configure the embedded default on
first use), then emit events through ``TrainerProcess`` and friends.
"""

from otel_training._version import __version__
from otel_training.config.options import ConfigError
from otel_training.config.telemetry import FlushResult, Telemetry, configure, get_telemetry
from otel_training.events.duration import Duration, current_duration
from otel_training.events.lineage import set_lineage
from otel_training.events.predefined import AgentProcess, MasterProcess, TrainerProcess
from otel_training.events.process import Process
from otel_training.processors.dlrover_log import DLRoverLogProcessor
from otel_training.processors.goodput import GoodputSpanProcessor
from otel_training.processors.stuck import StuckEvent, StuckSpanProcessor
from otel_training.processors.thresholds import AdaptiveSettings

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
    "StuckSpanProcessor",
    "Telemetry",
    "TrainerProcess",
    "__version__",
    "configure",
    "current_duration",
    "get_telemetry",
    "set_lineage",
]
