"""Straggler scores per rank, after NVIDIA resiliency-ext's two views.

* relative: the fastest rank's median step time over this rank's (1.0 for the
  fastest rank; 0.5 means this rank takes twice as long). In synchronous data
  parallelism one slow rank slows everyone, so this names the culprit.
* individual: this rank's best stretch against its whole run — the median of
  its fastest window of ``WINDOW`` consecutive steps over its overall median —
  which catches a rank that got slower than it was (thermal throttling, a
  noisy neighbour) even when all ranks degrade together.

Scores are in (0, 1]; a rank scoring below the threshold on either is named.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence

#: Score below which a rank is named a straggler (NVIDIA's default is 0.75 too).
DEFAULT_THRESHOLD = 0.75
#: Consecutive steps per window of the individual score.
WINDOW = 10


@dataclasses.dataclass(frozen=True)
class StragglerScore:
    rank: int
    median_s: float
    relative: float
    individual: float
    straggler: bool


def _individual(durations: Sequence[float], median: float) -> float:
    if len(durations) < 2 * WINDOW or median <= 0:
        return 1.0  # too few steps to tell a best stretch from the rest
    best = min(statistics.median(durations[i:i + WINDOW]) for i in range(0, len(durations) - WINDOW + 1, WINDOW))
    return min(1.0, best / median)


def straggler_scores(
    step_durations: Mapping[int, Sequence[float]], threshold: float = DEFAULT_THRESHOLD
) -> list[StragglerScore]:
    """Scores of every rank with steps, given each rank's step durations in step order."""
    medians = {rank: statistics.median(durations) for rank, durations in step_durations.items() if durations}
    if not medians:
        return []
    fastest = min(medians.values())
    scores = []
    for rank in sorted(medians):
        median = medians[rank]
        relative = fastest / median if median > 0 else 1.0
        individual = _individual(step_durations[rank], median)
        scores.append(StragglerScore(rank, median, relative, individual,
                                     relative < threshold or individual < threshold))
    return scores
