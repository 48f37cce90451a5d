"""End to end with the package when things break, on a stack of the module's
own (its collector gets killed, and its no-progress rule has short windows):

* a rank killed with SIGKILL mid-step under torchrun: the sidecar watchdog
  reports it (a ``died`` alert span in the alerts sink and Jaeger,
  ``TrainingRankDied`` at the webhook), and Prometheus' ``TrainingNoProgress``
  sees the job stop;
* the collector killed mid-run and restarted: the training loop never waits,
  spans after the recovery arrive in Jaeger, and the spans lost meanwhile are
  counted the same by the final ``FlushResult``, the shutdown log line and the
  ``training.telemetry.spans.dropped`` metric (which fires its rule);
* a rank frozen with the GIL held (the watchdog speaks for it), then back: one
  episode and one recovery, so ``TrainingStepStuck`` fires and resolves;
* the collector self-telemetry rules match the counter names of the
  collector release we run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import statistics
import time
from collections.abc import Iterator

import otelstack as stack_mod  # scripts/stack/otelstack/
import pytest
import yaml
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from stack_helpers import read_alert_sink, scrape_samples, wait_until
from training_helpers import (
    DEADLINE,
    E2E_MARKS,
    Training,
    alert_fired,
    jaeger_spans,
    new_job_id,
    prometheus_query,
    read_timings,
    torchrun_argv,
    training_env,
    worker_argv,
)

pytestmark = E2E_MARKS

# TrainingNoProgress waits for 10 minutes without a step, then 2 more; here 10 s and 2 s.
NO_PROGRESS_WINDOW = {"[10m]": "[10s]", "for: 2m": "for: 2s"}


@pytest.fixture(scope="module")
def failure_stack(stack_binaries, alert_webhook, tmp_path_factory) -> Iterator[stack_mod.Stack]:
    """A stack of this module's own, stopped when the module is done."""
    own = stack_mod.Stack(tmp_path_factory.mktemp("failure-stack"), binaries=stack_binaries,
                          webhook_url=alert_webhook.url, fast=True, rule_replacements=NO_PROGRESS_WINDOW)
    try:
        with own:  # start() ... stop()
            yield own
    except stack_mod.StackError as exc:
        pytest.fail(f"the failure tests' stack did not start: {exc}", pytrace=False)
    assert not [name for name, proc in own.procs.items() if proc.running()], "stack processes survived stop()"


def _webhook_alert(alertname: str, job_id: str, status: str = "firing"):
    return lambda payload, alert: (alert["labels"].get("alertname") == alertname
                                   and alert["labels"].get("training_job_id") == job_id
                                   and alert["status"] == status)


def _step_count(stack, job_id: str, rank: int) -> float:
    return sum(value for labels, value in scrape_samples(stack.collector_metrics_url, "traces_span_metrics_calls_total")
               if labels.get("training_job_id") == job_id and labels.get("span_name") == "training.step"
               and labels.get("training_rank") == str(rank))


HANG_RANK, HANG_STEP = 1, 5


def test_rank_killed_with_sigkill_mid_step_is_reported(failure_stack, alert_webhook, tmp_path):
    stack = failure_stack
    job_id = new_job_id("e2e-kill")
    service = f"{job_id}-svc"
    env = training_env(stack, service=service, job_id=job_id, OTEL_TRAINING_WATCHDOG="true")
    argv = torchrun_argv(2, "--steps", "1000", "--hang-rank", str(HANG_RANK), "--hang-step", str(HANG_STEP))
    with Training(argv, env=env, log=tmp_path / "torchrun.log") as job:
        hang = job.wait_for_output(rf"HANG rank={HANG_RANK} step={HANG_STEP} pid=(\d+)", timeout=120)
        pid = int(hang.group(1))
        # Everything before the hung step is delivered; then the kill, mid-step.
        wait_until(lambda: _step_count(stack, job_id, HANG_RANK) >= HANG_STEP, timeout=DEADLINE,
                   what=f"rank {HANG_RANK}'s first {HANG_STEP} steps at the collector")
        os.kill(pid, signal.SIGKILL)
        # torchrun sees the rank die, stops the other one and fails.
        assert job.wait(timeout=DEADLINE) != 0
        # The watchdogs report and exit on their own: nothing is left.
        job.wait_all_exited(timeout=30)

    # --- the watchdog's died alert: alerts pipeline -> file sink ----------
    def died_in_sink():
        return [s for s in read_alert_sink(stack.alerts_file)
                if s["resource"].get("training.job.id") == job_id and s["attributes"].get("training.alert.kind") == "died"]

    (died,) = wait_until(died_in_sink, timeout=DEADLINE, what=f"the died alert in {stack.alerts_file}")
    assert died["name"] == "training.alert"
    assert died["resource"]["training.rank"] == HANG_RANK
    assert died["resource"]["process.pid"] == pid
    assert died["resource"]["service.name"] == service
    attrs = died["attributes"]
    assert attrs["training.alert.source"] == "watchdog"
    assert attrs["training.alert.pid"] == pid
    assert attrs["training.alert.span.name"] == "training.step"
    assert attrs["training.step"] == HANG_STEP and attrs["training.epoch"] == 0

    # --- ... and Jaeger, in the dead rank's trace, under the step it died in, which the
    # watchdog exports (rebuilt from the slot, status ERROR) since the process never could
    def died_in_jaeger():
        spans = jaeger_spans(stack.jaeger_url, service)
        ids = {s["span_id"] for s in spans}
        return spans if died["spanId"] in ids and attrs["training.alert.span.id"] in ids else None

    spans = wait_until(died_in_jaeger, timeout=DEADLINE, what="the died alert in Jaeger")
    (alert,) = [s for s in spans if s["span_id"] == died["spanId"]]
    assert alert["resource"]["training.rank"] == HANG_RANK
    assert alert["attributes"]["training.alert.span.id"] in {ref for _, ref in alert["references"]}
    dead_rank = [s for s in spans if s["resource"]["training.rank"] == HANG_RANK]
    assert sorted(s["attributes"]["training.step"] for s in dead_rank if s["name"] == "training.step") == list(range(HANG_STEP + 1))
    (dead_step,) = [s for s in dead_rank if s["span_id"] == attrs["training.alert.span.id"]]
    assert dead_step["attributes"]["training.step"] == HANG_STEP
    assert dead_step["attributes"].get("otel.status_code") == "ERROR", dead_step
    # The surviving rank's open spans were ended as errors when its peer vanished.
    survivor = {s["name"]: s for s in spans if s["resource"]["training.rank"] != HANG_RANK and s["name"] in ("training.train", "training.epoch")}
    assert sorted(survivor) == ["training.epoch", "training.train"]
    assert all(s["attributes"].get("otel.status_code") == "ERROR" for s in survivor.values()), survivor

    # --- Prometheus and Alertmanager: the death, and no progress ----------
    (fired,) = wait_until(lambda: alert_fired(stack.prometheus_url, "TrainingRankDied", job_id),
                          timeout=DEADLINE, what="TrainingRankDied firing in Prometheus")
    assert fired["metric"]["training_rank"] == str(HANG_RANK)
    _, delivered = alert_webhook.wait_for_alert(_webhook_alert("TrainingRankDied", job_id), timeout=DEADLINE)
    assert delivered["labels"]["training_rank"] == str(HANG_RANK)
    assert delivered["annotations"]["summary"] == f"Training process died: job {job_id}, rank {HANG_RANK}"

    wait_until(lambda: alert_fired(stack.prometheus_url, "TrainingNoProgress", job_id),
               timeout=DEADLINE, what="TrainingNoProgress firing in Prometheus")
    _, stalled = alert_webhook.wait_for_alert(_webhook_alert("TrainingNoProgress", job_id), timeout=DEADLINE)
    assert stalled["annotations"]["summary"] == f"No training progress: job {job_id}"


FREEZE_S, FREEZE_THRESHOLD_S = 12, 2.0


def test_rank_frozen_with_the_gil_held_then_back_pages_once_and_resolves(failure_stack, alert_webhook, tmp_path):
    """Issue 29: the watchdog alerts while the process cannot (GIL held in a C call), the process's own
    detector continues that episode once back, and the span's end is its one recovery: the page resolves."""
    stack = failure_stack
    job_id = new_job_id("e2e-gil")
    env = training_env(stack, service=f"{job_id}-svc", job_id=job_id, OTEL_TRAINING_WATCHDOG="true",
                       OTEL_TRAINING_STUCK_THRESHOLD_S=str(FREEZE_THRESHOLD_S))
    argv = worker_argv("--steps", "6", "--hang-rank", "0", "--hang-step", "3", "--freeze-gil", str(FREEZE_S))
    with Training(argv, env=env, log=tmp_path / "worker.log") as job:
        assert job.wait(timeout=DEADLINE + FREEZE_S) == 0, job.output()[-4000:]
        job.wait_all_exited(timeout=30)
    assert "FREEZE rank=0 step=3" in job.output()

    def episode() -> list | None:
        found = [s["attributes"] for s in read_alert_sink(stack.alerts_file)
                 if s["resource"].get("training.job.id") == job_id]
        return found if any(a["training.alert.kind"] == "recovered" for a in found) else None

    alerts = wait_until(episode, timeout=DEADLINE, what=f"the frozen rank's recovery in {stack.alerts_file}")
    # the sink holds every thread's stack: the owner's alone, as the trace files are (issue 30 item 14); the
    # collector's file exporter chmods what it creates to 0644 whatever the umask, so its directory is closed
    for directory in (stack.alerts_file.parent, stack.run_dir):
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700, directory
    stuck = [a for a in alerts if a["training.alert.kind"] == "stuck"]
    first = [a for a in stuck if not a.get("training.alert.repeat")]
    assert len(first) == 1 and first[0]["training.alert.source"] == "watchdog", alerts
    assert [a["training.alert.kind"] for a in alerts].count("recovered") == 1, alerts
    assert {a["training.alert.span.id"] for a in alerts} == {first[0]["training.alert.span.id"]}
    # Back, the process either alerted first (it took the episode over: its alerts are repeats and the recovery
    # is its) or its step ended before it could (the watchdog's recovery): either way, one of each.

    def stuck_alert(status):
        return lambda p, a: (a["labels"].get("alertname") == "TrainingStepStuck"
                             and a["labels"].get("training_job_id") == job_id and a["status"] == status)

    alert_webhook.wait_for_alert(stuck_alert("firing"), timeout=DEADLINE)
    alert_webhook.wait_for_alert(stuck_alert("resolved"), timeout=DEADLINE)


STEP_TIME_S = 0.02
DOWNTIME_S = 5.0


def test_collector_killed_and_restarted_training_never_blocks_and_drops_are_counted(failure_stack, alert_webhook, tmp_path):
    stack = failure_stack
    job_id = new_job_id("e2e-outage")
    service = f"{job_id}-svc"
    stop_file, timings_file, result_file = tmp_path / "stop", tmp_path / "timings.jsonl", tmp_path / "result.json"
    # A 1 s export deadline (default 10 s) makes every batch exported while
    # the collector is down fail, so the test sees spans dropped for sure.
    env = training_env(stack, service=service, job_id=job_id, OTEL_EXPORTER_OTLP_TIMEOUT="1")
    argv = worker_argv("--steps", "100000", "--step-time", str(STEP_TIME_S), "--substeps", "2", "--stop-file", str(stop_file),
                       "--timings", str(timings_file), "--result", str(result_file))

    def steps_done() -> list[dict]:
        return read_timings(timings_file)

    def in_jaeger() -> set[int]:
        return {s["attributes"]["training.step"] for s in jaeger_spans(stack.jaeger_url, service) if s["name"] == "training.step"}

    with Training(argv, env=env, log=tmp_path / "worker.log") as worker:
        # Delivering before the outage.
        wait_until(lambda: len(in_jaeger()) >= 20, timeout=DEADLINE, what="the first 20 steps in Jaeger")
        stack.kill("collector")  # SIGKILL
        down = time.time()
        wait_until(lambda: (t := steps_done()) and t[-1]["start"] > down + DOWNTIME_S, timeout=DEADLINE,
                   what=f"{DOWNTIME_S} s of training with the collector down")
        up = time.time()
        stack.restart("collector")
        restarted = time.time()

        # Spans of steps begun after the restart reach Jaeger (the exporter's
        # gRPC channel may first wait out its reconnect back-off).
        def recovered() -> int | None:
            delivered = {t["step"] for t in steps_done() if t["start"] > restarted} & in_jaeger()
            return min(delivered) if delivered else None

        first_recovered = wait_until(recovered, timeout=DEADLINE, what="steps begun after the restart in Jaeger")
        recovery_delay = next(t["start"] for t in steps_done() if t["step"] == first_recovered) - restarted
        assert recovery_delay < 10.0, f"the first step delivered after the restart began {recovery_delay:.1f} s after it"
        last_before_stop = steps_done()[-1]["step"]
        wait_until(lambda: steps_done()[-1]["step"] >= last_before_stop + 50, timeout=DEADLINE, what="50 more steps")
        stop_file.touch()
        assert worker.wait(timeout=DEADLINE) == 0, worker.output()[-4000:]
        worker.wait_all_exited(timeout=10)

    # --- the loop never waited for the exporter -----------------------------
    timings = steps_done()
    baseline = [t["wall_s"] for t in timings if t["start"] + t["wall_s"] < down]
    outage = [t["wall_s"] for t in timings if down <= t["start"] and t["start"] + t["wall_s"] <= up]
    assert len(outage) >= 50, f"only {len(outage)} steps ran while the collector was down"
    # A step that waited on an export would take about the 1 s export
    # deadline (or a retry back-off); the bounds leave room for a loaded
    # machine's scheduling, measured on the steps before the outage.
    bound = max(0.5, 2 * max(baseline))
    assert max(outage) < bound, f"a step took {max(outage):.3f} s while the collector was down (bound {bound:.3f} s)"
    assert statistics.median(outage) < 2 * statistics.median(baseline), (statistics.median(outage), statistics.median(baseline))

    # --- the count of undelivered spans: FlushResult, log line, metric ------
    result = json.loads(result_file.read_text())
    assert result["pending"] == 0
    assert result["dropped"] > 0, result
    assert result["exported"] + result["dropped"] == result["spans_ended"], result
    assert re.search(rf"otel_training: {result['dropped']} span\(s\) were not delivered by the otlp exporter "
                     rf"\({result['exported']} delivered\)", worker.output()), worker.output()[-3000:]

    def dropped_metric():
        values = [v for labels, v in scrape_samples(stack.collector_metrics_url, "training_telemetry_spans_dropped_total")
                  if labels.get("training_job_id") == job_id]
        return values if values and values[0] == result["dropped"] else None

    wait_until(dropped_metric, timeout=DEADLINE, what=f"training_telemetry_spans_dropped_total == {result['dropped']} at the collector")
    wait_until(lambda: alert_fired(stack.prometheus_url, "TrainingTelemetrySpansDropped", job_id),
               timeout=DEADLINE, what="TrainingTelemetrySpansDropped firing in Prometheus")
    alert_webhook.wait_for_alert(_webhook_alert("TrainingTelemetrySpansDropped", job_id), timeout=DEADLINE)

    # --- what Jaeger has: everything but the outage -------------------------
    def all_delivered():
        steps = in_jaeger()
        return steps if max(steps) == timings[-1]["step"] else None

    steps = wait_until(all_delivered, timeout=DEADLINE, what="the last step in Jaeger")
    missing = sorted({t["step"] for t in timings} - steps)
    assert missing, "no step was lost although spans were dropped"
    starts = {t["step"]: t["start"] for t in timings}
    # Lost: only steps around the outage (a batch in flight at the kill, the
    # collector's own queues, the exporter's reconnect after the restart);
    # from the first step delivered after the restart on, nothing.
    assert min(starts[s] for s in missing) > down - 2.0, missing
    assert max(missing) < first_recovered, missing
    # Each ended span reaches Jaeger at most once. Not "at most the exported count": an export the exporter
    # gave up on at its 1 s deadline, counted dropped, may still have reached the restarted collector on a
    # loaded machine (CI, 2026-12-05: 822 spans in Jaeger, 666 acknowledged).
    assert len(jaeger_spans(stack.jaeger_url, service)) <= result["spans_ended"]
    print(f"collector outage {up - down:.1f} s; {len(outage)} steps meanwhile, median {statistics.median(outage) * 1e3:.1f} ms "
          f"(before {statistics.median(baseline) * 1e3:.1f} ms), max {max(outage) * 1e3:.1f} ms; "
          f"spans delivered {result['exported']}, dropped {result['dropped']}; steps missing in Jaeger {len(missing)}; "
          f"first step delivered after the restart began {recovery_delay:.1f} s after it")


def test_collector_self_telemetry_rules_see_the_pinned_collector(stack):
    """CollectorRefusingSpans' expression, evaluated by Prometheus on what it
    scraped from the real collector, has a series for it (the rule must match
    the counter names this collector release exposes)."""
    rules = yaml.safe_load((stack_mod.CONFIG_DIR / "alert-rules.yml").read_text())
    (expr,) = [r["expr"] for g in rules["groups"] for r in g["rules"] if r.get("alert") == "CollectorRefusingSpans"]
    assert expr.rstrip().endswith("> 0")
    every_value = expr.rstrip()[: -len("> 0")] + ">= 0"
    # The collector creates its receiver counters on the first request.
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=stack.otlp_grpc_endpoint, insecure=True, timeout=10)))
    provider.get_tracer("e2e").start_span("e2e.probe").end()
    provider.shutdown()

    def collector_series():
        return [r for r in prometheus_query(stack.prometheus_url, every_value)
                if r["metric"].get("job") == "otel-collector" and r["metric"].get("receiver") == "otlp"]

    wait_until(collector_series, timeout=DEADLINE, what="the collector's refused-spans counter through the rule's expression")
