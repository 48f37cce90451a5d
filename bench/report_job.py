"""A synthetic training job as the file exporter writes it: OTLP JSON Lines, one file per rank.

Every rank runs ``restarts + 1`` lives (each appended to its rank's file, as
the exporter does): start-up, a checkpoint restore after a restart, steps with
data waits and substeps, evaluation and checkpoint saves (``checkpoint.step``),
a failed life's error, the last life's ``training.train``. The last rank is a
straggler, rank 0 gets stuck (a stuck alert, and a recovered one) in its first
life, and lines are written in the order a batch processor would (nearly the
order spans end: a step before its substeps, an alert after its step, as spans
that end in other threads land).

Used by ``bench_report.py`` (millions of spans, written by two processes) and
by the report's tests (a few thousand, compared with frozen figures).
"""

from __future__ import annotations

import json
import random
from multiprocessing import Pool
from pathlib import Path

from otel_training import semconv as sc

BATCH = 512  # spans per OTLP line, the batch span processor's export batch size
SPANS_PER_STEP = 4  # step, two substeps, a data wait
T0 = 1_700_000_000 * 10**9
S = 10**9


def _attr(key: str, value: object) -> str:
    if isinstance(value, bool):
        body = '{"boolValue":%s}' % ("true" if value else "false")
    elif isinstance(value, int):
        body = '{"intValue":"%d"}' % value
    elif isinstance(value, float):
        body = '{"doubleValue":%r}' % value
    else:
        body = '{"stringValue":%s}' % json.dumps(str(value))
    return '{"key":"%s","value":%s}' % (key, body)


def _attrs(values: dict[str, object]) -> str:
    return "[" + ",".join(_attr(key, value) for key, value in values.items()) + "]"


def write_rank(directory: Path, rank: int, ranks: int, restarts: int, steps_per_life: int, seed: int) -> int:
    """Write one rank's file; returns the spans written."""
    rng = random.Random(seed * 100_003 + rank)
    straggler = ranks - 1 if ranks > 1 else None
    written = 0
    lines: list[str] = []
    batch: list[str] = []
    ids = rank << 40
    clock = T0 + rank * 10**6  # ranks start a millisecond apart
    step_number = 0
    every = max(2, steps_per_life // 4)
    resource = ""
    trace_id = ""

    def span(name: str, start: int, end: int, attrs: dict[str, object] | None = None, error: bool = False) -> str:
        nonlocal ids
        ids += 1
        span_id = format(ids, "016x")
        status = '{"code":2}' if error else "{}"
        batch.append('{"traceId":"%s","spanId":"%s","name":"%s","kind":1,"startTimeUnixNano":"%d",'
                     '"endTimeUnixNano":"%d","attributes":%s,"status":%s}'
                     % (trace_id, span_id, name, start, end, _attrs(attrs or {}), status))
        if len(batch) >= BATCH:
            flush()
        return span_id

    def flush() -> None:
        nonlocal written
        if batch:
            lines.append('{"resourceSpans":[{"resource":{"attributes":%s},"scopeSpans":[{"scope":{"name":"%s"},'
                         '"spans":[%s]}]}]}\n' % (resource, sc.INSTRUMENTATION_SCOPE, ",".join(batch)))
            written += len(batch)
            batch.clear()

    with open(directory / f"traces-r{rank}.jsonl", "w", encoding="utf-8") as handle:
        for restart in range(restarts + 1):
            resource = _attrs({
                sc.SERVICE_NAME: "bench", sc.TRAINING_JOB_ID: "bench-job", sc.TRAINING_RUN_ID: f"run-{restart}",
                sc.TRAINING_RANK: rank, sc.TRAINING_RESTART_COUNT: restart, sc.TRAINING_ROLE: sc.ROLE_TRAINER,
                sc.SERVICE_INSTANCE_ID: f"r{rank}-{restart}"})
            trace_id = format(rng.getrandbits(128), "032x")
            last = restart == restarts
            life_start = clock
            span(sc.SPAN_INIT, clock, clock + 2 * S)
            clock += 2 * S
            if restart:
                span(sc.SPAN_LOAD_CHECKPOINT, clock, clock + S, {sc.CHECKPOINT_STEP: step_number - 1})
                clock += S
            train_start = clock
            base = 0.1 * (1.5 if rank == straggler else 1.0)
            for index in range(steps_per_life):
                wait = int(rng.uniform(0.002, 0.006) * S)
                span(sc.SPAN_DATA_WAIT, clock, clock + wait)
                clock += wait
                duration = int(base * rng.uniform(0.95, 1.1) * S)
                if index == 0:
                    duration *= 3  # compilation
                stuck = rank == 0 and restart == 0 and index == steps_per_life // 3
                if stuck:
                    duration = 10 * S
                step_id = span(sc.SPAN_STEP, clock, clock + duration, {sc.STEP: step_number, sc.SAMPLES: 32})
                if stuck:
                    span(sc.SPAN_ALERT, clock + 5 * S, clock + 5 * S, {
                        sc.ALERT_KIND: sc.ALERT_KIND_STUCK, sc.ALERT_ELAPSED_S: 5.0, sc.ALERT_THRESHOLD_S: 2.0,
                        sc.ALERT_SPAN_NAME: sc.SPAN_STEP, sc.ALERT_SPAN_ID: step_id, sc.STEP: step_number,
                        sc.ALERT_STACKS: "Thread MainThread, most recent call last:\n"
                                         "  File \"train.py\", line 88, in train_step\n    loss.backward()"})
                    span(sc.SPAN_ALERT, clock + duration, clock + duration, {
                        sc.ALERT_KIND: sc.ALERT_KIND_RECOVERED, sc.ALERT_ELAPSED_S: 10.0,
                        sc.ALERT_SPAN_NAME: sc.SPAN_STEP, sc.ALERT_SPAN_ID: step_id})
                for substep in range(2):
                    span(sc.SPAN_SUBSTEP, clock + substep * duration // 2, clock + (substep + 1) * duration // 2,
                         {sc.SUBSTEP: substep})
                clock += duration
                if (index + 1) % every == 0:
                    span(sc.SPAN_EVALUATE, clock, clock + S)
                    span(sc.SPAN_SAVE_CHECKPOINT, clock + S, clock + 15 * S // 10, {sc.CHECKPOINT_STEP: step_number})
                    clock += 15 * S // 10
                step_number += 1
            if last:
                span(sc.SPAN_TRAIN, train_start, clock)
            span(sc.SPAN_PROCESS, life_start, clock + S // 10, error=not last)
            flush()
            clock += 10 * S  # downtime before the restart
            step_number -= every // 2 + 1  # progress lost since the last checkpoint
            if len(lines) > 64:
                handle.writelines(lines)
                lines.clear()
        handle.writelines(lines)
    return written


def generate(directory: Path, spans: int, ranks: int, restarts: int, seed: int = 0, workers: int = 1) -> int:
    """Write the job (about ``spans`` spans) under ``directory``; returns the spans written."""
    directory.mkdir(parents=True, exist_ok=True)
    steps = max(20, spans // (ranks * (restarts + 1) * SPANS_PER_STEP))
    jobs = [(directory, rank, ranks, restarts, steps, seed) for rank in range(ranks)]
    if workers <= 1:
        return sum(write_rank(*job) for job in jobs)
    with Pool(workers) as pool:
        return sum(pool.starmap(write_rank, jobs, chunksize=1))
