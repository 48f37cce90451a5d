"""The HTML report's GPU plot: per rank, its step times beside its GPU's SM clock (and power where known).

One row per plotted rank (``gpu_metrics.plot_ranks``: those a verdict names first): on the left, the rank's
sampled step times (the step-time plot's sample) with, on a second axis, each sampled step's lowest SM clock
(from the step spans) and the drain's SM clock at each metrics collection; on the right, where the metrics
files gave it, the power drawn and the enforced limit. A job without GPU state has no such plot.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from otel_training.report.gpu_metrics import GpuSeries, plot_ranks
from otel_training.report.job import JobReport

#: Marks above which a row's marks are rasterized inside the SVG.
_RASTERIZE_ABOVE = 2000


def gpu_ranks(report: JobReport) -> list[int]:
    """The plotted ranks that have any GPU data (none: no plot)."""
    ranks = []
    for rank in plot_ranks(report):
        gpu, series = report.rank_gpu.get(rank), report.gpu_series.get(rank)
        if (gpu is not None and gpu.has_clocks) or (series is not None and (series.has_clocks or series.has_power)):
            ranks.append(rank)
    return ranks


def _explanations(report: JobReport) -> dict[int, str]:
    """Each rank's GPU explanation from the verdicts: the straggler one, else a hang's."""
    found = {rank: text for rank, (_, text) in report.straggler_gpu().items()}
    for episodes in report.hang_episodes.values():
        for episode in episodes:
            for rank, text in episode.verdict.gpu.items():
                found.setdefault(rank, text)
    return found


def _seconds(report: JobReport, times: Sequence[int]) -> list[float]:
    return [(time_ns - report.start_ns) / 1e9 for time_ns in times]


def plot_gpu(report: JobReport, plt: Any, svg: Callable[[Any], str]) -> str:
    """The plot as inline SVG, drawn with pyplot ``plt`` and made text by ``svg`` (``html.py``'s); call only
    when ``gpu_ranks`` is not empty."""
    ranks = gpu_ranks(report)
    power = any(report.gpu_series[rank].has_power for rank in ranks if rank in report.gpu_series)
    figure, grid = plt.subplots(len(ranks), 2 if power else 1, figsize=(11, 0.6 + 1.9 * len(ranks)), squeeze=False,
                                sharex=True, gridspec_kw={"width_ratios": [3, 1], "wspace": 0.4} if power else None)
    explanations = _explanations(report)
    stats = report.job_steps
    cap = 3 * stats.p90 * 1000 if stats is not None and stats.maximum > 3 * stats.p90 else None
    # One scale for every row, so that the rows compare: the steps from 0, the clocks around all of them.
    highest = max((step.duration_s * 1000 for step in report.step_sample if step.rank in ranks), default=1.0)
    top = min(cap, 1.1 * highest) if cap is not None else 1.1 * highest
    every = [clock for rank in ranks for clock in _clocks(report, rank)]
    low, high = (min(every), max(every)) if every else (0.0, 1.0)
    for row, rank in enumerate(ranks):
        axes = grid[row][0]
        steps = [step for step in report.step_sample if step.rank == rank]
        rasterize = len(steps) > _RASTERIZE_ABOVE
        axes.plot(_seconds(report, [step.start_ns for step in steps]), [step.duration_s * 1000 for step in steps],
                  ".", color="#7f7f7f", markersize=3, rasterized=rasterize, label="step time")
        axes.set_ylim(0, top)
        axes.set_ylabel("step (ms)", fontsize="small")
        clocks = axes.twinx()
        gpu = report.rank_gpu.get(rank)
        if gpu is not None and gpu.has_clocks:
            shown = [(step.start_ns, clock) for step, clock in zip(steps, gpu.sample_clocks) if not math.isnan(clock)]
            clocks.plot(_seconds(report, [at for at, _ in shown]), [clock for _, clock in shown], "x",
                        color="#ff7f0e", markersize=3, rasterized=rasterize, label="lowest SM clock in the step")
        series: GpuSeries | None = report.gpu_series.get(rank)
        if series is not None and series.has_clocks:
            clocks.plot(_seconds(report, series.times), list(series.clocks), "-", color="#d62728", linewidth=1,
                        label="SM clock (drain's metrics)")
        clocks.set_ylabel("SM clock (MHz)", fontsize="small", color="#d62728")
        clocks.set_ylim(low - 0.1 * (high - low) - 10, high + 0.1 * (high - low) + 10)
        text = explanations.get(rank)
        # Plain text: no mathtext from "$" (the explanations hold only names this package knows; to be sure).
        axes.set_title(f"rank {rank}" + (f": {text}" if text else ""), fontsize="small", loc="left", parse_math=False)
        if row == 0:
            handles = axes.get_legend_handles_labels()[0] + clocks.get_legend_handles_labels()[0]
            labels = axes.get_legend_handles_labels()[1] + clocks.get_legend_handles_labels()[1]
            figure.legend(handles, labels, loc="upper left", fontsize="x-small", ncol=3, frameon=False)
        if power:
            _power(grid[row][1], report, series)
    for column in grid[-1]:
        column.set_xlabel("time since job start (s)")
    figure.suptitle("GPU beside the steps, per rank (named ranks first)", fontsize="medium")
    return svg(figure)


def _clocks(report: JobReport, rank: int) -> list[float]:
    gpu, series = report.rank_gpu.get(rank), report.gpu_series.get(rank)
    values = list(gpu.sample_clocks) if gpu is not None else []
    values.extend(series.clocks if series is not None else ())
    return [value for value in values if not math.isnan(value)]


def _power(axes: Any, report: JobReport, series: GpuSeries | None) -> None:
    if series is None or not series.has_power:
        axes.set_yticks([])
        axes.text(0.5, 0.5, "no power samples\n(no drain metrics file)", ha="center", va="center",
                  transform=axes.transAxes, fontsize="small", color="#7f7f7f")
        return
    axes.plot(_seconds(report, series.times), list(series.power), ".-", color="#1f77b4", linewidth=1, markersize=3)
    if series.power_limit_w is not None:
        axes.axhline(series.power_limit_w, color="black", linestyle="--", linewidth=1)
    axes.set_ylabel("power (W; dashed: limit)", fontsize="small")
