"""The ``rollout.task`` -> ``rollout.session`` -> ``rollout.phase`` span tree of finished sessions.

Recorded after the fact (``record_span``) from the session records' own
timestamps, so a session's span and its line in ``sessions-r<rank>.jsonl``
agree and no span is left open across the rollout. Kept apart from the records
so the bookkeeping (``sessions``) holds no span code.
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext

from otel_training import semconv as sc
from otel_training._contain import contain
from otel_training._text import text
from otel_training.compat.areal.config import _TARGET
from otel_training.events.attributes import to_attributes
from otel_training.events.past_spans import record_span


class _TaskSpans:
    """A task's sessions waiting for their span tree, emitted when the last one is over.

    The tree is recorded after the fact (``record_span``) from the records' own
    timestamps, so a session's span and its line in ``sessions-r<rank>.jsonl``
    agree, and no span is left open across the rollout.
    """

    __slots__ = ("task_id", "start_ns", "parent", "open", "done")

    def __init__(self, task_id: int) -> None:
        self.task_id = task_id
        self.start_ns = time.time_ns()
        span = trace_api.get_current_span()
        self.parent: SpanContext | None = span.get_span_context() if span.is_recording() else None
        self.open = 0
        self.done: list[tuple[dict[str, Any], dict[str, list[tuple[float, float | None, dict[str, Any]]]],
                              dict[str, int], float]] = []


def _emit_task(task: _TaskSpans) -> None:
    # The records are written regardless; only their spans are lost.
    with contain("areal.emit_task", "otel_training: internal error emitting a rollout task's spans; "
                 "training continues"):
        parent = NonRecordingSpan(task.parent) if task.parent is not None else None
        end_ns = max(int(end * 1e9) for *_, end in task.done)
        start_ns = min([task.start_ns] + [int(d[0]["submit_ts"] * 1e9) for d in task.done])
        task_span = record_span(sc.SPAN_ROLLOUT_TASK, "#task", start_ns, end_ns,
                                {sc.ROLLOUT_TASK_ID: task.task_id, sc.ROLLOUT_TASK_SESSIONS: len(task.done)},
                                parent=parent or trace_api.INVALID_SPAN, target=_TARGET)
        for data, phases, counters, end in task.done:
            _emit_session(task_span, data, phases, counters, end)


def _emit_session(parent: Span, data: dict[str, Any], phases: dict[str, list[tuple[float, float | None,
                  dict[str, Any]]]], counters: dict[str, int], end: float) -> None:
    ids = {sc.ROLLOUT_TASK_ID: data["task_id"], sc.ROLLOUT_SESSION_ID: data["session_id"]}
    attributes = dict(ids)
    attributes[sc.ROLLOUT_SESSION_STATUS] = data["status"]
    if data.get("reason") is not None:
        attributes[sc.ROLLOUT_SESSION_REASON] = text(data["reason"])[:1024]
    if "total_s" in data:
        attributes[sc.ROLLOUT_SESSION_TOTAL_S] = data["total_s"]
    for phase in phases:
        if f"{phase}_s" in data:
            attributes[sc.ROLLOUT_SESSION_PHASE_S_PREFIX + phase] = data[f"{phase}_s"]
    attributes.update(to_attributes(counters))
    error = None
    if data["status"] == "failed":
        error = text(data.get("reason") or "failed")
    session_span = record_span(sc.SPAN_ROLLOUT_SESSION, "#session", int(data["submit_ts"] * 1e9), int(end * 1e9),
                               attributes, parent=parent, target=_TARGET, error=error)
    for phase, executions in phases.items():
        for start, stop, payload in executions:
            phase_attributes = {sc.ROLLOUT_PHASE_NAME: phase, **ids, **payload}
            record_span(sc.SPAN_ROLLOUT_PHASE, phase, int(start * 1e9), int((end if stop is None else stop) * 1e9),
                        phase_attributes, parent=session_span, target=_TARGET)
