"""Everything the report shows about one job, computed once from its spans."""

from __future__ import annotations

import dataclasses
import heapq
import statistics
from array import array
from collections.abc import Sequence
from typing import Any

from otel_training.analysis import PRODUCTIVE, GoodputAccount, SpanRecord, StepStats, StragglerScore
from otel_training.analysis.goodput import job_account
from otel_training.analysis.gpu import GpuErrors, GpuView, explain
from otel_training.analysis.hang_episodes import Episode
from otel_training.analysis.stragglers import (
    DEFAULT_THRESHOLD,
    WINDOW,
    WindowScore,
    scores_from_medians,
)
from otel_training.report import stats
from otel_training.report.digest import (
    PLOT_STEPS,
    SAMPLE_LONGEST,
    Alert,
    Part,
    RankPart,
    Step,
    StepColumns,
    part_from_records,
)
from otel_training.report.gpu_steps import RankGpu
from otel_training.report.reader import Problem

__all__ = ["Alert", "JobReport", "Step", "assemble", "build_report"]


@dataclasses.dataclass
class JobReport:
    job_ids: list[str]
    services: list[str]
    span_count: int
    start_ns: int
    end_ns: int
    goodput: GoodputAccount
    ideal_step_s: float | None
    normal_threshold_s: float | None
    rank_steps: dict[int, StepStats]
    job_steps: StepStats | None
    stragglers: list[StragglerScore]
    alerts: list[Alert]
    #: Each rank's step durations in the order they ran (seconds, 8 bytes a step).
    rank_durations: dict[int, array[float]]
    #: A bounded sample of each rank's steps (with its longest), for the step-time plot.
    step_sample: list[Step]
    problems: list[Problem]
    #: Steps per straggler report window, and the score below which a window names its rank.
    straggler_window: int = WINDOW
    straggler_threshold: float = DEFAULT_THRESHOLD
    #: The first and last step of each straggler window of each rank, two per window.
    window_edges: dict[int, StepColumns] = dataclasses.field(default_factory=dict)
    #: Labelled time of each rank for the timeline, (rank, label) -> intervals.
    intervals: dict[tuple[int, str], list[tuple[int, int]]] = dataclasses.field(default_factory=dict)
    #: The hang verdict (culprit ranks, who waits on whom, each rank's last collectives); empty if none hung.
    hang: list[str] = dataclasses.field(default_factory=list)
    #: Every episode of stuck ranks with its verdict, recovered or not (``analysis/hang_episodes.py``): per (job
    #: id, run id), oldest first; and the lines the summary prints for them.
    hang_episodes: dict[tuple[str, str], list[Episode]] = dataclasses.field(default_factory=dict)
    hang_episode_lines: list[str] = dataclasses.field(default_factory=list)
    #: Seconds the host steps waited for their batches. Beside ``data_loading`` (the time the accelerator,
    #: or on the host timeline the step, sat idle for input) it says how much of the waiting cost nothing.
    data_wait_s: float = 0.0
    #: Spans read more than once (the same trace and span id) and counted once; ``problems`` names their files.
    #: The streamed report's (``report_files``); ``read_paths`` says its own in its problems only.
    duplicate_spans: int = 0
    #: Each job's last span end (ns), to tell which of several jobs in the input ran last.
    job_ends: dict[str, int] = dataclasses.field(default_factory=dict)
    #: The GPU's state per straggler window and on the plotted steps, of the ranks whose steps carried one.
    rank_gpu: dict[int, RankGpu] = dataclasses.field(default_factory=dict)
    #: The GPU errors (XID, uncorrected ECC, lost) the ranks' step spans' events counted.
    gpu_errors: GpuErrors = dataclasses.field(default_factory=GpuErrors)
    #: The drain's GPU samples (clocks, power) of the plotted ranks, from their metrics files where the
    #: traces have them beside (``gpu_metrics.py``; only ``report_files`` reads them).
    gpu_series: dict[int, Any] = dataclasses.field(default_factory=dict)

    @property
    def straggler_ranks(self) -> list[int]:
        return [score.rank for score in self.stragglers if score.straggler]

    @property
    def step_count(self) -> int:
        return sum(len(durations) for durations in self.rank_durations.values())

    def window_steps(self, rank: int, window: WindowScore) -> tuple[Step, Step]:
        """The first and last step of a rank's straggler window: its training steps and times."""
        edges = self.window_edges[rank]
        return edges.step(rank, 2 * window.index), edges.step(rank, 2 * window.index + 1)

    def window_label(self, rank: int, window: WindowScore) -> str:
        """"steps 40-59, 80.0-120.0 s into the job": where to look on the step-time plot.

        Training step numbers where the spans carry them (with the restart, for
        a window across one: its steps run back to the restored checkpoint),
        else the rank's steps counted from 1 in the order they ran.
        """
        first, last = self.window_steps(rank, window)
        if first.step is not None and last.step is not None and first.restart != last.restart:
            steps = f"steps {first.step} (restart {first.restart}) to {last.step} (restart {last.restart})"
        elif first.step is not None and last.step is not None:
            steps = f"steps {first.step}-{last.step}"
        else:
            steps = f"its steps #{window.first + 1}-#{window.last + 1}"
        return (f"{steps}, {(first.start_ns - self.start_ns) / 1e9:.1f}-{(last.end_ns - self.start_ns) / 1e9:.1f} s "
                "into the job")

    def straggler_gpu(self) -> dict[int, tuple[int, str]]:
        """Named rank -> (window index, how its GPU differed from the other ranks' in that window): its worst
        window's, else its first slow window's that differed. Ranks whose GPU did not differ are left out."""
        found = {}
        for score in self.stragglers:
            worst = score.worst_window
            if not score.straggler or worst is None:
                continue
            for window in (worst, *score.slow_windows):
                text = self.window_gpu(score.rank, window)
                if text:
                    found[score.rank] = (window.index, text)
                    break
        return found

    def window_gpu(self, rank: int, window: WindowScore) -> str:
        """How a rank's GPU differed from the other ranks' in one straggler window, or ""."""
        gpu = self.rank_gpu.get(rank)
        view: GpuView | None = gpu.view(window.index) if gpu is not None else None
        first, last = self.window_steps(rank, window)
        errors = self.gpu_errors.between(rank, first.start_ns, last.end_ns)
        if errors:
            view = (view or GpuView()).with_errors(errors)
        peers = [other.view(window.index) for number, other in self.rank_gpu.items() if number != rank]
        return explain(view, peers)

    def straggler_lines(self) -> list[str]:
        """One line per named rank: its worst window, the view that named it, and how many windows were slow;
        and one more where its GPU differed from the other ranks' (clocks, throttling, errors)."""
        lines = []
        gpu = self.straggler_gpu()
        for score in self.stragglers:
            worst = score.worst_window
            if not score.straggler or worst is None:
                continue
            scores = sorted(window.score for window in score.windows)
            spread = (f"; its window scores: median {statistics.median(scores):.2f}, "
                      f"p10-p90 {_quantile(scores, 0.1):.2f}-{_quantile(scores, 0.9):.2f}") if len(scores) > 1 else ""
            lines.append(
                f"rank {score.rank}: {worst.view} {worst.score:.2f} in window {worst.index + 1} of "
                f"{len(score.windows)} ({self.window_label(score.rank, worst)}); {len(score.slow_windows)} "
                f"window(s) of {self.straggler_window} steps below {self.straggler_threshold:g}{spread}")
            if score.rank in gpu:
                index, text = gpu[score.rank]
                where = f" (window {index + 1})" if index != worst.index else ""
                lines.append(f"rank {score.rank} GPU: {text}{where}")
        return lines


    def job_slow_window_lines(self, limit: int = 10) -> list[str]:
        """One line per window most ranks slowed down in together (or a one-rank job's slow window): the job
        slowed, no rank is named; with what the spans say it was doing then, where they say it."""
        by_index: dict[int, list[tuple[int, WindowScore]]] = {}
        for score in self.stragglers:
            for window in score.shared_windows:
                by_index.setdefault(window.index, []).append((score.rank, window))
        lines = []
        for index in sorted(by_index)[:limit]:
            entries = by_index[index]
            rank, window = entries[0]
            factor = statistics.median(1 / max(entry.individual, 1e-9) for _, entry in entries)
            ranks = ", ".join(str(number) for number, _ in entries)
            lines.append(f"window {index + 1} ({self.window_label(rank, window)}): rank(s) {ranks} {factor:.2f}x "
                         f"their best window{self._cause(rank, window)}")
        if len(by_index) > limit:
            lines.append(f"... and {len(by_index) - limit} more window(s)")
        return lines

    def _cause(self, rank: int, window: WindowScore) -> str:
        """What took the largest share (at least a tenth) of a rank's window, from its labelled spans."""
        first, last = self.window_steps(rank, window)
        begin, end = first.start_ns, last.end_ns
        if end <= begin:
            return ""
        shares = {}
        for (number, label), spans in self.intervals.items():
            if number == rank and label != PRODUCTIVE:
                shares[label] = sum(max(0, min(end, stop) - max(begin, start)) for start, stop in spans)
        if not shares:
            return ""
        label = max(shares, key=shares.__getitem__)
        return f", during {label} ({shares[label] / (end - begin):.0%} of it)" if shares[label] * 10 >= end - begin else ""


def _quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted values (nearest rank): the spread a straggler line shows."""
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def assemble(part: Part, problems: Sequence[Problem] = (), *, ideal_step_time_s: float | None = None,
             straggler_threshold: float = DEFAULT_THRESHOLD, straggler_window: int = WINDOW) -> JobReport:
    """The report of a job from what its inputs contributed."""
    ranks = [part.ranks[rank] for rank in sorted(part.ranks)]
    threshold, ideal, job_steps = stats.job_figures([rank.durations for rank in ranks], ideal_step_time_s)
    with_steps = [rank for rank in ranks if rank.durations]
    return JobReport(
        job_ids=sorted(part.job_ids),
        job_ends=dict(part.job_ends),
        services=sorted(part.services),
        span_count=part.span_count,
        start_ns=part.start_ns or 0,
        end_ns=part.end_ns or 0,
        goodput=job_account(rank.runs for rank in ranks),
        ideal_step_s=ideal,
        normal_threshold_s=threshold,
        rank_steps={rank.rank: rank_stats for rank in with_steps
                    if (rank_stats := stats.stats_of(rank.durations, ideal, threshold)) is not None},
        job_steps=job_steps,
        stragglers=scores_from_medians(
            {rank.rank: rank.window_medians for rank in with_steps},
            {rank.rank: len(rank.durations) for rank in with_steps},
            {rank.rank: stats.median_of(rank.durations) for rank in with_steps},
            straggler_threshold, window=straggler_window, compact=True,
            mads={rank.rank: rank.window_mads for rank in with_steps}),
        # in time, ties in rank order: files read rank by rank and Jaeger's traces come in different orders, and
        # alerts of ranks stuck at one synchronised step can share a microsecond (Jaeger keeps microseconds)
        alerts=sorted(part.alerts, key=lambda alert: (alert.time_ns, alert.rank, alert.restart, alert.kind,
                                                      alert.span_id)),
        rank_durations={rank.rank: rank.durations for rank in with_steps},
        step_sample=_plot_sample(ranks),
        problems=list(problems),
        straggler_window=straggler_window,
        straggler_threshold=straggler_threshold,
        window_edges={rank.rank: rank.edges for rank in with_steps},
        intervals=dict(part.intervals.spans),
        hang=part.hang.lines(part.gpu_errors),
        hang_episodes=part.hang.episodes(part.gpu_errors),
        hang_episode_lines=part.hang.episode_lines(part.gpu_errors),
        data_wait_s=part.data_wait_s,
        duplicate_spans=sum(part.duplicates.values()),
        rank_gpu={rank.rank: rank.gpu for rank in with_steps if rank.gpu is not None},
        gpu_errors=part.gpu_errors,
    )


def _plot_sample(ranks: Sequence[RankPart]) -> list[Step]:
    """Each rank's sample thinned to its share of ``PLOT_STEPS`` (keeping its longest steps)."""
    share = max(SAMPLE_LONGEST, PLOT_STEPS // max(1, len(ranks)))
    steps: list[Step] = []
    for rank in ranks:
        sample = rank.sample
        longest = set(heapq.nlargest(SAMPLE_LONGEST, range(len(sample)), key=sample.durations.__getitem__))
        stride = -(-len(sample) // share)
        steps.extend(sample.step(rank.rank, index) for index in range(len(sample))
                     if index % stride == 0 or index in longest)
    return steps


def build_report(
    records: Sequence[SpanRecord],
    problems: Sequence[Problem] = (),
    *,
    evaluation_is_productive: bool = False,
    ideal_step_time_s: float | None = None,
    straggler_threshold: float = DEFAULT_THRESHOLD,
    straggler_window: int = WINDOW,
) -> JobReport:
    """Goodput, step-time statistics, stragglers and alerts of the spans of one job, held in memory."""
    part = part_from_records(records, evaluation_is_productive=evaluation_is_productive, window=straggler_window)
    return assemble(part, problems, ideal_step_time_s=ideal_step_time_s,
                    straggler_threshold=straggler_threshold, straggler_window=straggler_window)
