"""Everything the report shows about one job, computed once from its spans."""

from __future__ import annotations

import dataclasses
import functools
from collections import defaultdict
from collections.abc import Sequence

from otel_training import semconv as sc
from otel_training.analysis import (
    GoodputAccount,
    SpanRecord,
    StepStats,
    StragglerScore,
    account,
    ideal_step_time,
    normal_threshold,
    step_stats,
    straggler_scores,
    times_step,
)
from otel_training.analysis.stragglers import DEFAULT_THRESHOLD, WINDOW, WindowScore
from otel_training.report.reader import Problem


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
    steps: list[Step]
    problems: list[Problem]
    #: Steps per straggler report window, and the score below which a window names its rank.
    straggler_window: int = WINDOW
    straggler_threshold: float = DEFAULT_THRESHOLD

    @property
    def straggler_ranks(self) -> list[int]:
        return [score.rank for score in self.stragglers if score.straggler]

    @functools.cached_property
    def _rank_steps(self) -> dict[int, list[Step]]:
        """Each rank's steps in the order they ran: the order straggler windows count them in."""
        by_rank: defaultdict[int, list[Step]] = defaultdict(list)
        for step in self.steps:
            by_rank[step.rank].append(step)
        return dict(by_rank)

    def window_steps(self, rank: int, window: WindowScore) -> tuple[Step, Step]:
        """The first and last step of a rank's straggler window: its training steps and times."""
        rank_steps = self._rank_steps[rank]
        return rank_steps[window.first], rank_steps[window.last]

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

    def straggler_lines(self) -> list[str]:
        """One line per named rank: its worst window, the view that named it, and how many windows were slow."""
        lines = []
        for score in self.stragglers:
            worst = score.worst_window
            if not score.straggler or worst is None:
                continue
            lines.append(
                f"rank {score.rank}: {worst.view} {worst.score:.2f} in window {worst.index + 1} of "
                f"{len(score.windows)} ({self.window_label(score.rank, worst)}); {len(score.slow_windows)} "
                f"window(s) of {self.straggler_window} steps below {self.straggler_threshold:g}")
        return lines


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def build_report(
    records: Sequence[SpanRecord],
    problems: Sequence[Problem] = (),
    *,
    evaluation_is_productive: bool = False,
    ideal_step_time_s: float | None = None,
    straggler_threshold: float = DEFAULT_THRESHOLD,
    straggler_window: int = WINDOW,
) -> JobReport:
    """Goodput, step-time statistics, stragglers and alerts of the spans of one job."""
    steps: list[Step] = []
    alerts: list[Alert] = []
    for record in records:
        if record.is_trainer and times_step(record.name, record.attributes):
            steps.append(Step(record.run.rank, record.run.restart, record.start_ns, record.duration_s,
                              _int(record.attributes.get(sc.STEP))))
        elif record.name == sc.SPAN_ALERT:
            attributes = record.attributes
            alerts.append(Alert(
                rank=record.run.rank, restart=record.run.restart, time_ns=record.start_ns,
                kind=str(attributes.get(sc.ALERT_KIND, "")),
                span_name=str(attributes.get(sc.ALERT_SPAN_NAME, "")),
                elapsed_s=_float(attributes.get(sc.ALERT_ELAPSED_S)),
                threshold_s=_float(attributes.get(sc.ALERT_THRESHOLD_S)),
                stacks=str(attributes.get(sc.ALERT_STACKS, "")),
                step=_int(attributes.get(sc.STEP)),
                device=str(attributes.get(sc.DEVICE, "")),
            ))
    steps.sort(key=lambda step: (step.rank, step.start_ns))
    alerts.sort(key=lambda alert: alert.time_ns)
    by_rank: defaultdict[int, list[float]] = defaultdict(list)
    for step in steps:
        by_rank[step.rank].append(step.duration_s)
    pooled = [step.duration_s for step in steps]
    threshold = normal_threshold(pooled)
    ideal = ideal_step_time(pooled, ideal_step_time_s)
    return JobReport(
        job_ids=sorted({record.run.job_id for record in records if record.run.job_id}),
        services=sorted({record.service for record in records if record.service}),
        span_count=len(records),
        start_ns=min((record.start_ns for record in records), default=0),
        end_ns=max((record.end_ns for record in records), default=0),
        goodput=account(records, evaluation_is_productive=evaluation_is_productive),
        ideal_step_s=ideal,
        normal_threshold_s=threshold,
        rank_steps={rank: stats for rank, durations in sorted(by_rank.items())
                    if (stats := step_stats(durations, ideal, threshold)) is not None},
        job_steps=step_stats(pooled, ideal, threshold),
        stragglers=straggler_scores(by_rank, straggler_threshold, window=straggler_window),
        alerts=alerts,
        steps=steps,
        problems=list(problems),
        straggler_window=straggler_window,
        straggler_threshold=straggler_threshold,
    )
