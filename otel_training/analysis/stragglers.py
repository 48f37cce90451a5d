"""Straggler scores per rank and report window, after NVIDIA resiliency-ext's two views, judged against peers.

A rank's steps, in the order they ran, are cut into report windows of ``window``
consecutive steps, and each window is scored twice:

* relative: the median of the *other* ranks' median step times in that window
  over this rank's (1.0 when it is no slower than its peers; 0.5 means it takes
  twice as long). In synchronous data parallelism one slow rank slows everyone,
  so this names the culprit. Ranks of such a job take the same steps, so the
  k-th window of every rank covers the same training steps.
* individual: this rank's best window median so far over this window's median,
  which catches a rank that got slower than it was (thermal throttling, a noisy
  neighbour). "So far", as NVRx's "rank historical min", so that a job that
  speeds up after warm-up is not named for its warm-up, and so the live gauge
  (which cannot see the future) gives the figure the report gives.

Scores are in (0, 1]. A window below the threshold on either view is *slow* for
that rank only when the difference is larger than the noise of the two medians
compared (three standard errors, from each window's median absolute deviation:
a median of n steps varies by about 1.86 MAD / sqrt(n)). A rank is *named* a
straggler (issue 28) only for a slow window that is its own:

* slow on the relative view (it is slower than its peers in the same window); or
* slow on the individual view while fewer than half of the ranks slowed down in
  that window: when most ranks slow down together, the job slowed (the machine,
  a checkpoint, an evaluation, the teardown), and the window is a *job-wide*
  slow window (``shared``), reported as such, naming no one;

and only when those windows cost it at least ``MIN_EXCESS_S`` (each window's
median excess over its reference, times its steps): a few slow steps of a fast
loop on a busy machine are noise, a rank slow for a stretch of the run is not.

A one-rank job has no peers: it is never named, and its slow windows are
job-wide. A post-mortem asks who was slow at any time, so any named window
names the rank (a whole-run median hid a rank slow for the last third of a run).

Where this differs from NVRx: NVRx's relative score compares a rank with the
fastest rank and its individual score with the rank's own best, and reports
both for every rank. Here the relative reference is the peers' median (the
fastest of many ranks is the luckiest, so the fastest would make noise look
like a straggler in large jobs), a difference must clear the noise of the
windows compared, and a slowdown most ranks share names no one: on a busy
machine or around a checkpoint every rank slows at once.

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
import math
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
    #: The windows that name it: slow on the relative view, or on the individual view and not shared, in order.
    slow_windows: tuple[WindowScore, ...] = ()
    #: Its windows slow on the individual view that most ranks shared (or a one-rank job's): job-wide, not its own.
    shared_windows: tuple[WindowScore, ...] = ()

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


def window_mads(durations: Sequence[float], window: int = WINDOW) -> list[float]:
    """The median absolute deviation of each report window's step times: the noise a window's median has."""
    _check_window(window)
    result = []
    for first, end in _windows(len(durations), window):
        part = durations[first:end]
        median = statistics.median(part)
        result.append(statistics.median(abs(value - median) for value in part))
    return result


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
        threshold, window=window, mads={rank: window_mads(step_durations[rank], window) for rank in ranks})


#: Standard errors a difference of two window medians must exceed to be more than noise.
NOISE_SE = 3.0
#: Seconds a rank's own slow windows must have cost (their median's excess, times their steps) to name it: a
#: few slow steps of a 10 ms loop on a busy machine are no straggler; a rank 1.5x slow for 100 steps of 20 ms is.
MIN_EXCESS_S = 0.5
#: A median of n samples varies by about this many MADs over sqrt(n) (1.253 sigma / sqrt(n), sigma = 1.4826 MAD).
_SE_PER_MAD = 1.253 * 1.4826


def _beyond_noise(slower: float, faster: float, mad_slower: float, mad_faster: float, steps: int) -> bool:
    """Whether ``slower - faster`` (two window medians of ``steps`` steps) is more than their noise."""
    error = _SE_PER_MAD * math.hypot(mad_slower, mad_faster) / math.sqrt(max(1, steps))
    return slower - faster > NOISE_SE * error


def scores_from_medians(
    medians: Mapping[int, Sequence[float]],
    counts: Mapping[int, int],
    rank_medians: Mapping[int, float],
    threshold: float = DEFAULT_THRESHOLD,
    *,
    window: int = WINDOW,
    compact: bool = False,
    mads: Mapping[int, Sequence[float]] | None = None,
    min_excess_s: float = MIN_EXCESS_S,
) -> list[StragglerScore]:
    """``straggler_scores`` from each rank's window medians, step count and median step time.

    What a reader that streams keeps of a rank instead of holding every step twice. ``compact``:
    each score's ``windows`` is a ``WindowScores`` (the same windows, made when read) rather
    than a tuple of objects. ``mads``: each window's median absolute deviation, for the noise
    test (without them every difference counts, as before the test). ``min_excess_s``: what a
    rank's own slow windows must have cost to name it.
    """
    _check_window(window)
    ranks = sorted(medians)
    by_index: dict[int, list[tuple[float, float, int]]] = {}  # index -> (median, mad, rank) of every rank
    for rank in ranks:
        for index, median in enumerate(medians[rank]):
            mad = mads[rank][index] if mads is not None else 0.0
            by_index.setdefault(index, []).append((median, mad, rank))
    computed = {}
    for rank in ranks:
        relative, individual = array("d"), array("d")
        slow_relative, slow_individual, excess = [], [], []
        best, best_mad = float("inf"), 0.0
        for index, median in enumerate(medians[rank]):
            mad = mads[rank][index] if mads is not None else 0.0
            steps = _steps_in(index, counts[rank], window)
            if median < best:
                best, best_mad = median, mad
            others = [(other, other_mad) for other, other_mad, number in by_index[index] if number != rank]
            if others:
                reference = statistics.median(other for other, _ in others)
                reference_mad = statistics.median(other_mad for _, other_mad in others)
                relative.append(_ratio(reference, median))
            else:
                reference, reference_mad = median, mad
                relative.append(1.0)
            individual.append(_ratio(best, median))
            slow_relative.append(bool(others) and relative[-1] < threshold
                                 and _beyond_noise(median, reference, mad, reference_mad, steps))
            slow_individual.append(individual[-1] < threshold and _beyond_noise(median, best, mad, best_mad, steps))
            excess.append(steps * max(median - reference if slow_relative[-1] else 0.0,
                                      median - best if slow_individual[-1] else 0.0))
        computed[rank] = (relative, individual, slow_relative, slow_individual, excess)
    # A window most ranks slowed down in, on their own history, is the job's, not a rank's.
    shared: dict[int, bool] = {}
    for index, present in by_index.items():
        slowed = sum(1 for _, _, rank in present if computed[rank][3][index])
        shared[index] = len(ranks) < 2 or 2 * slowed >= len(present)
    scores = []
    for rank in ranks:
        relative, individual, slow_relative, slow_individual, excess = computed[rank]
        windows = WindowScores(counts[rank], window, medians[rank], relative, individual)
        own = [index for index in range(len(windows))
               if slow_relative[index] or (slow_individual[index] and not shared[index])]
        # Enough evidence: the rank's own slow windows cost at least MIN_EXCESS_S, and it has peers.
        named = tuple(windows[index] for index in own) if len(ranks) > 1 and sum(
            excess[index] for index in own) >= min_excess_s else ()
        job_wide = tuple(windows[index] for index in range(len(windows))
                         if slow_individual[index] and shared[index] and not slow_relative[index])
        scores.append(StragglerScore(
            rank, rank_medians[rank], min(relative), min(individual), bool(named),
            windows if compact else tuple(windows), named, job_wide,
        ))
    return scores


def _steps_in(index: int, count: int, window: int) -> int:
    """Steps in window ``index`` of a rank with ``count`` steps (the last may be part of one)."""
    first, end = _windows(count, window)[index] if index >= count // window else (index * window,
                                                                                    (index + 1) * window)
    return end - first


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
