"""The shared computations against figures worked out by hand (see goodput_traces.py)."""

from __future__ import annotations

import random

import goodput_traces as crafted
import pytest

from otel_training import semconv as sc
from otel_training.analysis import (
    BUCKETS,
    PRODUCTIVE,
    RunAccountant,
    RunKey,
    SpanRecord,
    Timeline,
    account,
    ideal_step_time,
    normal_threshold,
    step_stats,
    straggler_scores,
)


def test_job_goodput_and_badput_match_the_hand_computation() -> None:
    result = account(crafted.records())
    for label, expected in crafted.EXPECTED_SECONDS.items():
        assert result.seconds.get(label, 0.0) == pytest.approx(expected, abs=1e-6), label
    assert result.total_s == pytest.approx(crafted.EXPECTED_TOTAL)
    assert result.goodput == pytest.approx(crafted.EXPECTED_GOODPUT)
    assert set(result.badput) == set(BUCKETS)
    assert result.restarts == 1
    failed = {(run.key.rank, run.key.restart): run.failed for run in result.runs}
    assert failed == {(0, 0): True, (0, 1): False, (1, 0): True, (1, 1): False}


def test_result_does_not_depend_on_the_order_records_arrive_in() -> None:
    records = crafted.records()
    random.Random(7).shuffle(records)
    assert account(records).seconds == pytest.approx(account(crafted.records()).seconds)


def test_evaluation_can_count_as_productive() -> None:
    result = account(crafted.records(), evaluation_is_productive=True)
    assert result.seconds.get(sc.BADPUT_EVALUATION, 0.0) == 0.0
    assert result.productive_s == pytest.approx(131 + 4)


def test_restart_without_a_failure_signal_still_counts_as_failed() -> None:
    """A run that was followed by another before training.train ended lost its progress."""
    key0 = RunKey("j", 0, 0, "a")
    key1 = RunKey("j", 0, 1, "b")
    records = [
        SpanRecord(sc.SPAN_STEP, 0, 4 * 10**9, key0),
        SpanRecord(sc.SPAN_SAVE_CHECKPOINT, 4 * 10**9, 5 * 10**9, key0),
        SpanRecord(sc.SPAN_STEP, 5 * 10**9, 8 * 10**9, key0),
        SpanRecord(sc.SPAN_TRAIN, 9 * 10**9, 10 * 10**9, key1),
    ]
    result = account(records)
    assert result.seconds[sc.BADPUT_WASTED_PROGRESS] == pytest.approx(3)
    assert result.seconds[PRODUCTIVE] == pytest.approx(4)
    assert result.seconds[sc.BADPUT_DOWNTIME] == pytest.approx(1)
    assert result.seconds[sc.BADPUT_RECOVERY] == pytest.approx(1)


def test_stuck_until_the_run_died_when_the_span_never_ended() -> None:
    key = RunKey("j", 0, 0, "a")
    records = [
        SpanRecord(sc.SPAN_STEP, 0, 2 * 10**9, key),
        SpanRecord(sc.SPAN_ALERT, 6 * 10**9, 6 * 10**9, key,
                   attributes={sc.ALERT_KIND: sc.ALERT_KIND_STUCK, sc.ALERT_ELAPSED_S: 4.0,
                               sc.ALERT_THRESHOLD_S: 1.0, sc.ALERT_SPAN_ID: "00000000000000ab"}),
        SpanRecord(sc.SPAN_ALERT, 9 * 10**9, 10 * 10**9, key, attributes={sc.ALERT_KIND: sc.ALERT_KIND_DIED}),
    ]
    result = account(records)
    # Stuck from 3 s (6 − (4 − 1)) to the end of the run at 10 s.
    assert result.seconds[sc.BADPUT_STUCK] == pytest.approx(7)
    assert result.seconds[sc.BADPUT_HOST_OUTSIDE_STEPS] == pytest.approx(1)  # 2-3 s: after the step, no train end
    assert result.runs[0].failed


def test_incremental_folds_equal_one_fold() -> None:
    """The live processor folds every collection; the report folds once: same totals."""
    records = sorted((r for r in crafted.records() if r.run.rank == 0 and r.run.restart == 0),
                     key=lambda r: r.end_ns)
    start, end = min(r.start_ns for r in records), max(r.end_ns for r in records)
    once = RunAccountant(start)
    for record in records:
        once.add(record)
    expected = once.finish(end, failed=True)

    live = RunAccountant(start)
    open_starts = sorted(r.start_ns for r in records)
    for index, record in enumerate(records):
        live.add(record)
        # Fold up to the earliest start among spans that have not ended yet, as the processor does.
        later = [r.start_ns for r in records[index + 1:]]
        live.fold(min(later) if later else record.end_ns)
    assert open_starts  # sanity
    assert live.finish(end, failed=True) == expected


def test_timeline_priority_and_uncovered_time() -> None:
    timeline = Timeline(0)
    timeline.add(PRODUCTIVE, 10, 20, is_step=True)
    timeline.add(sc.BADPUT_DATA_LOADING, 15, 25)
    timeline.add(sc.BADPUT_STUCK, 18, 19)
    timeline.fold(30)
    assert dict(timeline.totals) == {
        sc.BADPUT_PROGRAM_STARTUP: 10, PRODUCTIVE: 5, sc.BADPUT_DATA_LOADING: 9,
        sc.BADPUT_STUCK: 1, sc.BADPUT_HOST_OUTSIDE_STEPS: 5,
    }
    # Once the training loop has ended, uncovered time is teardown ("other").
    timeline.train_end_ns = 32
    timeline.fold(40)
    assert timeline.totals[sc.BADPUT_HOST_OUTSIDE_STEPS] == 7
    assert timeline.totals[sc.BADPUT_OTHER] == 8


def test_normal_threshold_is_median_plus_three_mad() -> None:
    durations = [1, 2, 3, 4, 5, 6, 7, 8, 9, 100]
    # median 5.5; |d − 5.5| sorted: .5 .5 1.5 1.5 2.5 2.5 3.5 3.5 4.5 94.5 → MAD 2.5 → 5.5 + 7.5
    assert normal_threshold(durations) == pytest.approx(13.0)
    assert ideal_step_time(durations) == pytest.approx(5.0)  # mean of 1..9
    assert ideal_step_time(durations[:9]) is None  # fewer than 10 steps
    assert ideal_step_time(durations[:9], configured=4.0) == 4.0
    stats = step_stats(durations, ideal=5.0, threshold=13.0)
    assert stats is not None
    assert stats.abnormal == 1
    assert stats.mean_deviation == pytest.approx(14.5 - 5.0)


def test_crafted_job_deviation_by_hand() -> None:
    pooled = crafted.step_durations(0) + crafted.step_durations(1)
    # 28 steps of 2 s, one of 10 s (the stuck step), 23 of 4 s: median 2, MAD 0.
    assert sorted(pooled).count(2.0) == 28 and len(pooled) == 52
    assert normal_threshold(pooled) == pytest.approx(2.0)
    ideal = ideal_step_time(pooled)
    assert ideal == pytest.approx(2.0)
    rank0 = step_stats(crafted.step_durations(0), ideal, normal_threshold(pooled))
    assert rank0 is not None
    assert rank0.mean_deviation == pytest.approx(66 / 29 - 2)
    assert rank0.abnormal == 1


def test_straggler_scores_name_the_slow_rank() -> None:
    scores = straggler_scores({rank: crafted.step_durations(rank) for rank in (0, 1)})
    by_rank = {score.rank: score for score in scores}
    assert by_rank[0].relative == pytest.approx(1.0)
    assert by_rank[1].relative == pytest.approx(0.5)
    assert [score.rank for score in scores if score.straggler] == [1]


def test_individual_score_catches_a_rank_slower_than_its_own_best() -> None:
    durations = [1.0] * 10 + [2.0] * 30
    scores = straggler_scores({0: durations})
    assert scores[0].relative == 1.0  # alone, it is the fastest
    assert scores[0].individual == pytest.approx(0.5)
    # a one-rank job has no peers: the slowdown is the job's, a job-wide slow window, not a straggler
    assert not scores[0].straggler and len(scores[0].shared_windows) == 3
