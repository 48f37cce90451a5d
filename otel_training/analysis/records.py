"""The span record both the live processor and the offline report analyse.

Live spans (SDK ``ReadableSpan``), OTLP JSON lines and Jaeger's query API all
describe the same thing with different types; turning each into this one flat
record is what lets a single implementation of goodput, step-time deviation
and straggler scoring serve the running job and the post-mortem report alike.
"""

from __future__ import annotations

import dataclasses
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

    @classmethod
    def from_resource(cls, resource: Mapping[str, Any]) -> RunKey:
        return cls(
            job_id=str(resource.get(sc.TRAINING_JOB_ID, "")),
            rank=_int(resource.get(sc.TRAINING_RANK), 0),
            restart=_int(resource.get(sc.TRAINING_RESTART_COUNT), 0),
            # Without a run id, the process instance tells two lives apart.
            run_id=str(resource.get(sc.TRAINING_RUN_ID) or resource.get(sc.SERVICE_INSTANCE_ID) or ""),
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
