"""The job-level hang verdict as a pure function (analysis.hang): views in, verdict out."""

from __future__ import annotations

import html
import importlib.util

from otel_training import semconv as sc
from otel_training.analysis.hang import GroupView, RankView, render, verdict
from otel_training.analysis.hang_tracker import HangTracker, verdicts_from_records
from otel_training.analysis.records import RunKey, SpanRecord


def rank(number: int, entered: int, completed: int, op: str = "allreduce", step: int | None = None, **flags) -> RankView:
    return RankView(number, {"0": GroupView("0", entered, completed, op, step)}, **flags)


def test_a_healthy_job_has_no_verdict_even_while_ranks_wait_in_a_collective():
    # rank 0 checkpoints while the others wait in a barrier: nobody is stuck
    ranks = [rank(0, 40, 40), rank(1, 41, 40, "barrier"), rank(2, 41, 40, "barrier")]
    result = verdict(ranks)
    assert not result.hung and not result.culprits and render(result) == []


def test_the_rank_that_did_not_enter_the_collective_is_the_culprit():
    ranks = [rank(0, 14, 13, stuck=True), rank(1, 13, 13, "allgather", stuck=True), rank(2, 14, 13, stuck=True)]
    result = verdict(ranks)
    assert result.hung and not result.no_single_culprit
    assert [(c.rank, c.reason) for c in result.culprits] == [(1, sc.HANG_REASON_NOT_ENTERED)]
    assert (result.group, result.seq, result.op) == ("0", 14, "allreduce")
    assert result.waiting == {0: (1,), 2: (1,)}
    assert "has not entered allreduce #14" in result.culprits[0].detail
    lines = render(result)
    assert lines[0].startswith("Hang verdict: culprit rank 1 (not_entered")
    assert "  rank(s) 0, 2 waiting on rank 1" in lines


def test_an_unmatched_collective_names_the_minority_and_the_steps_that_differ():
    # rank 1 skipped step 4's all_gather: its step-5 all-reduce meets the others' all_gather at #13
    ranks = [rank(0, 13, 12, "allgather", 4, stuck=True), rank(1, 13, 12, "allreduce", 5, stuck=True),
             rank(2, 13, 12, "allgather", 4, stuck=True)]
    result = verdict(ranks)
    (culprit,) = result.culprits
    assert (culprit.rank, culprit.reason) == (1, sc.HANG_REASON_MISMATCH)
    assert culprit.detail == "entered allreduce #13 (step 5) where rank(s) 0, 2 entered allgather #13 (step 4) on group 0"
    assert result.waiting == {0: (1,), 2: (1,)}


def test_a_two_rank_mismatch_blames_the_rank_ahead_in_steps():
    ranks = [rank(0, 13, 12, "allgather", 4, stuck=True), rank(1, 13, 12, "allreduce", 5, stuck=True)]
    assert [c.rank for c in verdict(ranks).culprits] == [1]
    ranks = [rank(0, 13, 12, "allreduce", 5, stuck=True), rank(1, 13, 12, "allgather", 4, stuck=True)]
    assert [c.rank for c in verdict(ranks).culprits] == [0]


def test_an_op_nobody_named_matches_any_and_accuses_no_one():
    # rank 0's view of #14 is from the step its exception ended (the sequence route names no op there),
    # rank 2's from its stuck alert (named by the flight recorder): the same collective, not an unmatched one
    ranks = [rank(0, 14, 13, "", 4), rank(1, 13, 13, died=True), rank(2, 14, 13, "allreduce", 4, stuck=True)]
    result = verdict(ranks)
    assert [(c.rank, c.reason) for c in result.culprits] == [(1, sc.HANG_REASON_NO_HEARTBEAT)], result
    assert (result.seq, result.op) == (14, "allreduce") and result.waiting == {0: (1,), 2: (1,)}
    # two named ops that differ are still a mismatch, whatever the unnamed rank entered
    ranks = [rank(0, 13, 12, "allgather", 4, stuck=True), rank(1, 13, 12, "allreduce", 5, stuck=True),
             rank(2, 13, 12, "allgather", 4, stuck=True), rank(3, 13, 12, "", 4, stuck=True)]
    assert [(c.rank, c.reason) for c in verdict(ranks).culprits] == [(1, sc.HANG_REASON_MISMATCH)]


def test_with_no_op_named_the_rank_behind_is_still_the_culprit_and_the_text_says_collective():
    ranks = [rank(0, 14, 13, "", stuck=True), rank(1, 13, 13, "", stuck=True), rank(2, 14, 13, "", stuck=True)]
    result = verdict(ranks)
    (culprit,) = result.culprits
    assert (culprit.rank, culprit.reason, result.op) == (1, sc.HANG_REASON_NOT_ENTERED, "")
    assert culprit.detail == "last entered ? #13, completed #13; has not entered collective #14 on group 0"
    result = verdict([rank(0, 14, 13, "", stuck=True), rank(1, 14, 13, "", stuck=True)])
    assert result.no_single_culprit and "every rank waits in a collective #14 on group 0" in result.summary


def test_a_dead_rank_is_the_culprit_and_the_survivors_wait_on_it():
    ranks = [rank(0, 14, 13, stuck=True), rank(1, 13, 13, died=True), rank(2, 14, 13, stuck=True)]
    result = verdict(ranks)
    assert [(c.rank, c.reason, c.detail) for c in result.culprits] == [(1, sc.HANG_REASON_NO_HEARTBEAT, "died")]
    assert result.waiting == {0: (1,), 2: (1,)}


def test_a_silent_rank_with_others_waiting_is_a_hang_before_any_stuck_alert():
    ranks = [rank(0, 14, 13), rank(1, 13, 13, alive=False)]
    result = verdict(ranks)
    assert [(c.rank, c.reason) for c in result.culprits] == [(1, sc.HANG_REASON_NO_HEARTBEAT)]
    assert result.waiting == {0: (1,)}


def test_every_rank_in_the_same_collective_is_no_single_culprit():
    result = verdict([rank(r, 14, 13, stuck=True) for r in range(4)])
    assert result.hung and result.no_single_culprit and not result.culprits
    assert "every rank waits in allreduce #14 on group 0" in result.summary


def test_every_rank_stuck_at_the_same_point_outside_collectives_is_no_single_culprit():
    result = verdict([rank(r, 13, 13, "allgather", stuck=True) for r in range(3)])
    assert result.no_single_culprit and result.seq is None
    assert "outside collectives" in result.summary


def _record(name: str, rank_number: int, end_ns: int, **attributes) -> SpanRecord:
    run = RunKey(job_id="j", rank=rank_number, restart=0, run_id="r")
    return SpanRecord(name, end_ns - 10, end_ns, run, dict(attributes))


def _collective(seq: int, completed: int, op: str, step: int, wait_s: float = 0.0) -> dict:
    return {sc.COLLECTIVE_GROUP: "0", sc.COLLECTIVE_OP: op, sc.COLLECTIVE_SEQ: seq,
            sc.COLLECTIVE_COMPLETED_SEQ: completed, sc.COLLECTIVE_PENDING: seq > completed,
            sc.COLLECTIVE_STEP: step, sc.COLLECTIVE_WAIT_S: wait_s}


def test_from_records_the_stuck_alerts_view_wins_and_the_timeline_shows_the_last_steps():
    records = []
    for r in (0, 1):
        for step in range(5):
            records.append(_record(sc.SPAN_STEP, r, 1000 + step, **{sc.STEP: step}, **_collective(2 * step + 2, 2 * step + 2, "allreduce", step)))
    records.append(_record(sc.SPAN_ALERT, 0, 2000, **{sc.ALERT_KIND: sc.ALERT_KIND_STUCK}, **_collective(12, 11, "allreduce", 5, 3.5)))
    records.append(_record(sc.SPAN_ALERT, 0, 3000, **{sc.ALERT_KIND: sc.ALERT_KIND_STUCK, sc.ALERT_REPEAT: True}, **_collective(12, 11, "allreduce", 5, 5.5)))
    records.append(_record(sc.SPAN_ALERT, 1, 2000, **{sc.ALERT_KIND: sc.ALERT_KIND_STUCK}, **_collective(11, 11, "allgather", 5)))
    ((key, (result, timelines)),) = verdicts_from_records(records).items()
    assert key == ("j", "r")
    assert [(c.rank, c.reason) for c in result.culprits] == [(1, sc.HANG_REASON_NOT_ENTERED)]
    assert timelines[0][-1] == "stuck: inside allreduce #12 on group 0 for 3.5 s"
    assert timelines[1][-1] == "stuck: outside any collective"
    assert [line.split(":")[0] for line in timelines[0][:3]] == ["step 2", "step 3", "step 4"]
    lines = render(result, timelines)
    assert "  rank(s) 0 waiting on rank 1" in lines
    assert any(line.startswith("  rank 1: step 2: last entered allreduce #6") for line in lines)


def test_from_records_a_recovered_job_has_no_verdict():
    records = [
        _record(sc.SPAN_STEP, 0, 1000, **{sc.STEP: 0}, **_collective(2, 2, "allreduce", 0)),
        _record(sc.SPAN_ALERT, 0, 2000, **{sc.ALERT_KIND: sc.ALERT_KIND_STUCK}, **_collective(3, 2, "allreduce", 1, 2.0)),
        _record(sc.SPAN_ALERT, 0, 3000, **{sc.ALERT_KIND: sc.ALERT_KIND_RECOVERED}),
        _record(sc.SPAN_STEP, 1, 1000, **{sc.STEP: 0}, **_collective(2, 2, "allreduce", 0)),
    ]
    ((_, (result, _timelines)),) = verdicts_from_records(records).items()
    assert not result.hung


def _hung_job_records() -> list[SpanRecord]:
    records = []
    for r in range(4):
        for step in range(50):
            records.append(_record(sc.SPAN_STEP, r, 1000 + step, **{sc.STEP: step},
                                   **_collective(2 * step + 2, 2 * step + 2, "allreduce", step)))
    for r in (0, 1, 3):
        records.append(_record(sc.SPAN_ALERT, r, 5000, **{sc.ALERT_KIND: sc.ALERT_KIND_STUCK},
                               **_collective(102, 101, "allreduce", 50, 4.0)))
    records.append(_record(sc.SPAN_ALERT, 2, 5000, **{sc.ALERT_KIND: sc.ALERT_KIND_STUCK}))
    return records


def test_the_tracker_read_in_any_order_and_in_parts_gives_the_one_pass_result():
    """The report reads files in parallel workers and in write order, not time order: same verdict."""
    import pickle
    import random

    records = _hung_job_records()
    expected = verdicts_from_records(records)
    shuffled = records[:]
    random.Random(7).shuffle(shuffled)
    parts = [HangTracker() for _ in range(3)]
    for index, record in enumerate(shuffled):
        parts[index % 3].add(record)
    merged = HangTracker()
    for part in parts:
        merged.update(pickle.loads(pickle.dumps(part)))  # as a worker process returns it
    assert merged.results() == expected
    ((result, timelines),) = expected.values()
    assert [(c.rank, c.reason) for c in result.culprits] == [(2, sc.HANG_REASON_NOT_ENTERED)]
    assert [line.split(":")[0] for line in timelines[2][:3]] == ["step 47", "step 48", "step 49"]
    assert merged.lines() == render(result, timelines)


def test_the_report_prints_the_verdict_from_the_records_it_reads():
    from otel_training.report.job import build_report
    from otel_training.report.summary import render_summary

    records = _hung_job_records()
    ((result, timelines),) = verdicts_from_records(records).values()
    report = build_report(records)
    assert report.hang == render(result, timelines)
    assert "\n".join(report.hang) in render_summary(report)
    if importlib.util.find_spec("matplotlib") is not None:  # the report extra
        from otel_training.report.html import render_html

        assert html.escape("\n".join(report.hang)) in render_html(report)


# -- every episode of a run (analysis.hang_episodes) ------------------------------------------------------------
S = 1_000_000_000


def _alert(rank_number: int, at_s: float, kind: str, span: str, elapsed_s: float, step: int | None = None,
           **attributes) -> SpanRecord:
    run = RunKey(job_id="j", rank=rank_number, restart=0, run_id="r")
    at = int(at_s * S)
    values = {sc.ALERT_KIND: kind, sc.ALERT_SPAN_ID: span, sc.ALERT_ELAPSED_S: elapsed_s, **attributes}
    if step is not None:
        values[sc.STEP] = step
    return SpanRecord(sc.SPAN_ALERT, at, at, run, values)


def _hang_at(step: int, at_s: float, span_suffix: str, sleeper: int = 2, recover_s: float | None = 12.0) -> list:
    """Ranks 0, 1, 3 wait in allreduce #2s+2 while ``sleeper`` is stuck in its data loading (not entered)."""
    records = []
    seq = 2 * step + 2
    for r in range(4):
        view = _collective(seq - 2, seq - 2, "allreduce", step - 1) if r == sleeper else \
            _collective(seq, seq - 1, "allreduce", step, 2.0)
        records.append(_alert(r, at_s + 2, sc.ALERT_KIND_STUCK, f"{r}{span_suffix}", 2.0, step, **view))
        if recover_s is not None:
            records.append(_alert(r, at_s + recover_s, sc.ALERT_KIND_RECOVERED, f"{r}{span_suffix}", recover_s, step))
    return records


def test_a_hang_that_recovered_gets_its_own_verdict_with_its_length_and_steps():
    records = [_record(sc.SPAN_STEP, r, int(s * S), **{sc.STEP: s}) for r in range(4) for s in range(1, 80)]
    records += _hang_at(25, 30.0, "a")
    tracker = HangTracker()
    for record in records:
        tracker.add(record)
    (episodes,) = tracker.episodes().values()
    (episode,) = episodes
    assert episode.recovered and episode.ranks == (0, 1, 2, 3) and episode.steps == (25,)
    assert abs(episode.seconds(0) - 12.0) < 1e-6
    assert [(c.rank, c.reason) for c in episode.verdict.culprits] == [(2, sc.HANG_REASON_NOT_ENTERED)]
    assert episode.verdict.waiting == {0: (2,), 1: (2,), 3: (2,)}
    lines = tracker.episode_lines()
    assert lines[0] == "Hang episode 1: 12.0 s, step 25, rank(s) 0, 1, 2, 3 stuck, recovered"
    assert lines[1].startswith("  Hang verdict: culprit rank 2 (not_entered")
    assert tracker.lines() == []  # nothing is stuck when the files end: no end-state verdict


def test_each_episode_of_a_run_is_judged_apart_and_duplicate_reporters_make_one_episode():
    records = _hang_at(25, 30.0, "a", sleeper=2) + _hang_at(60, 100.0, "b", sleeper=1, recover_s=None)
    # the watchdog sidecar reporting the same stuck span as the detector: one interval, not two
    records.append(_alert(0, 33.0, sc.ALERT_KIND_STUCK, "0a", 3.0, 25, **{sc.ALERT_SOURCE: "watchdog"}))
    records.append(_alert(0, 42.0, sc.ALERT_KIND_RECOVERED, "0a", 12.0, 25, **{sc.ALERT_SOURCE: "watchdog"}))
    half = len(records) // 2
    one, two = HangTracker(), HangTracker()
    for record in records[:half]:
        one.add(record)
    for record in records[half:]:
        two.add(record)
    one.update(two)  # parts read in parallel merge to the same episodes
    (episodes,) = one.episodes().values()
    first, second = episodes
    assert first.recovered and [c.rank for c in first.verdict.culprits] == [2]
    assert not second.recovered and [c.rank for c in second.verdict.culprits] == [1] and second.steps == (60,)
    assert "still stuck when the files end" in one.episode_lines()[-3]


def test_a_rank_silent_while_the_others_waited_is_named_as_inferred():
    """Rank 3 was blocked between its steps (after optimizer.step(), unwatched): no alert of its own."""
    records = [_record(sc.SPAN_STEP, r, int(s * S), **{sc.STEP: s}) for r in range(4) for s in range(1, 10)]
    for r in range(3):
        records.append(_alert(r, 12.0, sc.ALERT_KIND_STUCK, f"{r}x", 2.0, 9, **_collective(20, 19, "allreduce", 9, 2.0)))
        records.append(_alert(r, 20.0, sc.ALERT_KIND_RECOVERED, f"{r}x", 10.0, 9))
    tracker = HangTracker()
    for record in records:
        tracker.add(record)
    ((episode,),) = tracker.episodes().values()
    assert [(c.rank, c.reason) for c in episode.verdict.culprits] == [(3, "silent_during_hang")]
    assert "(inferred)" in episode.verdict.culprits[0].detail and episode.verdict.waiting[0] == (3,)


def test_the_episodes_kept_per_rank_are_bounded_and_are_the_longest():
    from otel_training.analysis.hang_episodes import MAX_PER_RANK

    tracker = HangTracker()
    for index in range(3 * MAX_PER_RANK):
        length = 100.0 if index == 7 else 1.0
        tracker.add(_alert(0, 10.0 * index + length, sc.ALERT_KIND_STUCK, f"s{index}", length))
        tracker.add(_alert(0, 10.0 * index + length, sc.ALERT_KIND_RECOVERED, f"s{index}", length))
    (episodes,) = tracker.episodes().values()
    assert len(episodes) <= MAX_PER_RANK and max(episode.seconds(0) for episode in episodes) == 100.0
