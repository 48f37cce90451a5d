"""A crafted two-rank, two-run training job whose goodput was worked out by hand.

Times are seconds after T0. Rank 0 (steps of 2 s) and rank 1 (steps of 4 s: the
straggler) both fail at 70 s; both restart at 80 s and finish. The expected
figures below are the hand computation documented next to each span.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from otel_training import semconv as sc
from otel_training.analysis import RunKey, SpanRecord
from otel_training.report.reader import otlp_attributes

T0 = 1_700_000_000 * 10**9
JOB = "job-1"


def _s(seconds: float) -> int:
    return T0 + int(round(seconds * 1e9))


def _spans() -> list[dict[str, Any]]:
    spans: list[dict[str, Any]] = []
    counter = iter(range(1, 10**6))

    def add(rank: int, restart: int, name: str, start: float, end: float, error: bool = False, **attributes: Any):
        span = {"rank": rank, "restart": restart, "name": name, "start": start, "end": end, "error": error,
                "attributes": attributes, "span_id": format(next(counter), "016x")}
        spans.append(span)
        return span

    def steps(rank: int, restart: int, first: float, count: int, length: float, step0: int) -> None:
        for index in range(count):
            add(rank, restart, sc.SPAN_STEP, first + index * length, first + (index + 1) * length,
                **{sc.STEP: step0 + index, sc.SAMPLES: 8, sc.TOKENS: 1024})

    # Rank 0, run 0 (fails at 70): init 5, training_prep 5, program_startup 2 (10-12),
    # data_loading 1 (inside the first step), productive 23 (12-36 minus 1), evaluation 4,
    # checkpoint_save 2, then 15 s of progress after the checkpoint (42-50, 50-53, 60-64)
    # lost as wasted_progress, stuck 7 (53-60), host_outside_steps 6 (64-70: after the last step, and
    # no training.train ended). Sum 70.
    add(0, 0, sc.SPAN_PROCESS, 0, 70, error=True)
    add(0, 0, sc.SPAN_INIT, 0, 5)
    add(0, 0, sc.SPAN_LOAD_DATASET, 5, 10)
    steps(0, 0, 12, 12, 2.0, 0)
    add(0, 0, sc.SPAN_DATA_WAIT, 12, 13)
    add(0, 0, sc.SPAN_EVALUATE, 36, 40)
    add(0, 0, sc.SPAN_SAVE_CHECKPOINT, 40, 42, **{sc.CHECKPOINT_STEP: 12})
    steps(0, 0, 42, 4, 2.0, 12)
    stuck = add(0, 0, sc.SPAN_STEP, 50, 60, **{sc.STEP: 16})
    add(0, 0, sc.SPAN_ALERT, 55, 55, **{
        sc.ALERT_KIND: sc.ALERT_KIND_STUCK, sc.ALERT_ELAPSED_S: 5.0, sc.ALERT_THRESHOLD_S: 3.0,
        sc.ALERT_SPAN_NAME: sc.SPAN_STEP, sc.ALERT_SPAN_ID: stuck["span_id"],
        sc.ALERT_STACKS: "Thread 0x1 (most recent call first):\n  File \"train.py\", line 42 in all_reduce"})
    add(0, 0, sc.SPAN_ALERT, 60, 60, **{sc.ALERT_KIND: sc.ALERT_KIND_RECOVERED, sc.ALERT_ELAPSED_S: 10.0,
                                        sc.ALERT_SPAN_ID: stuck["span_id"]})
    steps(0, 0, 60, 2, 2.0, 17)
    # Rank 0, run 1 (80-120, finishes): downtime 10 (70-80), recovery 2 (80-82),
    # checkpoint_restore 3, productive 20, checkpoint_save 1, host_outside_steps 1 (106-107, before
    # training.train ended), other 13 (107-120). Sum 40.
    add(0, 1, sc.SPAN_PROCESS, 80, 120)
    add(0, 1, sc.SPAN_LOAD_CHECKPOINT, 82, 85)
    add(0, 1, sc.SPAN_TRAIN, 84, 107)
    steps(0, 1, 85, 10, 2.0, 12)
    add(0, 1, sc.SPAN_SAVE_CHECKPOINT, 105, 106)
    # Rank 1, run 0 (fails at 70): program_startup 10, productive 48 (12 steps of 4 s),
    # checkpoint_save 2, wasted_progress 4 (one step after the checkpoint), host_outside_steps 6. Sum 70.
    add(1, 0, sc.SPAN_PROCESS, 0, 70, error=True)
    steps(1, 0, 10, 12, 4.0, 0)
    add(1, 0, sc.SPAN_SAVE_CHECKPOINT, 58, 60)
    steps(1, 0, 60, 1, 4.0, 12)
    # Rank 1, run 1: downtime 10, productive 40 (10 steps of 4 s from 80 to 120).
    add(1, 1, sc.SPAN_PROCESS, 80, 120)
    add(1, 1, sc.SPAN_TRAIN, 80, 120)
    steps(1, 1, 80, 10, 4.0, 12)
    return spans


SPANS = _spans()

EXPECTED_SECONDS = {
    "productive": 23 + 20 + 48 + 40,
    sc.BADPUT_INITIALIZATION: 5,
    sc.BADPUT_TRAINING_PREP: 5,
    sc.BADPUT_PROGRAM_STARTUP: 2 + 10,
    sc.BADPUT_DATA_LOADING: 1,
    sc.BADPUT_EVALUATION: 4,
    sc.BADPUT_CHECKPOINT_SAVE: 2 + 1 + 2,
    sc.BADPUT_CHECKPOINT_RESTORE: 3,
    sc.BADPUT_STUCK: 7,
    sc.BADPUT_WASTED_PROGRESS: 15 + 4,
    sc.BADPUT_RECOVERY: 2,
    sc.BADPUT_DOWNTIME: 10 + 10,
    sc.BADPUT_HOST_OUTSIDE_STEPS: 6 + 1 + 6,
    sc.BADPUT_OTHER: 13,
}
EXPECTED_TOTAL = 2 * (70 + 10 + 40)
EXPECTED_GOODPUT = 131 / 240


def _resource(rank: int, restart: int) -> dict[str, Any]:
    return {sc.TRAINING_JOB_ID: JOB, sc.TRAINING_RANK: rank, sc.TRAINING_RESTART_COUNT: restart,
            sc.TRAINING_RUN_ID: f"run-{restart}", sc.SERVICE_NAME: "crafted", sc.TRAINING_ROLE: sc.ROLE_TRAINER}


def records() -> list[SpanRecord]:
    """The crafted spans as analysis records."""
    return [
        SpanRecord(name=span["name"], start_ns=_s(span["start"]), end_ns=_s(span["end"]),
                   run=RunKey.from_resource(_resource(span["rank"], span["restart"])),
                   attributes=dict(span["attributes"]), span_id=span["span_id"], error=span["error"],
                   service="crafted")
        for span in SPANS
    ]


_attributes = otlp_attributes


def otlp_line(rank: int, restart: int, spans: list[dict[str, Any]]) -> str:
    """One OTLP JSON export request holding ``spans`` of one run of one rank."""
    return json.dumps({"resourceSpans": [{
        "resource": {"attributes": _attributes(_resource(rank, restart))},
        "scopeSpans": [{"scope": {"name": "otel_training"}, "spans": [{
            "traceId": format(rank * 1000 + restart + 1, "032x"),
            "spanId": span["span_id"],
            "name": span["name"],
            "kind": 1,
            "startTimeUnixNano": str(_s(span["start"])),
            "endTimeUnixNano": str(_s(span["end"])),
            "attributes": _attributes(span["attributes"]),
            "status": {"code": 2} if span["error"] else {},
        } for span in spans]}],
    }]})


def write_otlp(directory: Path) -> list[Path]:
    """The crafted job as the file exporter writes it: one file per rank, restarts appended."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank in (0, 1):
        path = directory / f"traces-r{rank}.jsonl"
        lines = []
        for restart in (0, 1):
            spans = [span for span in SPANS if span["rank"] == rank and span["restart"] == restart]
            spans.sort(key=lambda span: span["end"])
            half = len(spans) // 2  # two batches per run, like a batch span processor
            lines += [otlp_line(rank, restart, spans[:half]), otlp_line(rank, restart, spans[half:])]
        path.write_text("".join(line + "\n" for line in lines))
        paths.append(path)
    return paths


def step_durations(rank: int) -> list[float]:
    return [span["end"] - span["start"] for span in SPANS if span["rank"] == rank and span["name"] == sc.SPAN_STEP]
