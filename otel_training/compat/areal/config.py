"""AReaL's names and settings: scope categories, session events, the two config dataclasses.

Every other module of the shim reads settings through ``_setting`` (AReaL's own
dataclass, an OmegaConf node, a mapping or any object with the fields) and
folds categories through ``_category``, so both rules live here once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

STATUSES = ("accepted", "rejected", "failed", "dropped")
#: The event target of every span and span event this shim makes.
_TARGET = "PerfTracer"


class PerfTraceCategory(str, Enum):
    """AReaL's scope categories: the Chrome-trace ``cat`` and the span's ``perf.category``."""

    COMPUTE = "compute"
    COMM = "comm"
    IO = "io"
    SYNC = "sync"
    SCHEDULER = "scheduler"
    INSTR = "instr"
    MISC = "misc"


Category = PerfTraceCategory
CategoryLike = PerfTraceCategory | str | None

_ALIASES = {"communication": "comm", "synchronization": "sync", "scheduling": "scheduler",
            "instrumentation": "instr"}


def _category(category: CategoryLike) -> str:
    """AReaL keeps an unknown category as given (``session.sess-0``) and folds the long names."""
    if isinstance(category, PerfTraceCategory):
        return category.value
    if isinstance(category, str) and category.strip():
        low = category.strip().lower()
        if low in _ALIASES:
            return _ALIASES[low]
        return low if low in PerfTraceCategory._value2member_map_ else category
    return PerfTraceCategory.MISC.value


class SessionTraceEvent(str, Enum):
    """The lifecycle events of a session record (``SessionTracer.record_event``)."""

    FINALIZED = "finalized"
    GENERATE_START = "generate_start"
    GENERATE_END = "generate_end"
    REWARD_START = "reward_start"
    REWARD_END = "reward_end"
    TOOLCALL_START = "toolcall_start"
    TOOLCALL_END = "toolcall_end"


# -- configuration -------------------------------------------------------------


@dataclass
class SessionTracerConfig:
    """AReaL's ``SessionTracerConfig``, for programs that do not import AReaL's own."""

    enabled: bool = False
    flush_threshold: int = 256


@dataclass
class PerfTracerConfig:
    """AReaL's ``PerfTracerConfig``; ``configure`` accepts AReaL's own (or any object with these fields)."""

    experiment_name: str = "default"
    trial_name: str = "default"
    fileroot: str = "/tmp/areal"
    enabled: bool = False
    save_interval: int = 1
    profile_steps: list[int] | None = None
    session_tracer: SessionTracerConfig | None = None


def _setting(config: Any, name: str, default: Any) -> Any:
    if isinstance(config, Mapping):
        return config.get(name, default)
    return getattr(config, name, default)


def _at_least_one(value: Any) -> int:
    try:
        return max(int(value), 1)
    except (TypeError, ValueError):
        return 1
