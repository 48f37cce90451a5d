"""Step-time statistics of millions of steps, exactly as ``otel_training.analysis.steps`` computes them.

The analysis functions take Python sequences and sort them: for a job's ten
million steps that is a list of ten million float objects (a few hundred MB)
and seconds of sorting. Here durations stay in ``array('d')`` (8 bytes a
step) and, where numpy is installed (the report extra brings it with
matplotlib), medians and percentiles come from ``numpy.partition``: the same
elements, the same IEEE arithmetic on them (the mean of the middle two, the
``fsum`` of the mean), so the figures are identical to the last bit; the
tests compare both. Without numpy the analysis functions themselves run.
"""

from __future__ import annotations

import itertools
import math
from array import array
from collections.abc import Sequence
from typing import Any

from otel_training.analysis import (
    StepStats,
    ideal_step_time,
    normal_threshold,
    step_stats,
)
from otel_training.analysis.steps import MAD_FACTOR, MIN_STEPS


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def _values(durations: array[float]) -> Any:
    return _numpy().frombuffer(durations, dtype="float64") if len(durations) else None


def _median(values: Any) -> float:
    """``statistics.median``: the middle value, or the mean of the middle two (partitions ``values`` in place)."""
    count = len(values)
    middle = count // 2
    if count % 2:
        values.partition(middle)
        return float(values[middle])
    values.partition((middle - 1, middle))
    return (float(values[middle - 1]) + float(values[middle])) / 2


def _fmean(values: Any) -> float:
    """``statistics.fmean``: the correctly rounded sum over the count (a memoryview: floats, no copy)."""
    return math.fsum(memoryview(values)) / len(values)


def job_figures(arrays: Sequence[array[float]], configured_ideal: float | None,
                ) -> tuple[float | None, float | None, StepStats | None]:
    """The job's normal threshold, ideal step time and step statistics, over every rank's steps.

    ``normal_threshold``, ``ideal_step_time`` and ``step_stats`` of the pooled durations, with
    one pooled copy, reordered and then turned into the deviations from the median in place.
    """
    numpy = _numpy()
    if numpy is None:
        pooled = list(itertools.chain.from_iterable(arrays))
        threshold = normal_threshold(pooled)
        ideal = ideal_step_time(pooled, configured_ideal)
        return threshold, ideal, step_stats(pooled, ideal, threshold)
    parts = [numpy.frombuffer(durations, dtype="float64") for durations in arrays if len(durations)]
    if not parts:
        return None, configured_ideal, None
    values = numpy.concatenate(parts)
    count = len(values)
    mean = _fmean(values)
    minimum, maximum = float(values.min()), float(values.max())
    median = _median(values)
    k = min(count - 1, int(0.9 * count))
    values.partition(k)
    p90 = float(values[k])
    threshold = None
    numpy.subtract(values, median, out=values)  # the pooled copy becomes the deviations: the ranks'
    numpy.abs(values, out=values)  # own arrays still hold the durations
    mad = _median(values)
    if count >= MIN_STEPS:
        threshold = median + MAD_FACTOR * mad
    del values
    ideal = configured_ideal
    if ideal is None and threshold is not None:
        normal = math.fsum(itertools.chain.from_iterable(memoryview(part[part <= threshold]) for part in parts))
        ideal = normal / sum(int(numpy.count_nonzero(part <= threshold)) for part in parts)
    abnormal = 0 if threshold is None else sum(int(numpy.count_nonzero(part > threshold)) for part in parts)
    return threshold, ideal, StepStats(count=count, mean=mean, median=median, p90=p90, minimum=minimum,
                                       maximum=maximum, ideal=ideal,
                                       mean_deviation=None if ideal is None else mean - ideal, abnormal=abnormal,
                                       mad=mad)


def median_of(durations: array[float]) -> float:
    numpy = _numpy()
    if numpy is None:
        import statistics

        return statistics.median(durations)
    return _median(numpy.array(_values(durations)))


def stats_of(durations: array[float], ideal: float | None, threshold: float | None) -> StepStats | None:
    """``step_stats`` of the durations."""
    numpy = _numpy()
    if numpy is None or not durations:
        return step_stats(list(durations), ideal, threshold)
    values = numpy.array(_values(durations))
    count = len(values)
    mean = _fmean(values)
    abnormal = 0 if threshold is None else int(numpy.count_nonzero(values > threshold))
    minimum, maximum = float(values.min()), float(values.max())
    median = _median(values)
    k = min(count - 1, int(0.9 * count))
    values.partition(k)
    p90 = float(values[k])
    numpy.subtract(values, median, out=values)
    numpy.abs(values, out=values)
    return StepStats(count=count, mean=mean, median=median, p90=p90, minimum=minimum,
                     maximum=maximum, ideal=ideal, mean_deviation=None if ideal is None else mean - ideal,
                     abnormal=abnormal, mad=_median(values))
