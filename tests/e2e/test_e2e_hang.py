"""The job-level hang verdict live, end to end: local gloo ranks of a DDP job (tests/hang_worker.py)
export to the real collector; Prometheus evaluates collector-config/alert-rules.yml on what it
scrapes; Alertmanager posts to the test's webhook.

Each case expects one page for the job, naming the culprit (or saying there is none), and no
per-rank stuck page. The bound, measured from the moment the ranks' stuck detectors report (the
hang's first sign, STUCK_S after the hang began): the span-metrics flush (1 s) + one metric export
(0.5 s) + one scrape (1 s) + one rule evaluation (1 s) + the rules' ``for:`` (here 1 s) + Alertmanager's
group wait (1 s), about 5.5 s; asserted with slack for a loaded 2-core machine. With the shipped
settings: flush 15 s + export 60 s + scrape 15 s + evaluation 15 s + for 30 s + group wait 5 s.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import otelstack as stack_mod  # scripts/stack/otelstack/
import pytest
from hang_ranks import Ranks
from requirements import require
from stack_helpers import WebhookReceiver
from training_helpers import DEADLINE, E2E_MARKS, alert_fired, new_job_id, training_env

require("torch")
from otel_training.integrations.torch.collective_routes import route, supported  # noqa: E402

pytestmark = [*E2E_MARKS, pytest.mark.skipif(route()[0] == "off", reason=f"no collective tracking: {route()[1]}")]


@pytest.fixture(params=["hooks", "sequence"])
def tracking(request: pytest.FixtureRequest) -> str:
    """Each case on both tracking routes: torch's hooks, and the sequence route older torch takes."""
    if request.param == "hooks" and not supported():
        pytest.skip(f"{route()[1]}: the sequence route runs instead")
    return str(request.param)

STUCK_S = 2.0
#: The verdict's for: window, shortened like the other windows of the test stack.
FOR_S = 1.0
BOUND_S = 1.0 + 0.5 + 1.0 + 1.0 + FOR_S + 1.0
#: Slack for a loaded machine (several torch processes, the stack and other tests on 2 cores).
SLACK_S = 20.0
AT_STEP = 4


@pytest.fixture(scope="module")
def hang_stack(stack_binaries, alert_webhook, tmp_path_factory) -> Iterator[stack_mod.Stack]:
    own = stack_mod.Stack(tmp_path_factory.mktemp("hang-stack"), binaries=stack_binaries,
                          webhook_url=alert_webhook.url, fast=True, rule_replacements={"for: 30s": f"for: {FOR_S:.0f}s"})
    try:
        with own:
            yield own
    except stack_mod.StackError as exc:
        pytest.fail(f"the hang tests' stack did not start: {exc}", pytrace=False)


def _notifications(webhook: WebhookReceiver, job_id: str) -> list[dict]:
    return [alert for payload in list(webhook.payloads) for alert in payload.get("alerts", [])
            if alert["labels"].get("training_job_id") == job_id and alert["status"] == "firing"]


def _run(stack, webhook: WebhookReceiver, tmp_path: Path, world: int, args: list[str], alertname: str,
         tracking: str, **env: str) -> tuple[dict, list[dict], float]:
    """Run the ranks until ``alertname`` reaches the webhook for the job; return it, every firing
    notification of the job, and the seconds from the first stuck report to it."""
    job_id = new_job_id("e2e-hang")
    out = tmp_path / "out"
    env = training_env(stack, service=f"{job_id}-svc", job_id=job_id, OTEL_TRAINING_STUCK_THRESHOLD_S=str(STUCK_S),
                       TORCH_FR_BUFFER_SIZE="200", OTEL_TRAINING_COLLECTIVE_TRACKING=tracking, **env)
    with Ranks(out, world, [*args, "--at-step", str(AT_STEP)], env) as ranks:
        def hung() -> float | None:
            for rank in range(world):
                if ranks.printed(rank, r"HANG rank=\d+ step=\d+"):
                    return time.time()
            return None

        began = stack_mod.wait_until(hung, timeout=DEADLINE * 3, interval=0.05, what="a rank to hang")
        _, alert = webhook.wait_for_alert(
            lambda payload, a: a["labels"].get("alertname") == alertname and a["labels"].get("training_job_id") == job_id
            and a["status"] == "firing", timeout=DEADLINE * 2)
        delay = time.time() - (began + STUCK_S)
        # Prometheus has evaluated the rules up to the verdict: a per-rank stuck page would be in
        # its alert history by now (rules of one group run in order at one evaluation time)
        stuck = alert_fired(stack.prometheus_url, "TrainingStepStuck", job_id)
        return alert, _notifications(webhook, job_id) + [{"labels": s["metric"]} for s in stuck], delay


def _pages(notifications: list[dict]) -> set[tuple[str, str]]:
    return {(a["labels"]["alertname"], a["labels"].get("training_rank", "")) for a in notifications
            if a["labels"].get("severity") == "page"}


@pytest.mark.parametrize(("scenario", "culprit", "reason", "culprit_op", "waiting_op"), [
    ("sleeper", 1, "not_entered", "allgather", "allreduce"),  # asleep before its forward pass
    ("skip", 2, "mismatch", "allreduce", "allgather"),  # skipped the loss all_gather
    # slow before the logging all_reduce every rank makes after optimizer.step(): the others wait in it
    # between steps, alerted by the drain's watch of that time (issue 27)
    ("logging", 2, "not_entered", "allgather", "allreduce"),
])
def test_the_culprit_is_named_in_one_page(hang_stack, alert_webhook, tmp_path, scenario, culprit, reason,
                                          culprit_op, waiting_op, tracking):
    alert, notifications, delay = _run(hang_stack, alert_webhook, tmp_path, 3,
                                       ["--scenario", scenario, "--culprit", str(culprit)], "TrainingHangCulprit",
                                       tracking)
    assert alert["labels"]["training_rank"] == str(culprit) and alert["labels"]["reason"] == reason, alert
    assert f"It last entered {culprit_op}" in alert["annotations"]["description"]
    assert f"rank 0 in {waiting_op}" in alert["annotations"]["description"]
    assert _pages(notifications) == {("TrainingHangCulprit", str(culprit))}, notifications
    assert delay < BOUND_S + SLACK_S, f"notified {delay:.1f} s after the stuck reports (bound {BOUND_S} s)"
    print(f"{scenario}: culprit page {delay:.1f} s after the stuck reports (bound {BOUND_S} s + slack)")


def test_a_sigkilled_rank_pages_once_as_died(hang_stack, alert_webhook, tmp_path, tracking):
    alert, notifications, _ = _run(hang_stack, alert_webhook, tmp_path, 3,
                                   ["--scenario", "kill", "--culprit", "1"], "TrainingRankDied", tracking,
                                   OTEL_TRAINING_WATCHDOG="true")
    assert alert["labels"]["training_rank"] == "1", alert
    # gloo fails the survivors' collective at once (no one is left waiting, so no culprit page
    # either); the died alert is the one page
    assert _pages(notifications) == {("TrainingRankDied", "1")}, notifications


def test_ranks_delayed_equally_page_once_with_no_single_culprit(hang_stack, alert_webhook, tmp_path, tracking):
    alert, notifications, delay = _run(hang_stack, alert_webhook, tmp_path, 2, ["--scenario", "equal"],
                                       "TrainingHangNoCulprit", tracking)
    assert "rank 0 last entered allgather" in alert["annotations"]["description"]
    assert _pages(notifications) == {("TrainingHangNoCulprit", "")}, notifications
    assert delay < BOUND_S + SLACK_S
    print(f"equal: no-culprit page {delay:.1f} s after the stuck reports")
