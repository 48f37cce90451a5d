"""What the report keeps of a job's spans: per rank and life aggregates, not the spans.

A ``Part`` is what one input (a file read by a worker, or records in memory)
contributes: each rank's finished runs, its step durations in the order they
ran (8 bytes a step), its straggler window medians and the steps at window
edges, bounded samples for the plots, the alerts and the problems. Parts of
different files merge without the spans; ``job.assemble`` turns them into
the report.
"""

from __future__ import annotations

import dataclasses
import heapq
import statistics
from array import array
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, cast

from otel_training import semconv as sc
from otel_training.analysis import RunKey, RunSummary, SpanRecord, span_label, times_step
from otel_training.analysis.goodput import Life, _RecordsLife, normalize_span_id, rank_runs
from otel_training.analysis.gpu import ERRORS_KEY, GpuErrors, step_errors, step_state
from otel_training.analysis.hang_tracker import HangTracker
from otel_training.analysis.stragglers import window_bounds
from otel_training.report.gpu_steps import GpuSteps, RankGpu, rank_gpu

#: Steps per rank kept for the step-time plot (every n-th, n doubling as the run grows), and the
#: longest ones kept besides: the plot shows the shape of a run and its outliers.
SAMPLE_STEPS = 1024
SAMPLE_LONGEST = 16
#: Steps the plot shows of all ranks together (each rank's sample thinned to its share).
PLOT_STEPS = 65536
#: Intervals per (rank, label) kept for the timeline before merging those closer than a resolution
#: that doubles each time: the plot has a few thousand pixels.
TIMELINE_INTERVALS = 2048
#: Ranks the timeline shows (the lowest-numbered).
TIMELINE_RANKS = 16
#: No step number (``Step.step`` None) in an ``array('q')``.
NO_STEP = -(2**63)


@dataclasses.dataclass(frozen=True)
class Alert:
    rank: int
    restart: int
    time_ns: int
    kind: str
    span_name: str
    elapsed_s: float | None
    threshold_s: float | None
    stacks: str
    #: What the alert is about, where known: the step, and the device a device step ran on.
    step: int | None = None
    device: str = ""
    #: The stuck span's id (``training.alert.span_id``): its repeats and its recovery name the same one.
    span_id: str = ""

    @property
    def about(self) -> str:
        """"training.device_step step 80 on cuda:0": the span, its step and device."""
        text = self.span_name or "span"
        if self.step is not None:
            text += f" step {self.step}"
        return f"{text} on {self.device}" if self.device else text


@dataclasses.dataclass(frozen=True)
class Step:
    rank: int
    restart: int
    start_ns: int
    duration_s: float
    #: The span's training.step, where it has one.
    step: int | None = None

    @property
    def end_ns(self) -> int:
        return self.start_ns + round(self.duration_s * 1e9)


def int_value(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    try:
        return float(value)  # type: ignore[arg-type]  # any object: float()'s TypeError/ValueError is the check
    except (TypeError, ValueError):
        return None


def alert_of(rank: int, restart: int, time_ns: int, attributes: dict[str, Any]) -> Alert:
    return Alert(
        rank=rank, restart=restart, time_ns=time_ns,
        kind=str(attributes.get(sc.ALERT_KIND, "")),
        span_name=str(attributes.get(sc.ALERT_SPAN_NAME, "")),
        elapsed_s=_float(attributes.get(sc.ALERT_ELAPSED_S)),
        threshold_s=_float(attributes.get(sc.ALERT_THRESHOLD_S)),
        stacks=str(attributes.get(sc.ALERT_STACKS, "")),
        step=int_value(attributes.get(sc.STEP)),
        device=str(attributes.get(sc.DEVICE, "")),
        span_id=normalize_span_id(attributes.get(sc.ALERT_SPAN_ID, "")),
    )


class StepColumns:
    """One rank's timed steps as they were read: 25 bytes a step, not a Step object."""

    __slots__ = ("durations", "numbers", "restarts", "starts")

    def __init__(self) -> None:
        self.starts = array("q")
        self.durations = array("d")
        self.numbers = array("q")
        self.restarts = array("l")

    def add(self, start_ns: int, end_ns: int, step: object, restart: int) -> None:
        self.starts.append(start_ns)
        self.durations.append((end_ns - start_ns) / 1e9 if end_ns > start_ns else 0.0)
        number = int_value(step)
        self.numbers.append(NO_STEP if number is None or not -(2**63) < number < 2**63 else number)
        self.restarts.append(restart)

    def copy(self, other: StepColumns, index: int) -> None:
        self.starts.append(other.starts[index])
        self.durations.append(other.durations[index])
        self.numbers.append(other.numbers[index])
        self.restarts.append(other.restarts[index])

    def __len__(self) -> int:
        return len(self.starts)

    def step(self, rank: int, index: int) -> Step:
        number = self.numbers[index]
        return Step(rank, self.restarts[index], self.starts[index], self.durations[index],
                    None if number == NO_STEP else number)


@dataclasses.dataclass
class RankPart:
    """One rank, finished: its runs, and its steps in the order they ran."""

    rank: int
    runs: list[RunSummary]
    durations: array[float]
    window_medians: array[float]
    #: The median absolute deviation of each window's steps: the noise its median has.
    window_mads: array[float]
    #: The first and last step of each straggler window, two per window in window order.
    edges: StepColumns
    #: Every n-th step and the longest ones, for the step-time plot.
    sample: StepColumns
    #: The GPU's state in each straggler window and on the sampled steps, where its steps carried one.
    gpu: RankGpu | None = None


def rank_part(rank: int, lives: Iterable[Life], steps: StepColumns, window: int,
              gpu: GpuSteps | None = None) -> RankPart:
    """Finish a rank whose lives and steps are all known (``gpu``: those of its steps with a GPU state)."""
    runs = rank_runs(lives)
    # The order they ran: by start, ties in the order read (a stable sort).
    read_order = order = _run_order(steps.starts)
    durations = array("d", (steps.durations[index] for index in order)) if order is not None else steps.durations
    order = order if order is not None else range(len(durations))
    bounds = window_bounds(len(durations), window)
    medians = array("d", (statistics.median(durations[first:end]) for first, end in bounds))
    mads = array("d", (statistics.median(abs(value - median) for value in durations[first:end])
                       for (first, end), median in zip(bounds, medians)))
    edges = StepColumns()
    for first, end in bounds:
        edges.copy(steps, order[first])
        edges.copy(steps, order[end - 1])
    stride = 1
    while len(order) > stride * SAMPLE_STEPS:
        stride *= 2
    kept = set(order[::stride])
    kept.update(order[position] for position in
                heapq.nlargest(SAMPLE_LONGEST, range(len(durations)), key=durations.__getitem__))
    sample = StepColumns()
    sampled = sorted(kept, key=lambda index: (steps.starts[index], index))
    for index in sampled:
        sample.copy(steps, index)
    folded = rank_gpu(gpu, read_order, bounds, sampled) if gpu else None
    return RankPart(rank, runs, durations, medians, mads, edges, sample, folded)


def _run_order(starts: array[int]) -> Sequence[int] | None:
    """Indices of the steps by start, ties in the order read; None when they were read in that order."""
    if all(starts[index] <= starts[index + 1] for index in range(len(starts) - 1)):
        return None
    try:
        import numpy
    except ImportError:
        return sorted(range(len(starts)), key=starts.__getitem__)
    return cast("list[int]", numpy.argsort(numpy.frombuffer(starts, dtype="int64"), kind="stable").tolist())


class Intervals:
    """Labelled time of the lowest-numbered ranks for the timeline plot, merged past what it can show.

    A timeline of a thousand ranks is not readable, and its intervals would be the largest
    thing the report holds: ``TIMELINE_RANKS`` ranks are kept (the page says how many of all).
    """

    def __init__(self) -> None:
        self.spans: dict[tuple[int, str], list[tuple[int, int]]] = {}
        self.ranks: set[int] = set()
        self.resolution = 0

    def add(self, rank: int, label: str, start_ns: int, end_ns: int) -> None:
        self.extend(rank, label, [(start_ns, end_ns)])

    def extend(self, rank: int, label: str, items: list[tuple[int, int]]) -> None:
        if rank not in self.ranks:
            if len(self.ranks) >= TIMELINE_RANKS:
                highest = max(self.ranks)
                if rank > highest:
                    return
                self.ranks.discard(highest)
                self.spans = {key: spans for key, spans in self.spans.items() if key[0] != highest}
            self.ranks.add(rank)
        spans = self.spans.setdefault((rank, label), [])
        spans.extend(items)
        if len(spans) > TIMELINE_INTERVALS:
            first = min(start for start, _ in spans)
            self.resolution = max(2 * self.resolution, (max(end for _, end in spans) - first) // TIMELINE_INTERVALS)
            spans[:] = merged(spans, self.resolution)

    def update(self, other: Intervals) -> None:
        for (rank, label), spans in other.spans.items():
            self.extend(rank, label, spans)


def merged(intervals: list[tuple[int, int]], resolution: int) -> list[tuple[int, int]]:
    """Intervals closer than ``resolution`` merged: one mark per pixel is all a plot can show."""
    intervals.sort()
    out: list[list[int]] = []
    for start, end in intervals:
        if out and start - out[-1][1] <= resolution:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(start, end) for start, end in out]


@dataclasses.dataclass
class Part:
    """What one input contributes to the report; ``update`` merges another's."""

    span_count: int = 0
    job_ids: set[str] = dataclasses.field(default_factory=set)
    #: Each job's last span end (ns): which job of mixed inputs ran last.
    job_ends: dict[str, int] = dataclasses.field(default_factory=dict)
    services: set[str] = dataclasses.field(default_factory=set)
    start_ns: int | None = None
    end_ns: int | None = None
    alerts: list[Alert] = dataclasses.field(default_factory=list)
    ranks: dict[int, RankPart] = dataclasses.field(default_factory=dict)
    intervals: Intervals = dataclasses.field(default_factory=Intervals)
    #: Ranks this input has spans of but did not finish (they need their spans in memory).
    unfinished: set[int] = dataclasses.field(default_factory=set)
    #: Each rank's last collectives and stuck/died alerts, for the hang verdict.
    hang: HangTracker = dataclasses.field(default_factory=HangTracker)
    #: Seconds the trainers' host steps waited for their batches (``training.step.data_wait_s``).
    data_wait_s: float = 0.0
    #: Spans dropped as read before (same trace and span id), by file: said in the problems, counted once.
    duplicates: dict[str, int] = dataclasses.field(default_factory=dict)
    #: The processes (lives) whose spans were read: inputs that share one may hold the same spans.
    resources: set[RunKey] = dataclasses.field(default_factory=set)
    #: The GPU errors (XID, uncorrected ECC, lost) the ranks' step spans' events counted.
    gpu_errors: GpuErrors = dataclasses.field(default_factory=GpuErrors)

    def data_wait(self, value: object) -> None:
        if type(value) is float or (isinstance(value, (int, float)) and not isinstance(value, bool)):
            if value > 0:
                self.data_wait_s += value

    def span(self, start_ns: int, end_ns: int) -> None:
        self.span_count += 1
        if self.start_ns is None or start_ns < self.start_ns:
            self.start_ns = start_ns
        if self.end_ns is None or end_ns > self.end_ns:
            self.end_ns = end_ns

    def update(self, other: Part) -> None:
        self.span_count += other.span_count
        self.job_ids |= other.job_ids
        for job_id, end_ns in other.job_ends.items():
            self.job_ends[job_id] = max(end_ns, self.job_ends.get(job_id, end_ns))
        self.services |= other.services
        for value in (other.start_ns, other.end_ns):
            if value is not None:
                self.start_ns = value if self.start_ns is None else min(self.start_ns, value)
                self.end_ns = value if self.end_ns is None else max(self.end_ns, value)
        self.alerts.extend(other.alerts)
        self.intervals.update(other.intervals)
        self.unfinished |= other.unfinished
        self.hang.update(other.hang)
        self.data_wait_s += other.data_wait_s
        for path, count in other.duplicates.items():
            self.duplicates[path] = self.duplicates.get(path, 0) + count
        self.resources |= other.resources
        self.gpu_errors.update(other.gpu_errors)
        for rank, part in other.ranks.items():
            if rank in self.ranks:
                raise ValueError(f"rank {rank} is in two parts: read its spans together")
            self.ranks[rank] = part


def part_from_records(records: Sequence[SpanRecord], *, evaluation_is_productive: bool = False,
                      window: int, ranks: set[int] | None = None) -> Part:
    """The part of ``records`` in memory (of ``ranks`` only, if given: the rest is counted elsewhere)."""
    part = Part()
    lives: defaultdict[Any, list[SpanRecord]] = defaultdict(list)
    steps: defaultdict[int, StepColumns] = defaultdict(StepColumns)
    gpu: defaultdict[int, GpuSteps] = defaultdict(GpuSteps)

    def add_step(rank: int, record: SpanRecord) -> None:
        steps[rank].add(record.start_ns, record.end_ns, record.attributes.get(sc.STEP), record.run.restart)
        state = step_state(record.attributes)
        if state is not None:
            gpu[rank].add(len(steps[rank]) - 1, state)

    for record in records:
        rank = record.run.rank
        if ranks is not None:
            if rank in ranks and record.is_trainer:
                lives[record.run].append(record)
                if times_step(record.name, record.attributes):
                    add_step(rank, record)
            continue
        part.span(record.start_ns, record.end_ns)
        part.hang.add(record)
        if record.run.job_id:
            part.job_ids.add(record.run.job_id)
            part.job_ends[record.run.job_id] = max(record.end_ns, part.job_ends.get(record.run.job_id, 0))
        if record.service:
            part.services.add(record.service)
        if record.is_trainer:
            lives[record.run].append(record)
        if record.is_trainer and record.name == sc.SPAN_STEP:
            part.data_wait(record.attributes.get(sc.STEP_DATA_WAIT_S))
        if ERRORS_KEY in record.attributes and record.is_trainer:
            part.gpu_errors.add(rank, step_errors(record.attributes))
        if record.is_trainer and times_step(record.name, record.attributes):
            add_step(rank, record)
        elif record.name == sc.SPAN_ALERT:
            part.alerts.append(alert_of(rank, record.run.restart, record.start_ns, record.attributes))
        label = span_label(record.name, evaluation_is_productive)
        if label is not None:
            part.intervals.add(rank, label, record.start_ns, record.end_ns)
    by_rank: defaultdict[int, list[Life]] = defaultdict(list)
    for key, run_records in lives.items():
        by_rank[key.rank].append(_RecordsLife(key, run_records, evaluation_is_productive))
    for rank, rank_lives in by_rank.items():
        part.ranks[rank] = rank_part(rank, rank_lives, steps[rank], window, gpu.get(rank))
    return part
