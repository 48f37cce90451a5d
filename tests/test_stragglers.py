"""Windowed straggler scores (issue 9 item 6): a rank that turns slow late is named, with its window.

Step durations are built by hand with a seeded jitter, so every figure is
reproducible; the report-level cases use span records and OTLP files with
explicit timestamps.
"""

from __future__ import annotations

import random
from pathlib import Path

import goodput_traces as crafted
import pytest

from otel_training import semconv as sc
from otel_training.analysis import LiveIndividual, RunKey, SpanRecord, current_individual, straggler_scores
from otel_training.analysis.stragglers import DEFAULT_THRESHOLD, WINDOW
from otel_training.cli.main import main
from otel_training.report import build_report, render_summary


def _jittered(durations: list[float], seed: int, spread: float = 0.03) -> list[float]:
    rng = random.Random(seed)
    return [duration * (1 + rng.uniform(-spread, spread)) for duration in durations]


def _late(slow_steps: int, total: int = 60, factor: float = 1.5, seed: int = 1) -> list[float]:
    return _jittered([1.0] * (total - slow_steps) + [factor] * slow_steps, seed)


@pytest.mark.parametrize("slow_steps", [20, 30])
@pytest.mark.parametrize("window", [None, *range(10, 21)])
def test_a_one_rank_job_is_never_named_and_its_slow_stretch_is_a_job_wide_slow_window(
        slow_steps: int, window: int | None) -> None:
    # A one-rank job has no peers (issue 28): the slowdown is the job's. Its slow windows are found on the
    # individual view (the whole-run scores were 0.975 and 0.794 and would have hidden them) and kept as
    # job-wide windows, in the slow stretch, not before it.
    durations = _late(slow_steps)
    (score,) = straggler_scores({0: durations}) if window is None else straggler_scores({0: durations}, window=window)
    assert score.relative == 1.0 and not score.straggler and score.slow_windows == ()
    assert score.individual == pytest.approx(1 / 1.5, abs=0.05)
    worst = score.worst_window
    assert worst is not None and worst.view == "individual"
    assert worst.first >= 60 - slow_steps - (window or WINDOW) // 2
    assert score.shared_windows and all(w.last >= 60 - slow_steps for w in score.shared_windows)


@pytest.mark.parametrize("slow_steps", [20, 30])
def test_a_rank_slow_for_the_last_steps_is_named_among_steady_ranks(slow_steps: int) -> None:
    durations = {rank: _jittered([1.0] * 60, seed=rank) for rank in range(4)}
    durations[2] = _late(slow_steps, seed=2)
    scores = straggler_scores(durations)
    assert [score.rank for score in scores if score.straggler] == [2]
    late = scores[2]
    assert late.relative == pytest.approx(1 / 1.5, abs=0.05)
    assert late.individual == pytest.approx(1 / 1.5, abs=0.05)
    assert [(w.first, w.last) for w in late.slow_windows] == [
        (first, first + WINDOW - 1) for first in range(60 - slow_steps, 60, WINDOW)]


def test_a_uniformly_slow_rank_is_named_by_the_relative_score_in_every_window() -> None:
    durations = {rank: _jittered([1.0] * 60, seed=rank) for rank in range(4)}
    durations[1] = _jittered([1.5] * 60, seed=11)
    scores = straggler_scores(durations)
    assert [score.rank for score in scores if score.straggler] == [1]
    slow = scores[1]
    assert slow.relative == pytest.approx(1 / 1.5, abs=0.05)
    assert slow.individual > 0.9  # it is as slow as it always was
    assert len(slow.slow_windows) == len(slow.windows) == 6
    assert {window.view for window in slow.slow_windows} == {"relative"}


def test_steady_ranks_with_jitter_and_outliers_are_not_named() -> None:
    durations = {rank: _jittered([1.0] * 200, seed=rank, spread=0.15) for rank in range(8)}
    durations[0][0] = 8.0  # first-step compilation
    durations[3][57] = 30.0  # one stuck step
    durations[5][100:104] = [2.0] * 4  # a short stall: fewer than half of a window
    scores = straggler_scores(durations)
    assert [score.rank for score in scores if score.straggler] == []
    assert min(score.relative for score in scores) > DEFAULT_THRESHOLD
    assert min(score.individual for score in scores) > DEFAULT_THRESHOLD


def test_the_window_length_decides_how_short_a_slow_stretch_is_named() -> None:
    # Eight slow steps (20-27): the majority of a window of 10, a minority of a window of 20.
    durations = _jittered([1.0] * 20 + [2.0] * 8 + [1.0] * 32, seed=3)
    (short,) = straggler_scores({0: durations}, window=10)
    (long,) = straggler_scores({0: durations}, window=20)
    assert [(w.first, w.last) for w in short.windows] == [(first, first + 9) for first in range(0, 60, 10)]
    assert [(w.first, w.last) for w in long.windows] == [(0, 19), (20, 39), (40, 59)]
    assert [(w.first, w.last) for w in short.shared_windows] == [(20, 29)]
    assert not long.shared_windows and not short.straggler and not long.straggler  # one rank: never named


def test_the_last_window_counts_from_half_a_window_and_a_short_run_is_one_window() -> None:
    (waits,) = straggler_scores({0: [1.0] * 60 + [3.0] * 4}, window=10)
    assert waits.windows[-1].last == 59 and not waits.shared_windows
    (counts,) = straggler_scores({0: [1.0] * 60 + [3.0] * 5}, window=10)
    assert (counts.windows[-1].first, counts.windows[-1].last) == (60, 64)
    assert [(w.first, w.last) for w in counts.shared_windows] == [(60, 64)]
    short = straggler_scores({0: [1.0] * 3, 1: [2.0] * 3}, window=10)
    assert [(w.first, w.last) for w in short[1].windows] == [(0, 2)]
    assert [score.rank for score in short if score.straggler] == [1]


@pytest.mark.parametrize("window", [0, -3, 2.5, True])
def test_a_window_that_is_not_a_positive_step_count_is_refused(window: object) -> None:
    with pytest.raises(ValueError, match="straggler window"):
        straggler_scores({0: [1.0] * 20}, window=window)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="straggler window"):
        current_individual([1.0] * 20, window=window)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="straggler window"):
        LiveIndividual(window=window)  # type: ignore[arg-type]


def test_the_live_individual_score_is_the_reports_latest_window_at_every_step() -> None:
    durations = _late(20)
    assert current_individual([]) is None
    seen = []
    for count in range(1, len(durations) + 1):
        live = current_individual(durations[:count])
        (score,) = straggler_scores({0: durations[:count]})
        assert live == score.windows[-1].individual
        seen.append(live)
    assert seen[:WINDOW] == [1.0] * WINDOW  # the first window is its own best
    # Steps 40-59 are slow: the gauge drops at the 45th step, when the window of steps 40-49 is half full.
    assert min(seen[:44]) > DEFAULT_THRESHOLD
    assert max(seen[44:]) < DEFAULT_THRESHOLD


@pytest.mark.parametrize("window", [1, 2, 7, 10, 16])
def test_the_live_tracker_gives_the_pure_functions_score_at_every_step(window: int) -> None:
    rng = random.Random(window)
    durations = [rng.choice([1.0, 1.0, 1.0, 1.3, 2.0]) * rng.uniform(0.9, 1.1) for _ in range(150)]
    live = LiveIndividual(window)
    scores = [live.add(duration) for duration in durations]
    assert scores == [current_individual(durations[:count], window) for count in range(1, len(durations) + 1)]
    assert min(score for score in scores if score is not None) < 1.0  # the series did move the score


T0 = 1_700_000_000 * 10**9


def _step_records(durations: dict[int, list[float]]) -> list[SpanRecord]:
    records = []
    for rank, steps in durations.items():
        run = RunKey(job_id="late", rank=rank, restart=0, run_id="late-0")
        start = T0
        for step, duration in enumerate(steps):
            end = start + round(duration * 1e9)
            records.append(SpanRecord(name=sc.SPAN_STEP, start_ns=start, end_ns=end, run=run,
                                      attributes={sc.STEP: 100 + step}, service="late"))
            start = end
    return records


def test_the_summary_names_the_late_straggler_and_its_window() -> None:
    # 40 steps of 1 s, then 20 of 1.5 s on rank 1: its slow window 4 (steps 140-149) starts at 40 s.
    report = build_report(_step_records({0: [1.0] * 60, 1: [1.0] * 40 + [1.5] * 20}))
    assert report.straggler_ranks == [1]
    summary = render_summary(report)
    assert "stragglers: rank 1\n" in summary
    assert ("rank 1: relative 0.67 in window 5 of 6 (steps 140-149, 40.0-55.0 s into the job); "
            "2 window(s) of 10 steps below 0.75") in summary


def test_the_summary_counts_a_rank_steps_when_spans_carry_no_step_number() -> None:
    records = _step_records({0: [1.0] * 30})
    for record in records:
        record.attributes.clear()
    records += _step_records({1: [1.0] * 20 + [2.0] * 10})
    for record in records[30:]:
        record.attributes.clear()
    summary = render_summary(build_report(records))
    assert "rank 1: relative 0.50 in window 3 of 3 (its steps #21-#30, 20.0-40.0 s into the job)" in summary


def test_a_window_across_a_restart_names_the_restart_of_each_end() -> None:
    # Rank 1 of the crafted job ran steps 0-12 before its crash and 12-21 after: its second window
    # (its 11th to 20th steps) is steps 10-12 of restart 0 then 12-18 of restart 1.
    report = build_report(crafted.records())
    (_, across) = report.stragglers[1].windows
    assert report.window_label(1, across) == "steps 10 (restart 0) to 18 (restart 1), 50.0-108.0 s into the job"


def test_the_html_report_shows_the_window(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from otel_training.report import render_html

    records = _step_records({0: [1.0] * 60, 1: [1.0] * 40 + [1.5] * 20})
    page = render_html(build_report(records), records)
    assert "<td>steps 140-149, 40.0-55.0 s into the job</td>" in page
    assert "<li>rank 1: relative 0.67 in window 5 of 6" in page


def _write_late_job(directory: Path) -> Path:
    # Rank 1 is slow for steps 20-27 only: a majority of a window of 10, a minority of one of 20.
    directory.mkdir()
    for rank, durations in ((0, [2.0] * 60), (1, [2.0] * 20 + [4.0] * 8 + [2.0] * 32)):
        spans, start = [], 0.0
        for step, duration in enumerate(durations):
            spans.append({"name": sc.SPAN_STEP, "start": start, "end": start + duration, "error": False,
                          "attributes": {sc.STEP: step}, "span_id": format(rank * 1000 + step + 1, "016x")})
            start += duration
        (directory / f"traces-r{rank}.jsonl").write_text(crafted.otlp_line(rank, 0, spans) + "\n")
    return directory


def test_the_command_line_window_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    traces = _write_late_job(tmp_path / "traces")
    assert main(["report", str(traces), "--no-html"]) == 0
    out = capsys.readouterr().out
    assert "stragglers: rank 1\n" in out
    assert "rank 1: relative 0.50 in window 3 of 6 (steps 20-29, 40.0-76.0 s into the job)" in out
    assert main(["report", str(traces), "--no-html", "--straggler-window", "20"]) == 0
    assert "stragglers: none" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["report", str(traces), "--no-html", "--straggler-window", "0"])


# -- naming against peers (issue 28) -----------------------------------------------------------------------------
def _noisy(count: int, seed: int, base: float = 0.020, sigma: float = 0.2, bursts: int = 8) -> list[float]:
    """A busy 2-core machine's steps: log-normal noise, and a few runs of 1-3 steps 2-4x as long (the rank
    descheduled for a moment)."""
    rng = random.Random(seed)
    durations = [base * rng.lognormvariate(0, sigma) for _ in range(count)]
    for _ in range(bursts):
        at = rng.randrange(count)
        for index in range(at, min(count, at + rng.randint(1, 3))):
            durations[index] *= rng.uniform(2, 4)
    return durations


@pytest.mark.parametrize("seed", range(5))
def test_healthy_ranks_on_a_busy_machine_are_not_named(seed: int) -> None:
    durations = {rank: _noisy(200, 100 * seed + rank) for rank in range(4)}
    scores = straggler_scores(durations)
    assert [score.rank for score in scores if score.straggler] == [], [
        (score.rank, [(w.index, round(w.relative, 2), round(w.individual, 2)) for w in score.slow_windows])
        for score in scores]


@pytest.mark.parametrize("seed", range(5))
def test_a_rank_made_slower_for_the_second_half_is_named_among_noisy_peers_from_where_it_began(seed: int) -> None:
    durations = {rank: _noisy(200, 100 * seed + rank) for rank in range(4)}
    durations[3] = durations[3][:100] + [value * 1.5 for value in durations[3][100:]]
    scores = straggler_scores(durations)
    assert [score.rank for score in scores if score.straggler] == [3]
    assert scores[3].slow_windows[0].first >= 90 and min(w.first for w in scores[3].slow_windows) <= 110


def test_every_rank_slowing_in_one_window_names_no_one_and_the_report_says_the_job_slowed_and_why() -> None:
    durations = {rank: _jittered([1.0] * 40 + [3.0] * 10 + [1.0] * 30, seed=rank) for rank in range(4)}
    records = _step_records(durations)
    run = RunKey(job_id="late", rank=0, restart=0, run_id="late-0")
    start = T0 + round(sum(durations[0][:40]) * 1e9)  # rank 0 saves a checkpoint during those steps
    records.append(SpanRecord(name=sc.SPAN_SAVE_CHECKPOINT, start_ns=start, end_ns=start + 20 * 10**9, run=run,
                              attributes={}, service="late"))
    report = build_report(records)
    assert report.straggler_ranks == []
    (line,) = report.job_slow_window_lines()
    assert line.startswith("window 5 (steps 140-149, ") and "rank(s) 0, 1, 2, 3 3.0" in line, line
    summary = render_summary(report)
    assert "stragglers: none\n" in summary and "slow windows of the whole job" in summary
    rank_zero = [entry for entry in report.job_slow_window_lines() if "during" in entry]
    assert rank_zero and "during checkpoint_save" in rank_zero[0]


def test_a_one_rank_job_names_no_straggler_and_reports_its_slow_window() -> None:
    report = build_report(_step_records({0: [1.0] * 40 + [1.5] * 20}))
    summary = render_summary(report)
    assert report.straggler_ranks == [] and "stragglers: none\n" in summary
    assert report.job_slow_window_lines()[0].startswith("window 5 (steps 140-149, 40.0-55.0 s into the job): rank(s) 0 1.50x")
