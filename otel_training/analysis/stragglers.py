"""Straggler scores per rank and report window, after NVIDIA resiliency-ext's two views.

A rank's steps, in the order they ran, are cut into report windows of ``window``
consecutive steps, and each window is scored twice:

* relative: the fastest rank's median step time in that window over this rank's
  (1.0 for the fastest rank; 0.5 means this rank takes twice as long). In
  synchronous data parallelism one slow rank slows everyone, so this names the
  culprit. Ranks of such a job take the same steps, so the k-th window of every
  rank covers the same training steps.
* individual: this rank's best window median so far over this window's median,
  which catches a rank that got slower than it was (thermal throttling, a noisy
  neighbour) even when all ranks degrade together. "So far", as NVRx's "rank
  historical min", so that a job that speeds up after warm-up is not named for
  its warm-up, and so the live gauge (which cannot see the future) gives the
  figure the report gives.

Scores are in (0, 1]. A rank is named when any of its windows scores below the
threshold on either view: a post-mortem asks who was slow at any time, and a
whole-run median hid a rank slow for the last third of a run (issue 9 item 6).

A window's median is ``statistics.median`` of its step durations: the middle
value, or the mean of the middle two for an even count (NVRx's ``torch.median``
takes the lower of the two). A median of ``window`` steps ignores fewer than
half of them being slow, so one stuck step or first-step compilation names no
one, while a slow stretch longer than ``window`` steps always is.

The last window may be part of one: it is scored once it holds half a window
(so the last steps of a run are not ignored: a rank slow for its last 20 of 60
steps is named whatever the window from 10 to 20), and a rank with fewer steps
than that has one window of all of them, so short runs still get a relative
score. The live gauge cuts the steps it has seen the same way, so on the same
steps it reads what the report reads.
"""

from __future__ import annotations

import dataclasses
import statistics
from array import array
from collections.abc import Mapping, Sequence
from typing import overload

#: Score below which a rank is named a straggler (NVIDIA's default is 0.75 too).
DEFAULT_THRESHOLD = 0.75
#: Consecutive steps per report window (``--straggler-window``): a median of 10 ignores up to 4
#: outlying steps (a stuck step, a compilation), a slow stretch of 11 steps is always caught, and a
#: run of 20 steps already has a window to compare against.
WINDOW = 10


@dataclasses.dataclass(frozen=True, slots=True)
class WindowScore:
    """One report window of a rank: its steps ``first`` to ``last`` (0-based, inclusive) in the order they ran."""

    index: int
    first: int
    last: int
    median_s: float
    relative: float
    individual: float

    @property
    def score(self) -> float:
        return min(self.relative, self.individual)

    @property
    def view(self) -> str:
        """The view that scored this window lower ("relative" on a tie: the culprit of a slow job)."""
        return "relative" if self.relative <= self.individual else "individual"


@dataclasses.dataclass(frozen=True, slots=True)
class StragglerScore:
    """A rank's scores: ``relative`` and ``individual`` are its worst window's on each view."""

    rank: int
    median_s: float
    relative: float
    individual: float
    straggler: bool
    #: Every window in order (a tuple, or ``WindowScores`` where the report keeps them compact).
    windows: Sequence[WindowScore] = ()
    #: The windows scoring below the threshold on either view, in order.
    slow_windows: tuple[WindowScore, ...] = ()

    @property
    def worst_window(self) -> WindowScore | None:
        """The lowest-scoring window (the first of equals): where to look on the step-time plot."""
        return min(self.windows, key=lambda window: window.score, default=None)


def _windows(count: int, window: int) -> list[tuple[int, int]]:
    """(first, end) of each window of ``count`` steps: whole ones, then the rest once it is half a window."""
    bounds = [(first, first + window) for first in range(0, count - window + 1, window)]
    rest = count - len(bounds) * window
    if rest and (not bounds or 2 * rest >= window):
        bounds.append((count - rest, count))
    return bounds


def window_bounds(count: int, window: int = WINDOW) -> list[tuple[int, int]]:
    """(first, end) step indices of each report window of a rank with ``count`` steps."""
    _check_window(window)
    return _windows(count, window)


def _ratio(reference: float, median: float) -> float:
    return min(1.0, reference / median) if median > 0 else 1.0


def _check_window(window: int) -> None:
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"straggler window must be a whole number of steps >= 1, got {window!r}")


def current_individual(durations: Sequence[float], window: int = WINDOW) -> float | None:
    """The individual score of the latest window of one rank's steps (None before its first step).

    For a live gauge: it needs only the rank's own steps, where the relative
    score needs every rank's. Fed this process's step durations in order, it is
    the report's figure for the same window.
    """
    _check_window(window)
    medians = [statistics.median(durations[first:end]) for first, end in _windows(len(durations), window)]
    return _ratio(min(medians), medians[-1]) if medians else None


class LiveIndividual:
    """``current_individual`` one step at a time, holding one window of steps and the best closed window.

    A live processor sees every step of a long run: recomputing from all of
    them would cost O(steps) per step, and keeping them O(steps) memory.
    """

    def __init__(self, window: int = WINDOW) -> None:
        _check_window(window)
        self.window = window
        self._best: float | None = None  # best median of the whole windows closed so far
        self._current: list[float] = []
        self._score: float | None = None

    def add(self, duration_s: float) -> float | None:
        """Count one step; the rank's individual score now (what ``current_individual`` gives on the same steps)."""
        self._current.append(duration_s)
        if self._best is None or 2 * len(self._current) >= self.window:
            median = statistics.median(self._current)
            self._score = _ratio(median if self._best is None else min(self._best, median), median)
            if len(self._current) == self.window:
                self._best = median if self._best is None else min(self._best, median)
                self._current = []
        return self._score


def window_medians(durations: Sequence[float], window: int = WINDOW) -> list[float]:
    """The median step time of each report window of one rank's steps, in the order they ran."""
    _check_window(window)
    return [statistics.median(durations[first:end]) for first, end in _windows(len(durations), window)]


def straggler_scores(
    step_durations: Mapping[int, Sequence[float]],
    threshold: float = DEFAULT_THRESHOLD,
    *,
    window: int = WINDOW,
) -> list[StragglerScore]:
    """Scores of every rank with steps, given each rank's step durations in the order they ran."""
    _check_window(window)
    ranks = [rank for rank, durations in step_durations.items() if durations]
    return scores_from_medians(
        {rank: window_medians(step_durations[rank], window) for rank in ranks},
        {rank: len(step_durations[rank]) for rank in ranks},
        {rank: statistics.median(step_durations[rank]) for rank in ranks},
        threshold, window=window)


def scores_from_medians(
    medians: Mapping[int, Sequence[float]],
    counts: Mapping[int, int],
    rank_medians: Mapping[int, float],
    threshold: float = DEFAULT_THRESHOLD,
    *,
    window: int = WINDOW,
    compact: bool = False,
) -> list[StragglerScore]:
    """``straggler_scores`` from each rank's window medians, step count and median step time.

    What a reader that streams keeps of a rank instead of holding every step twice. ``compact``:
    each score's ``windows`` is a ``WindowScores`` (the same windows, made when read) rather
    than a tuple of objects.
    """
    _check_window(window)
    fastest: dict[int, float] = {}
    for each_rank in medians.values():
        for index, median in enumerate(each_rank):
            fastest[index] = min(fastest.get(index, median), median)
    scores = []
    for rank in sorted(medians):
        relative, individual = array("d"), array("d")
        best = float("inf")
        for index, median in enumerate(medians[rank]):
            best = min(best, median)
            relative.append(_ratio(fastest[index], median))
            individual.append(_ratio(best, median))
        windows = WindowScores(counts[rank], window, medians[rank], relative, individual)
        slow = tuple(w for w in windows if w.relative < threshold or w.individual < threshold)
        scores.append(StragglerScore(
            rank, rank_medians[rank], min(relative), min(individual), bool(slow),
            windows if compact else tuple(windows), slow,
        ))
    return scores


class WindowScores(Sequence[WindowScore]):
    """A rank's window scores as three arrays, each ``WindowScore`` made when asked for.

    A job of ten million steps has a million windows: as objects, a few hundred MB.
    """

    def __init__(self, count: int, window: int, medians: Sequence[float], relative: Sequence[float],
                 individual: Sequence[float]) -> None:
        self._count, self._window = count, window
        self._whole = count // window
        self._medians, self._relative, self._individual = medians, relative, individual

    def __len__(self) -> int:
        return len(self._medians)

    @overload
    def __getitem__(self, index: int) -> WindowScore: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[WindowScore]: ...

    def __getitem__(self, index: int | slice) -> WindowScore | Sequence[WindowScore]:
        if isinstance(index, slice):
            return tuple(self[position] for position in range(*index.indices(len(self))))
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        if index < self._whole:
            first, end = index * self._window, (index + 1) * self._window
        else:  # the last, part of a window
            first, end = self._whole * self._window, self._count
        return WindowScore(index, first, end - 1, self._medians[index], self._relative[index],
                           self._individual[index])
