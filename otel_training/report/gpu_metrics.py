"""The drain's GPU samples (clocks, power) for the report's GPU plot, from the metrics files beside the traces.

Where the data come from, and why both sources: each step span carries its lowest SM clock during the step
(``training.gpu.sm_clock.min_mhz``, in the trace files: beside every step by construction), but no power.
The drain's meter writes the sampled state as metrics (``metrics-r<rank>.drain.jsonl`` next to
``traces-r<rank>.jsonl`` with the file exporter: OTLP JSON metrics, one line per collection): the SM clock,
the power drawn and the enforced power limit at each collection (every ``metrics_interval_s``, not every
sample). The plot shows the steps' clocks, and the metrics' clocks and power where those files are there; a
job exported to a collector has none beside its traces, and its plot shows what the spans carry.

Bounded: only the plotted ranks' files are read (``plot_ranks``: the ranks a verdict names, then the
lowest-numbered, ``PLOT_RANKS`` in all), a line at a time, and each rank keeps at most ``MAX_POINTS``
collections (every n-th, n doubling as the file grows). A damaged line is a problem naming file and line,
and the rest of the file is still read, as for traces.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from array import array
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from otel_training import semconv as sc
from otel_training.report.job import JobReport
from otel_training.report.reader import MAX_PROBLEMS_PER_FILE, Problem, _line_problem, _lines, attributes

#: Ranks the GPU plot shows at most: those a verdict names first, then the lowest-numbered.
PLOT_RANKS = 8
#: Collections kept per rank (the plot is a few thousand pixels wide).
MAX_POINTS = 2048
#: Collections this long before the job's first span or after its last are another run's (a file appended to
#: by several runs): left out.
MARGIN_NS = 60 * 10**9
_FILE = re.compile(r"metrics-r(\d+)\.drain\.jsonl$")
_NAN = float("nan")
#: The metrics read, and the unit each is kept in: (name, scale to MHz or W).
_READ = {sc.METRIC_GPU_SM_CLOCK: 1e-6, sc.METRIC_GPU_POWER: 1.0, sc.METRIC_GPU_POWER_LIMIT: 1.0}


@dataclasses.dataclass
class GpuSeries:
    """One rank's GPU samples from its drain's metrics: SM clock (MHz) and power (W) at each collection kept."""

    times: array[int] = dataclasses.field(default_factory=lambda: array("q"))
    clocks: array[float] = dataclasses.field(default_factory=lambda: array("d"))
    power: array[float] = dataclasses.field(default_factory=lambda: array("d"))
    power_limit_w: float | None = None
    stride: int = 1
    seen: int = 0

    def add(self, time_ns: int, clock_mhz: float, power_w: float) -> None:
        self.seen += 1
        if (self.seen - 1) % self.stride:
            return
        self.times.append(time_ns)
        self.clocks.append(clock_mhz)
        self.power.append(power_w)
        if len(self.times) > MAX_POINTS:  # every other one goes, and from now on every 2n-th is kept
            for column in (self.times, self.clocks, self.power):
                column[:] = column[::2]  # type: ignore[assignment]  # a column's own slice: mypy cannot pair the int|float union
            self.stride *= 2

    @property
    def has_clocks(self) -> bool:
        return any(not math.isnan(value) for value in self.clocks)

    @property
    def has_power(self) -> bool:
        return any(not math.isnan(value) for value in self.power)


def plot_ranks(report: JobReport) -> list[int]:
    """The ranks the GPU plot shows: the named stragglers and hang culprits first, then the lowest-numbered."""
    named = list(report.straggler_ranks)
    for episodes in report.hang_episodes.values():
        for episode in episodes:
            named.extend(culprit.rank for culprit in episode.verdict.culprits)
            named.extend(episode.verdict.gpu)
    ranks = sorted({run.key.rank for run in report.goodput.runs} | set(report.rank_steps))
    ordered = list(dict.fromkeys([*named, *ranks]))
    return ordered[:PLOT_RANKS]


def metrics_files(trace_files: Iterable[Path], ranks: Iterable[int]) -> list[Path]:
    """The drain metrics files of ``ranks`` in the directories the trace files are in."""
    wanted = set(ranks)
    found: dict[Path, Path] = {}
    for directory in dict.fromkeys(path.parent for path in trace_files):
        try:
            candidates = sorted(directory.glob("metrics-r*.drain.jsonl"))
        except OSError:
            continue
        for path in candidates:
            match = _FILE.search(path.name)
            if match and int(match.group(1)) in wanted and path.is_file():
                found.setdefault(path.resolve(), path)
    return list(found.values())


def _points(request: dict[str, Any], ranks: set[int], job_id: str | None,
            rows: dict[int, dict[int, list[float]]], during: tuple[int, int]) -> None:
    """The GPU points of one OTLP metrics request into ``rows``: rank -> time -> [clock, power]."""
    for resource_metrics in request.get("resourceMetrics", ()):
        resource = attributes(resource_metrics.get("resource", {}).get("attributes"))
        rank = resource.get(sc.TRAINING_RANK, 0)
        if not isinstance(rank, int) or rank not in ranks or (
                job_id is not None and resource.get(sc.TRAINING_JOB_ID) != job_id):
            continue
        for scope_metrics in resource_metrics.get("scopeMetrics", ()):
            for metric in scope_metrics.get("metrics", ()):
                name = metric.get("name")
                if name not in _READ:
                    continue
                for point in (metric.get("gauge") or {}).get("dataPoints", ()):
                    value = point.get("asDouble", point.get("asInt"))
                    value = float(value) * _READ[name] if value is not None else _NAN
                    if name == sc.METRIC_GPU_POWER_LIMIT:
                        rows.setdefault(rank, {}).setdefault(-1, [_NAN, value])
                        continue
                    at = int(point["timeUnixNano"])
                    if not during[0] <= at <= during[1]:
                        continue
                    row = rows.setdefault(rank, {}).setdefault(at, [_NAN, _NAN])
                    row[0 if name == sc.METRIC_GPU_SM_CLOCK else 1] = value


def read_series(paths: Sequence[Path], ranks: Iterable[int], job_id: str | None = None,
                during: tuple[int, int] = (0, 2**63)) -> tuple[dict[int, GpuSeries], list[Problem]]:
    """Each of ``ranks``' GPU series from ``paths`` (OTLP JSON metrics lines), of the collections ``during``
    (first, last ns), and what could not be read."""
    wanted = set(ranks)
    series: dict[int, GpuSeries] = {}
    problems: list[Problem] = []
    for path in paths:
        file_problems: list[Problem] = []
        hidden = 0
        try:
            handle = path.open("rb")
        except OSError as error:
            problems.append(Problem(str(path), None, f"cannot open: {error.strerror or error}"))
            continue
        with handle:
            for number, (line, size) in enumerate(_lines(handle), start=1):
                message = None
                if line is None:
                    message = f"line of {size:,} bytes, too long to read; skipped"
                elif line.strip():
                    rows: dict[int, dict[int, list[float]]] = {}
                    try:
                        request = json.loads(line)
                        if not isinstance(request, dict) or "resourceMetrics" not in request:
                            message = "not OTLP JSON metrics (no resourceMetrics); skipped"
                        else:
                            _points(request, wanted, job_id, rows, during)
                    except Exception as error:  # noqa: BLE001 - a damaged line costs that line only
                        message = _line_problem(line, error).replace("OTLP span", "OTLP metrics")
                    if message is None:
                        for rank, by_time in rows.items():
                            rank_series = series.setdefault(rank, GpuSeries())
                            limit = by_time.pop(-1, None)
                            if limit is not None and not math.isnan(limit[1]):
                                rank_series.power_limit_w = limit[1]
                            for time_ns, (clock, power) in sorted(by_time.items()):
                                rank_series.add(time_ns, clock, power)
                if message is not None:
                    if len(file_problems) < MAX_PROBLEMS_PER_FILE:
                        file_problems.append(Problem(str(path), number, message))
                    else:
                        hidden += 1
        problems.extend(file_problems)
        if hidden:
            problems.append(Problem(str(path), None, f"{hidden} more unreadable line(s) not listed"))
    return series, problems


def add_gpu_series(report: JobReport, trace_files: Iterable[Path], job_id: str | None = None) -> None:
    """The plotted ranks' GPU series from the drain metrics files beside ``trace_files``, into ``report``
    (their problems into its problems); nothing where there are none."""
    ranks = plot_ranks(report)
    paths = metrics_files(trace_files, ranks)
    if not paths:
        return
    series, problems = read_series(paths, ranks, job_id, (report.start_ns - MARGIN_NS, report.end_ns + MARGIN_NS))
    report.gpu_series.update(series)
    report.problems.extend(problems)
