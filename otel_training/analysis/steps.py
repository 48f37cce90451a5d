"""Step-time deviation: which steps are "normal", the ideal step time, and how far off each step is.

The rule is ml-goodput-measurement's: a step is normal when its duration is at
most median + 3·MAD (median absolute deviation) of all steps, the ideal step
time is the mean of the normal steps (unless configured), and the deviation of
a step is its duration minus the ideal. Below ``MIN_STEPS`` steps a median says
too little, so no ideal is derived.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from otel_training import semconv as sc

#: Steps needed before an ideal step time is derived from the data.
MIN_STEPS = 10
#: Multiple of the MAD above the median still counted as a normal step.
MAD_FACTOR = 3.0


def times_step(name: str, attributes: Mapping[str, Any]) -> bool:
    """Whether a span's duration is a step time: the device execution where the step has one, else the host step.

    CUDA work is asynchronous, so a host step with a device child measures launch time only.
    """
    if name == sc.SPAN_DEVICE_STEP:
        return True
    return name == sc.SPAN_STEP and not attributes.get(sc.STEP_DEVICE_TIMED)


def normal_threshold(durations: Sequence[float]) -> float | None:
    """Largest duration still counted as a normal step, or None with fewer than MIN_STEPS."""
    if len(durations) < MIN_STEPS:
        return None
    median = statistics.median(durations)
    mad = statistics.median([abs(d - median) for d in durations])
    return median + MAD_FACTOR * mad


def ideal_step_time(durations: Sequence[float], configured: float | None = None) -> float | None:
    """The configured ideal, else the mean of the normal steps (None below MIN_STEPS)."""
    if configured is not None:
        return configured
    threshold = normal_threshold(durations)
    if threshold is None:
        return None
    return statistics.fmean(d for d in durations if d <= threshold)


@dataclasses.dataclass(frozen=True)
class StepStats:
    """Step-time statistics of one rank (or of the whole job), in seconds."""

    count: int
    mean: float
    median: float
    p90: float
    minimum: float
    maximum: float
    ideal: float | None
    """Ideal step time used for the deviation (shared by all ranks of a job)."""
    mean_deviation: float | None
    """Mean of (duration − ideal) over the steps: one stuck step among few pulls it far from the median."""
    abnormal: int
    """Steps longer than median + 3·MAD of the pooled steps."""
    mad: float = 0.0
    """Median absolute deviation from the median: the spread of typical steps, which a stuck step does not move."""


def step_stats(durations: Sequence[float], ideal: float | None, threshold: float | None) -> StepStats | None:
    """Statistics of ``durations`` against a job-wide ``ideal`` and normal ``threshold``."""
    if not durations:
        return None
    ordered = sorted(durations)
    count = len(ordered)
    p90 = ordered[min(count - 1, int(0.9 * count))]
    median = statistics.median(ordered)
    return StepStats(
        count=count,
        mean=statistics.fmean(ordered),
        median=median,
        p90=p90,
        minimum=ordered[0],
        maximum=ordered[-1],
        ideal=ideal,
        mean_deviation=None if ideal is None else statistics.fmean(ordered) - ideal,
        abnormal=0 if threshold is None else sum(1 for d in ordered if d > threshold),
        mad=statistics.median([abs(d - median) for d in ordered]),
    )
