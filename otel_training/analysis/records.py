"""The span record both the live processor and the offline report analyse.

Live spans (SDK ``ReadableSpan``), OTLP JSON lines and Jaeger's query API all
describe the same thing with different types; turning each into this one flat
record is what lets a single implementation of goodput, step-time deviation
and straggler scoring serve the running job and the post-mortem report alike.
"""

from __future__ import annotations

import calendar
import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from otel_training import semconv as sc


@dataclasses.dataclass(frozen=True, slots=True)
class RunKey:
    """One life of one rank: a restart of the job gives every rank a new RunKey."""

    job_id: str
    rank: int
    restart: int
    run_id: str
    #: The process (``service.instance.id``, new in every process): two lives that a launcher gave
    #: the same run id (a pod re-created with restart count 0) are still two lives.
    instance: str = ""
    #: When the process was created (``process.creation.time``), 0 if unknown: the life's time starts
    #: there even if it was killed before it ended any span of its start-up.
    created_ns: int = 0

    @classmethod
    def from_resource(cls, resource: Mapping[str, Any]) -> RunKey:
        instance = str(resource.get(sc.SERVICE_INSTANCE_ID) or "")
        return cls(
            job_id=str(resource.get(sc.TRAINING_JOB_ID, "")),
            rank=_int(resource.get(sc.TRAINING_RANK), 0),
            restart=_int(resource.get(sc.TRAINING_RESTART_COUNT), 0),
            run_id=str(resource.get(sc.TRAINING_RUN_ID) or instance),
            instance=instance,
            created_ns=creation_time_ns(resource) or 0,
        )


@dataclasses.dataclass(slots=True)
class SpanRecord:
    """A finished span, as much of it as the analyses and the report need."""

    name: str
    start_ns: int
    end_ns: int
    run: RunKey
    attributes: dict[str, Any] = dataclasses.field(default_factory=dict)
    trace_id: str = ""
    span_id: str = ""
    parent_id: str = ""
    error: bool = False
    service: str = ""
    role: str = sc.ROLE_TRAINER
    thread: int = 0

    @property
    def duration_s(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e9

    @property
    def is_trainer(self) -> bool:
        return self.role == sc.ROLE_TRAINER


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def iso_ns(ns: int) -> str:
    """UTC ISO 8601 with nanoseconds: ``2026-11-23T10:55:11.123456789Z``."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{fraction:09d}Z"


def creation_time_ns(resource: Mapping[str, Any]) -> int | None:
    """``process.creation.time`` of a resource as wall-clock ns, or None (absent or not ISO 8601)."""
    value = resource.get(sc.PROCESS_CREATION_TIME)
    if not isinstance(value, str):
        return None
    try:
        whole, _, fraction = value.rstrip("Z").partition(".")
        seconds = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S"))
        digits = (fraction + "000000000")[:9] if fraction.isdigit() else "0"
        return seconds * 1_000_000_000 + int(digits)
    except (ValueError, OverflowError):
        return None
