"""The GPU's state in the verdicts and the report (issue 31, docs/gpu-state.md#in-the-verdicts).

The jobs are written as the drain writes them with NVML sampled (``gpu_job.py``: the stand-in NVML, the
drain's step join and alert context, the real SDK and file exporter), then read by ``otel-training report``'s
code, streamed and in memory. What it proves: a rank whose GPU is throttled, and one with an XID, are named
with their GPU's difference in the straggler verdict and in the hang verdict (end state and episodes), in the
summary, the JSON and the HTML page; a job whose GPUs did not differ, or without any GPU state, gets no such
line and no GPU plot; the drain's metrics files beside the traces feed the plot, damaged lines named.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from fake_nvml import T0, S
from gpu_job import Rank, collective

from otel_training import semconv as sc
from otel_training.report import build_report, read_paths, render_html, render_summary
from otel_training.report.files import report_files
from otel_training.report.gpu_metrics import MAX_POINTS, GpuSeries, metrics_files, plot_ranks, read_series
from otel_training.report.machine import report_json

THROTTLED = "SM clock 1.41 GHz vs 1.98 GHz median, power cap"


def _at(ns: int) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ns // S)) + " UTC"


def _straggler_job(directory: Path, cause: str | None, ranks: int = 4, steps: int = 40, t0: int = T0) -> list[Rank]:
    """Rank 2 is 1.5x slower from step 20 on; ``cause``: its GPU throttled from then, an XID then, or nothing."""
    job = [Rank(directory, rank, t0=t0) for rank in range(ranks)]
    for rank in job:
        for number in range(steps):
            if rank.rank == 2 and number == steps // 2:
                if cause == "throttle":
                    rank.throttle()
                elif cause == "xid":
                    rank.gpu.xids.append(79)
            rank.step(number, 1.5 if rank.rank == 2 and number >= steps // 2 else 1.0)
    return job


def _both(directory: Path) -> list:
    """The report streamed (the CLI's path) and in memory: every figure below must be the same in both."""
    return [report_files([directory], workers=1, progress=False), build_report(read_paths([directory]).records)]


@pytest.mark.parametrize("cause", ["throttle", "xid"])
def test_a_straggler_is_named_with_what_its_gpu_did(tmp_path: Path, cause: str) -> None:
    _straggler_job(tmp_path, cause)
    # Steps of 1 s from T0, samples every 0.5 s: the XID is sampled at step 20's first sample after its start.
    expected = THROTTLED if cause == "throttle" else f"XID 79 at {_at(T0 + 20 * S + S // 2)}"
    for report in _both(tmp_path):
        assert report.straggler_ranks == [2]
        lines = report.straggler_lines()
        assert lines[0].startswith("rank 2: relative 0.67 in window 3 of 4 (steps 20-29")
        assert lines[1] == f"rank 2 GPU: {expected}"
        assert f"  rank 2 GPU: {expected}" in render_summary(report).splitlines()
        assert report_json(report)["stragglers"]["gpu"] == [{"rank": 2, "window": 3, "explanation": expected}]
        assert not report.problems


def test_a_straggler_whose_gpu_did_not_differ_gets_no_gpu_line(tmp_path: Path) -> None:
    _straggler_job(tmp_path, None)
    for report in _both(tmp_path):
        assert report.straggler_ranks == [2]
        assert len(report.straggler_lines()) == 1 and "GPU" not in render_summary(report)
        assert report_json(report)["stragglers"]["gpu"] == []


def test_a_gpu_throttled_for_a_few_steps_of_a_window_does_not_explain_it(tmp_path: Path) -> None:
    """Throttled for fewer than half of the window's steps (and clocks back up): not the window's state."""
    job = [Rank(tmp_path, rank) for rank in range(4)]
    for rank in job:
        for number in range(40):
            if rank.rank == 2 and number == 20:
                rank.throttle()
            if rank.rank == 2 and number == 22:
                rank.throttle(1980, 0)
            rank.step(number, 1.5 if rank.rank == 2 and number >= 20 else 1.0)
    report = report_files([tmp_path], workers=1, progress=False)
    assert report.straggler_ranks == [2] and len(report.straggler_lines()) == 1


def _hang_job(directory: Path, cause: str) -> list[Rank]:
    """Ten steps, then ranks 0, 1 and 3 stuck inside allreduce #14 while rank 2 never entered it.

    ``cause``: rank 2's GPU throttled (its alert says so), an XID before its alert (the alert carries the
    latest error), or an XID in its last step, after which it says nothing (no alert: the step's event)."""
    job = [Rank(directory, rank) for rank in range(4)]
    for rank in job:
        for number in range(10):
            if rank.rank == 2 and number == 9 and cause == "xid-then-silent":
                rank.gpu.xids.append(79)
            rank.step(number, 1.0, **collective(13, 13, "allgather", number))
    culprit = job[2]
    if cause == "throttle":
        culprit.throttle()
    elif cause == "xid":
        culprit.gpu.xids.append(79)
    for rank in job:
        if rank.rank == 2:
            if cause != "xid-then-silent":
                rank.stuck(10, 5.0, **collective(13, 13, "allgather", 9))
        else:
            rank.stuck(10, 5.0, **collective(14, 13, "allreduce", 10))
    return job


@pytest.mark.parametrize("cause, reason", [("throttle", sc.HANG_REASON_NOT_ENTERED),
                                           ("xid", sc.HANG_REASON_NOT_ENTERED),
                                           ("xid-then-silent", "silent_during_hang")])
def test_a_hang_culprit_is_named_with_what_its_gpu_did(tmp_path: Path, cause: str, reason: str) -> None:
    _hang_job(tmp_path, cause)
    # The XID: sampled at 10.5 s (the culprit's first sample after its last step), or at 9.5 s (in step 9).
    expected = {"throttle": THROTTLED, "xid": f"XID 79 at {_at(T0 + 10 * S + S // 2)}",
                "xid-then-silent": f"XID 79 at {_at(T0 + 9 * S + S // 2)}"}[cause]
    for report in _both(tmp_path):
        (episode,) = [episode for episodes in report.hang_episodes.values() for episode in episodes]
        assert [(culprit.rank, culprit.reason) for culprit in episode.verdict.culprits] == [(2, reason)]
        assert episode.verdict.gpu == {2: expected}
        assert f"    rank 2 GPU: {expected}" in report.hang_episode_lines
        # The end state: rank 2 has not entered allreduce #14 (its last step's, or its alert's, view).
        assert report.hang[0].startswith("Hang verdict: culprit rank 2 (not_entered")
        assert f"  rank 2 GPU: {expected}" in report.hang
        document = report_json(report)
        assert document["hang_episodes"][0]["gpu"] == {"2": expected}
        assert f"  rank 2 GPU: {expected}" in document["hang"]
        assert not any("rank 0 GPU" in line or "rank 1 GPU" in line for line in report.hang + report.hang_episode_lines)


def test_an_old_xid_does_not_explain_a_later_hang(tmp_path: Path) -> None:
    """The alert carries the latest error the sampler saw, however old: older than a minute before the
    stuck step began, it explains nothing."""
    job = [Rank(tmp_path, rank) for rank in range(4)]
    job[2].gpu.xids.append(79)
    for rank in job:
        for number in range(80):
            rank.step(number, 1.0, **collective(13, 13, "allgather", number))
    for rank in job:
        rank.stuck(80, 5.0, **(collective(13, 13, "allgather", 79) if rank.rank == 2
                               else collective(14, 13, "allreduce", 80)))
    report = report_files([tmp_path], workers=1, progress=False)
    (episode,) = report.hang_episodes[("gpu-job", "run-1")]
    assert [culprit.rank for culprit in episode.verdict.culprits] == [2] and episode.verdict.gpu == {}
    assert not any("GPU" in line for line in report.hang + report.hang_episode_lines)


def test_the_html_page_has_the_gpu_plot_and_the_lines(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")  # the report extra; scripts/test installs it
    _straggler_job(tmp_path, "throttle")
    page = render_html(report_files([tmp_path], workers=1, progress=False))
    figure = page[page.index('<figure class="plot" id="gpu">'):]
    figure = figure[:figure.index("</figure>")]
    assert "<svg" in figure and "rank 2: SM clock 1.41 GHz vs 1.98 GHz median, power cap" in figure
    assert f"rank 2 GPU: {THROTTLED}" in page


def test_a_job_without_gpu_state_has_no_gpu_plot_and_no_error(tmp_path: Path) -> None:
    job = [Rank(tmp_path, rank) for rank in range(2)]
    for rank in job:  # the drain without a sampler: no join
        for number in range(20):
            span = rank.tracer.start_span(sc.SPAN_STEP, start_time=T0 + number * S, attributes={sc.STEP: number})
            span.end(end_time=T0 + (number + 1) * S)
    (tmp_path / "metrics-r0.jsonl").write_text('{"resourceMetrics": []}\n')  # the training process's: not read
    report = report_files([tmp_path], workers=1, progress=False)
    assert report.rank_gpu == {} and report.gpu_series == {} and not report.problems
    assert "GPU" not in render_summary(report)
    if pytest.importorskip("matplotlib"):
        assert 'id="gpu"' not in render_html(report)


def test_the_drain_metrics_beside_the_traces_feed_the_plot(tmp_path: Path) -> None:
    # The SDK stamps a collection with the time it runs: the job ran until now (30 s of steps for rank 2).
    t0 = time.time_ns() - 30 * S
    job = _straggler_job(tmp_path, "throttle", steps=24, t0=t0)
    path = job[2].write_metrics()  # the real SDK and exporter: one collection
    report = report_files([tmp_path], workers=1, progress=False)
    series = report.gpu_series[2]
    assert list(series.clocks) == [1410.0] and list(series.power) == [500.0] and series.power_limit_w == 700.0
    assert set(report.gpu_series) == {2} and not report.problems
    # Collections over time, with damaged lines between them: each named by file and line, the rest read.
    line = json.loads(path.read_text().splitlines()[0])
    lines = []
    for index in range(3):
        for scope in line["resourceMetrics"][0]["scopeMetrics"]:
            for metric in scope["metrics"]:
                for point in (metric.get("gauge") or {}).get("dataPoints", ()):
                    point["timeUnixNano"] = str(t0 + index * 10 * S)
                    if metric["name"] == sc.METRIC_GPU_SM_CLOCK:
                        point["asDouble"] = (1980 - 100 * index) * 1e6
        lines.append(json.dumps(line))
    lines.insert(1, lines[0][:100])  # cut short by a crash
    lines.insert(3, '{"resourceSpans": []}')  # traces in a metrics file
    lines.append(json.dumps(line).replace(str(t0 + 20 * S), str(t0 - 3600 * S)))  # an hour before the job: another's
    path.write_text("\n".join(lines) + "\n")
    (tmp_path / "metrics-r9.drain.jsonl").write_text("not json\n")  # a rank not plotted: not read
    report = report_files([tmp_path], workers=1, progress=False)
    series = report.gpu_series[2]
    assert list(series.clocks) == [1980.0, 1880.0, 1780.0]
    assert list(series.times) == [t0, t0 + 10 * S, t0 + 20 * S]
    assert [(Path(problem.path).name, problem.line, problem.message.split(" (")[0]) for problem in report.problems] == [
        ("metrics-r2.drain.jsonl", 2, "truncated JSON line"),
        ("metrics-r2.drain.jsonl", 4, "not OTLP JSON metrics")]


def test_the_plotted_ranks_are_the_named_ones_first_and_bounded(tmp_path: Path) -> None:
    job = _straggler_job(tmp_path, "throttle", ranks=10, steps=24)
    report = report_files([tmp_path], workers=1, progress=False)
    assert plot_ranks(report) == [2, 0, 1, 3, 4, 5, 6, 7]
    for rank in job:
        (tmp_path / f"metrics-r{rank.rank}.drain.jsonl").write_text("")
    assert sorted(path.name for path in metrics_files([tmp_path / "traces-r0.jsonl"], plot_ranks(report))) == [
        f"metrics-r{rank}.drain.jsonl" for rank in (0, 1, 2, 3, 4, 5, 6, 7)]


def test_a_series_keeps_at_most_max_points_spread_over_the_run() -> None:
    series = GpuSeries()
    for index in range(5 * MAX_POINTS):
        series.add(index, float(index), math.nan)
    assert MAX_POINTS // 2 <= len(series.times) <= MAX_POINTS
    assert series.times[0] == 0 and series.times[-1] >= 4 * MAX_POINTS  # the whole run, not its start
    assert all(b - a == series.stride for a, b in zip(series.times, series.times[1:]))
    assert series.has_clocks and not series.has_power


def test_reading_a_missing_metrics_file_is_a_problem_not_an_error(tmp_path: Path) -> None:
    series, problems = read_series([tmp_path / "metrics-r0.drain.jsonl"], [0])
    assert series == {} and len(problems) == 1 and "cannot open" in problems[0].message


def test_steps_read_out_of_order_are_folded_into_the_windows_they_ran_in() -> None:
    from otel_training.analysis.gpu import KNOWN
    from otel_training.analysis.stragglers import window_bounds
    from otel_training.report.gpu_steps import GpuSteps, rank_gpu

    gpu = GpuSteps()
    for index in range(25):  # step i: lowest clock 1000 + i MHz, throttled (power cap) for the first ten read
        gpu.add(index, (1000.0 + index, KNOWN | (0x1 if index < 10 else 0)))
    bounds = window_bounds(25, 10)  # two whole windows and a last one of five
    in_order = rank_gpu(gpu, None, bounds, [3, 7, 40])
    assert list(in_order.window_clocks) == [1004.5, 1014.5, 1022.0]
    assert list(in_order.window_share) == [1.0, 0.0, 0.0]
    assert in_order.view(0).reasons == ("power_cap",)  # type: ignore[union-attr]
    assert in_order.view(1).throttled is False  # type: ignore[union-attr]
    assert list(in_order.sample_clocks)[:2] == [1003.0, 1007.0] and math.isnan(in_order.sample_clocks[2])
    # Read last-run first: position p (the order they ran) is index 24 - p.
    reversed_order = rank_gpu(gpu, list(reversed(range(25))), bounds, [])
    assert list(reversed_order.window_clocks) == [1019.5, 1009.5, 1002.0]
    assert list(reversed_order.window_share) == [0.0, 0.5, 1.0]
    assert reversed_order.view(1).throttled is True and reversed_order.view(3) is None  # type: ignore[union-attr]
    # A rest shorter than half a window belongs to no window: its steps are left out.
    short = rank_gpu(gpu, None, window_bounds(24, 10), [])
    assert len(short.window_clocks) == 2


def test_a_steps_gpu_error_read_from_jaeger_keeps_its_xid() -> None:
    """Jaeger's logs are the span events: the spool writes them as OTLP events, read as the file exporter's."""
    from otel_training.report.jaeger import _rows
    from otel_training.report.reader import gpu_errors

    at_us = T0 // 1000 + 1_500_000
    trace = {"processes": {"p1": {"serviceName": "train", "tags": [{"key": sc.TRAINING_RANK, "type": "int64",
                                                                     "value": 2}]}},
             "spans": [{"traceID": "ab" * 16, "spanID": "cd" * 8, "operationName": sc.SPAN_STEP, "processID": "p1",
                        "startTime": T0 // 1000, "duration": 2_000_000, "tags": [],
                        "logs": [{"timestamp": at_us, "fields": [
                            {"key": "event", "type": "string", "value": sc.EVENT_GPU_ERROR},
                            {"key": sc.HW_ERROR_TYPE, "type": "string", "value": "xid"},
                            {"key": sc.GPU_XID, "type": "int64", "value": 79}]}, "not a log"]}]}
    ((_, _, text),) = list(_rows([trace], {}))
    assert gpu_errors(json.loads(text)) == [(at_us * 1000, "xid", 79)]
