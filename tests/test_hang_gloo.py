"""The hang verdict on real torch.distributed (gloo, CPU): several local ranks of a DDP job that
hang on purpose, through the real SDK (file exporter, periodic metric reader, stuck detector,
watchdog). Each case checks the verdict twice: from the exported gauges (what the Prometheus rules
compare, live) and from the spans (what the report reads, offline).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from requirements import require

require("torch")

from hang_ranks import Ranks, alerts, env_for, gauges, heartbeat, rank_view, records  # noqa: E402
from waiting import wait_until  # noqa: E402

from otel_training import semconv as sc  # noqa: E402
from otel_training.analysis.hang import render, verdict  # noqa: E402
from otel_training.analysis.hang_tracker import verdicts_from_records  # noqa: E402
from otel_training.integrations.torch.collective_routes import supported  # noqa: E402

pytestmark = [pytest.mark.timeout(600)]


@pytest.fixture(autouse=True, params=["hooks", "sequence"])
def route(request: pytest.FixtureRequest):
    """Every case on both tracking routes: torch's hooks, and the sequence route older torch gets (forced here)."""
    import hang_ranks

    if request.param == "hooks" and not supported():
        pytest.skip(f"torch {torch_version()} has no ProcessGroup collective hooks: the sequence route runs instead")
    hang_ranks.ROUTE = request.param
    yield request.param
    hang_ranks.ROUTE = "auto"


def torch_version() -> str:
    import torch

    return torch.__version__


def ops_named(route: str) -> bool:
    """Whether this route names the ops: the hooks do; the sequence route only through the flight recorder,
    which torch before 2.2 does not have for gloo (then the verdict names the rank, not the op)."""
    import torch._C._distributed_c10d as c10d

    return route == "hooks" or hasattr(c10d, "_dump_fr_trace_json")

#: Generous: a loaded 2-core machine imports torch in several processes at once.
DEADLINE_S = 180.0
AT_STEP = 4


def _stuck_with_gauges(ranks: Ranks, out: Path, stuck_ranks: list[int]) -> None:
    """Wait until every rank in ``stuck_ranks`` exported a stuck alert and gauges after it."""
    def ready() -> bool:
        for rank in stuck_ranks:
            stuck = alerts(out, rank, sc.ALERT_KIND_STUCK)
            if not stuck or heartbeat(gauges(out, rank)) * 1e9 < stuck[0].end_ns:
                return False
        return True

    assert wait_until(ready, DEADLINE_S, 0.2), f"no stuck alerts and gauges from ranks {stuck_ranks}:\n{ranks.outputs()}"


def _live_verdict(out: Path, world: int, silent: tuple[int, ...] = ()):
    samples = {rank: gauges(out, rank) for rank in range(world)}
    views = [rank_view(rank, samples[rank], alive=rank not in silent,
                       stuck=bool(alerts(out, rank, sc.ALERT_KIND_STUCK)),
                       died=bool(alerts(out, rank, sc.ALERT_KIND_DIED))) for rank in range(world)]
    return verdict(views)


def _report(out: Path, world: int) -> str:
    """``otel-training report`` on what the ranks wrote (the real CLI, streaming files in parallel).

    Run once the ranks are gone; it must print the verdict the spans give then.
    """
    done = subprocess.run([sys.executable, "-c", "from otel_training.cli.main import main; raise SystemExit(main())",
                           "report", str(out), "--no-html", "--no-progress"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    result, timelines = _offline_verdict(out, world)
    assert "\n".join(render(result, timelines)) in done.stdout, done.stdout
    return done.stdout


def _offline_verdict(out: Path, world: int):
    ((_, (result, timelines)),) = verdicts_from_records([r for rank in range(world) for r in records(out, rank)]).items()
    return result, timelines


def test_a_rank_sleeping_before_the_all_reduce_is_the_culprit(tmp_path: Path, route: str):
    out = tmp_path / "out"
    with Ranks(out, 3, ["--scenario", "sleeper", "--culprit", "1", "--at-step", str(AT_STEP)], env_for(out)) as ranks:
        _stuck_with_gauges(ranks, out, [0, 1, 2])
        live = _live_verdict(out, 3)
        offline, timelines = _offline_verdict(out, 3)
        # the waiters' alerts carry the collective they are inside, and the flight recorder's entry for it
        (waiting,) = [a for a in alerts(out, 0, sc.ALERT_KIND_STUCK) if not a.attributes.get(sc.ALERT_REPEAT)]
    op = "allreduce" if ops_named(route) else ""
    for result in (live, offline):
        assert [(c.rank, c.reason) for c in result.culprits] == [(1, sc.HANG_REASON_NOT_ENTERED)], result
        assert result.op == op and result.waiting == {0: (1,), 2: (1,)}
    attributes = waiting.attributes
    assert attributes[sc.COLLECTIVE_PENDING] is True and attributes[sc.COLLECTIVE_OP] == op
    assert attributes[sc.COLLECTIVE_SEQ] == offline.seq and attributes[sc.COLLECTIVE_WAIT_S] > 1.0
    if ops_named(route):
        assert f'"collective_seq_id":{offline.seq}' in attributes[sc.COLLECTIVE_FLIGHT_RECORDER]
        assert "gloo:all_reduce" in attributes[sc.COLLECTIVE_FLIGHT_RECORDER]
    assert timelines[1][-1] == "stuck: outside any collective"
    printed = _report(out, 3)
    assert "Hang verdict: culprit rank 1" in printed and "rank(s) 0, 2 waiting on rank 1" in printed, printed


def test_a_rank_skipping_a_collective_is_the_culprit_with_the_sequence_numbers_that_differ(tmp_path: Path,
                                                                                         route: str):
    if not ops_named(route):
        pytest.skip(f"torch {torch_version()} has neither the ProcessGroup hooks nor gloo's flight recorder: an "
                    "unmatched collective (same sequence number, another op) is not told apart on it")
    out = tmp_path / "out"
    with Ranks(out, 3, ["--scenario", "skip", "--culprit", "2", "--at-step", str(AT_STEP)], env_for(out)) as ranks:
        _stuck_with_gauges(ranks, out, [0, 1, 2])
        live = _live_verdict(out, 3)
        offline, timelines = _offline_verdict(out, 3)
    for result in (live, offline):
        (culprit,) = result.culprits
        assert (culprit.rank, culprit.reason) == (2, sc.HANG_REASON_MISMATCH), result
        assert result.op == "allgather" and result.waiting == {0: (2,), 1: (2,)}
        assert f"entered allreduce #{result.seq} (step {AT_STEP + 1}) where rank(s) 0, 1 entered allgather " \
               f"#{result.seq} (step {AT_STEP})" in culprit.detail
    printed = _report(out, 3)
    assert "rank(s) 0, 1 waiting on rank 2" in printed, printed


def test_a_sigkilled_rank_is_reported_dead_by_its_watchdog_and_named_the_culprit(tmp_path: Path):
    out = tmp_path / "out"
    env = env_for(out, OTEL_TRAINING_WATCHDOG="true")
    with Ranks(out, 3, ["--scenario", "kill", "--culprit", "1", "--at-step", str(AT_STEP)], env) as ranks:
        assert wait_until(lambda: alerts(out, 1, sc.ALERT_KIND_DIED), DEADLINE_S, 0.2), ranks.outputs()
        # gloo notices the peer is gone: the survivors' collective fails at once (NCCL would wait)
        assert wait_until(lambda: all(p.poll() is not None for p in ranks.procs), DEADLINE_S, 0.2), ranks.outputs()
        assert re.search(r"Connection (closed|reset) by peer", ranks.output(0)), ranks.outputs()
        offline, timelines = _offline_verdict(out, 3)
    assert [(c.rank, c.reason, c.detail) for c in offline.culprits] == [(1, sc.HANG_REASON_NO_HEARTBEAT, "died")]
    assert timelines[1][-1] == "died"
    # the survivors' failed steps (ended by the excepthook, not their own end) carry the all-reduce they were in,
    # one past the dead rank's last: had they kept the step before's, a survivor that raised no stuck alert
    # would look behind one that did, and be named a culprit
    steps = {rank: {r.attributes[sc.STEP]: r.attributes for r in records(out, rank) if r.name == sc.SPAN_STEP}
             for rank in range(3)}
    dead = steps[1][AT_STEP - 1][sc.COLLECTIVE_SEQ]
    assert [steps[rank][AT_STEP].get(sc.COLLECTIVE_SEQ) for rank in (0, 2)] == [dead + 1, dead + 1], steps
    assert "Hang verdict: culprit rank 1" in _report(out, 3)


def test_a_frozen_rank_stops_its_heartbeat_and_the_others_wait_on_it(tmp_path: Path):
    out = tmp_path / "out"
    with Ranks(out, 2, ["--scenario", "freeze", "--culprit", "1", "--at-step", str(AT_STEP)], env_for(out)) as ranks:
        _stuck_with_gauges(ranks, out, [0])
        beats = {rank: heartbeat(gauges(out, rank)) for rank in (0, 1)}
        # rank 0's reader thread keeps exporting while its training thread waits; rank 1's stopped
        assert wait_until(lambda: heartbeat(gauges(out, 0)) > beats[1] + 2.0, DEADLINE_S, 0.2), ranks.outputs()
        live = _live_verdict(out, 2, silent=(1,))
    assert [(c.rank, c.reason) for c in live.culprits] == [(1, sc.HANG_REASON_NO_HEARTBEAT)]
    assert live.waiting == {0: (1,)}


def test_every_rank_delayed_equally_is_no_single_culprit(tmp_path: Path):
    out = tmp_path / "out"
    with Ranks(out, 2, ["--scenario", "equal", "--at-step", str(AT_STEP)], env_for(out)) as ranks:
        _stuck_with_gauges(ranks, out, [0, 1])
        live = _live_verdict(out, 2)
        offline, _ = _offline_verdict(out, 2)
    for result in (live, offline):
        assert result.hung and result.no_single_culprit and not result.culprits, result
        assert "outside collectives" in result.summary
    printed = _report(out, 2)
    assert f"Hang verdict: {offline.summary}" in printed, printed


def test_a_rank_whose_data_loading_blocked_and_recovered_gets_the_episodes_verdict(tmp_path: Path, route: str):
    """Four ranks; rank 2's storage blocks for 6 s at step 4 (past the 2 s threshold), then the job goes on and
    ends: nobody is stuck when the files end, and the report still says who held the others up, in what, for
    how long (issue 28)."""
    out = tmp_path / "out"
    args = ["--scenario", "slow_data", "--culprit", "2", "--at-step", str(AT_STEP), "--hang-s", "6", "--steps", "10"]
    with Ranks(out, 4, args, env_for(out)) as ranks:
        assert wait_until(lambda: all(ranks.printed(r, r"DONE rank=\d") for r in range(4)), DEADLINE_S, 0.2), \
            ranks.outputs()
    assert all(alerts(out, rank, sc.ALERT_KIND_RECOVERED) for rank in range(4))
    offline, _ = _offline_verdict(out, 4)
    assert not offline.hung  # the end state: nothing stuck
    printed = _report(out, 4)
    (episode,) = [line for line in printed.splitlines() if line.startswith("Hang episode")]
    match = re.match(r"Hang episode 1: ([\d.]+) s, step 4, rank\(s\) 0, 1, 2, 3 stuck, recovered$", episode)
    assert match and 5.0 <= float(match.group(1)) < 30.0, printed
    assert "  Hang verdict: culprit rank 2 (not_entered: " in printed, printed
    assert "has not entered allreduce" in printed or not ops_named(route), printed
    assert "  rank(s) 0, 1, 3 waiting on rank 2" in printed, printed


def test_a_rank_blocked_between_its_steps_is_alerted_and_named(tmp_path: Path):
    """Rank 1 sleeps 6 s after step 4's optimizer.step(), outside any step: the drain watches the time between
    steps, so it gets a stuck alert of its own (outside collectives) while the others wait in step 5's
    gradient all-reduce, and the verdict names it from the sequence numbers (issue 27)."""
    out = tmp_path / "out"
    args = ["--scenario", "after_step", "--culprit", "1", "--at-step", str(AT_STEP), "--hang-s", "6", "--steps", "10"]
    with Ranks(out, 3, args, env_for(out)) as ranks:
        assert wait_until(lambda: all(ranks.printed(r, r"DONE rank=\d") for r in range(3)), DEADLINE_S, 0.2), \
            ranks.outputs()
    (gap,) = [alert for alert in alerts(out, 1, sc.ALERT_KIND_STUCK) if not alert.attributes.get(sc.ALERT_REPEAT)]
    assert gap.attributes[sc.ALERT_SPAN_NAME] == sc.SPAN_BETWEEN_STEPS and "time.sleep" in gap.attributes.get(
        sc.ALERT_STACKS, "time.sleep"), gap.attributes
    printed = _report(out, 3)
    assert re.search(r"^Hang episode 1: [\d.]+ s, steps? [\d-]+, rank\(s\) 0, 1, 2 stuck, recovered$", printed,
                     re.M), printed
    assert "  Hang verdict: culprit rank 1 (not_entered: " in printed, printed
    assert "  rank(s) 0, 2 waiting on rank 1" in printed, printed


def test_a_slow_rank_before_a_logging_all_reduce_after_the_step_is_named(tmp_path: Path):
    """Every rank all-reduces its loss after optimizer.step() (a real loop's logging); rank 2 is slow just
    before it: the others wait in that all-reduce between steps, where no step span is open. Each gets a
    between-steps alert carrying the all-reduce it is inside, and the verdict names rank 2 (issue 27)."""
    out = tmp_path / "out"
    args = ["--scenario", "logging", "--culprit", "2", "--at-step", str(AT_STEP), "--hang-s", "6", "--steps", "10"]
    with Ranks(out, 3, args, env_for(out)) as ranks:
        assert wait_until(lambda: all(ranks.printed(r, r"DONE rank=\d") for r in range(3)), DEADLINE_S, 0.2), \
            ranks.outputs()
    for rank in (0, 1):
        (waiting,) = [a for a in alerts(out, rank, sc.ALERT_KIND_STUCK) if not a.attributes.get(sc.ALERT_REPEAT)]
        assert waiting.attributes[sc.ALERT_SPAN_NAME] == sc.SPAN_BETWEEN_STEPS
        assert waiting.attributes[sc.COLLECTIVE_PENDING] is True, waiting.attributes
    printed = _report(out, 3)
    assert "  Hang verdict: culprit rank 2 (not_entered: " in printed, printed
    assert "  rank(s) 0, 1 waiting on rank 2" in printed, printed


def test_a_healthy_job_with_checkpoint_and_evaluation_pauses_has_no_verdict(tmp_path: Path):
    out = tmp_path / "out"
    args = ["--scenario", "healthy", "--steps", "20", "--pause", "0.6"]
    with Ranks(out, 2, args, env_for(out)) as ranks:
        assert wait_until(lambda: all(ranks.printed(r, r"DONE rank=\d") for r in range(2)), DEADLINE_S, 0.2), \
            ranks.outputs()
        offline, _ = _offline_verdict(out, 2)
    assert not offline.hung, offline
    printed = _report(out, 2)  # checkpoint and evaluation pauses, and a logging all-reduce after each step
    assert "Hang verdict" not in printed and "Hang episode" not in printed, printed
    assert not any(alerts(out, rank, sc.ALERT_KIND_STUCK) for rank in range(2))
    # the pauses were visible to the gauges (rank 1 waited in a barrier while rank 0 saved)
    steps = [r for r in records(out, 1) if r.name == sc.SPAN_STEP]
    assert any(s.attributes.get(sc.COLLECTIVE_OP) == "barrier" for s in steps) or \
        any(s.attributes.get(sc.STEP_COLLECTIVES, 0) >= 3 for s in steps)
