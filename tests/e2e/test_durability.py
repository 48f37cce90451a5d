"""Nothing lost when a part of the pipeline restarts (the real binaries, a stack of the module's own):

* Jaeger (Badger store) killed with SIGKILL and restarted: every trace written
  before is still there, whole, and new ones are written after;
* the collector killed with SIGKILL while Jaeger is down, holding every span a
  rank sent in its persistent sending queue: after both come back, every one
  of those spans is in Jaeger;
* the collector killed with SIGKILL and restarted under a running rank: every
  span the rank's exporter saw acknowledged is in Jaeger (none lost silently),
  and what the rank could not deliver is counted by its ``FlushResult``.

Counts come from Jaeger's query API against what the rank says it sent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import otelstack as stack_mod  # scripts/stack/otelstack/
import pytest
from stack_helpers import scrape_samples, wait_until
from training_helpers import (
    DEADLINE,
    E2E_MARKS,
    Training,
    jaeger_spans,
    new_job_id,
    read_timings,
    training_env,
    worker_argv,
)

pytestmark = E2E_MARKS


@pytest.fixture(scope="module")
def durable_stack(stack_binaries, alert_webhook, tmp_path_factory) -> Iterator[stack_mod.Stack]:
    """A stack of this module's own: its Jaeger and collector get killed."""
    own = stack_mod.Stack(tmp_path_factory.mktemp("durable-stack"), binaries=stack_binaries,
                          webhook_url=alert_webhook.url, fast=True)
    try:
        with own:
            yield own
    except stack_mod.StackError as exc:
        pytest.fail(f"the durability tests' stack did not start: {exc}", pytrace=False)
    assert not [name for name, proc in own.procs.items() if proc.running()], "stack processes survived stop()"


def _run_worker(stack: stack_mod.Stack, tmp_path: Path, service: str, *args: str, **env: str) -> dict:
    """train_worker.py to completion; its result (FlushResult and spans ended)."""
    result_file = tmp_path / f"{service}.json"
    environment = training_env(stack, service=service, job_id=new_job_id(service), **env)
    with Training(worker_argv(*args, "--result", str(result_file)), env=environment, log=tmp_path / f"{service}.log") as worker:
        assert worker.wait(timeout=DEADLINE * 2) == 0, worker.output()[-4000:]
        worker.wait_all_exited(timeout=30)
    return json.loads(result_file.read_text())


def _span_ids(stack: stack_mod.Stack, service: str) -> set[str]:
    return {span["span_id"] for span in jaeger_spans(stack.jaeger_url, service)}


def _wait_for_spans(stack: stack_mod.Stack, service: str, count: int, timeout: float = DEADLINE) -> set[str]:
    return wait_until(lambda: (ids := _span_ids(stack, service)) and len(ids) >= count and ids, timeout=timeout,
                      what=f"{count} spans of {service} in Jaeger")


def _collector_counter(stack: stack_mod.Stack, name: str, **labels: str) -> float:
    return sum(value for sample_labels, value in scrape_samples(stack.collector_telemetry_url, name)
               if all(sample_labels.get(k) == v for k, v in labels.items()))


def test_jaeger_killed_and_restarted_keeps_every_trace(durable_stack, tmp_path):
    stack = durable_stack
    service = new_job_id("durable-jaeger")
    result = _run_worker(stack, tmp_path, service, "--epochs", "2", "--steps", "15")
    assert result["dropped"] == 0 and result["exported"] == result["spans_ended"], result
    before = _wait_for_spans(stack, service, result["exported"])
    traces_before = {span["trace_id"] for span in jaeger_spans(stack.jaeger_url, service)}

    stack.kill("jaeger")  # SIGKILL: no chance to flush or close the store
    stack.restart("jaeger")

    after = _span_ids(stack, service)
    assert after == before, f"{len(before - after)} spans lost across the Jaeger restart"
    # Each trace reads back whole by id, not only through the search.
    by_id = set()
    for trace_id in traces_before:
        status, body = stack_mod.http_get(f"{stack.jaeger_url}/api/traces/{trace_id}")
        assert status == 200, body[:300]
        (trace,) = json.loads(body)["data"]
        by_id |= {span["spanID"] for span in trace["spans"]}
    assert by_id == before

    # The store still takes writes after recovering.
    again = new_job_id("durable-jaeger-after")
    later = _run_worker(stack, tmp_path, again, "--steps", "5")
    _wait_for_spans(stack, again, later["exported"])
    print(f"Jaeger SIGKILL + restart: {len(before)} spans in {len(traces_before)} traces before, {len(after)} after")


def test_collector_killed_with_a_full_queue_delivers_it_after_restart(durable_stack, tmp_path):
    """Jaeger down: the collector acknowledges the rank's spans and keeps them on disk;
    killed with SIGKILL and started again, it sends every one of them."""
    stack = durable_stack
    service = new_job_id("durable-queue")
    stack.kill("jaeger")
    try:
        accepted_before = _collector_counter(stack, "otelcol_receiver_accepted_spans", receiver="otlp")
        result = _run_worker(stack, tmp_path, service, "--epochs", "2", "--steps", "20")
        # Jaeger is down, yet the rank delivered everything: the collector took it.
        assert result["dropped"] == 0 and result["exported"] == result["spans_ended"], result
        accepted = wait_until(
            lambda: (n := _collector_counter(stack, "otelcol_receiver_accepted_spans", receiver="otlp") - accepted_before)
            >= result["exported"] and n, timeout=DEADLINE, what="the collector's accepted-spans counter")
        assert accepted == result["exported"]
        stack.kill("collector")  # SIGKILL with the spans still queued
    finally:
        stack.restart("jaeger")
    assert _span_ids(stack, service) == set(), "spans reached Jaeger while it was down?"
    stack.restart("collector")
    ids = _wait_for_spans(stack, service, result["exported"])
    assert len(ids) == result["exported"], (len(ids), result)
    print(f"collector SIGKILL with Jaeger down: {result['exported']} spans acknowledged to the rank, "
          f"{len(ids)} in Jaeger after the restart")


STEP_TIME_S = 0.02
DOWNTIME_S = 3.0


def _until_stopped(tmp_path: Path) -> tuple[list[str], Path, Path, Path]:
    """train_worker.py stepping every 20 ms until its stop file appears: argv, stop file, timings, result."""
    stop_file, timings_file, result_file = tmp_path / "stop", tmp_path / "timings.jsonl", tmp_path / "result.json"
    argv = worker_argv("--steps", "100000", "--step-time", str(STEP_TIME_S), "--substeps", "2", "--stop-file", str(stop_file),
                       "--timings", str(timings_file), "--result", str(result_file))
    return argv, stop_file, timings_file, result_file


def test_collector_killed_under_load_loses_no_acknowledged_span(durable_stack, tmp_path):
    stack = durable_stack
    service = new_job_id("durable-crash")
    argv, stop_file, timings_file, result_file = _until_stopped(tmp_path)
    env = training_env(stack, service=service, job_id=new_job_id("durable-crash"))
    with Training(argv, env=env, log=tmp_path / "worker.log") as worker:
        _wait_for_spans(stack, service, 30)
        stack.kill("collector")
        down = time.time()
        wait_until(lambda: (t := read_timings(timings_file)) and t[-1]["start"] > down + DOWNTIME_S, timeout=DEADLINE,
                   what=f"{DOWNTIME_S} s of training with the collector down")
        stack.restart("collector")
        last = read_timings(timings_file)[-1]["step"]
        wait_until(lambda: read_timings(timings_file)[-1]["step"] >= last + 50, timeout=DEADLINE, what="50 more steps")
        stop_file.touch()
        assert worker.wait(timeout=DEADLINE) == 0, worker.output()[-4000:]
        worker.wait_all_exited(timeout=10)

    result = json.loads(result_file.read_text())
    assert result["pending"] == 0
    assert result["exported"] + result["dropped"] == result["spans_ended"], result
    # Every span the rank saw acknowledged is in Jaeger. A batch whose answer was
    # lost in the kill may be in Jaeger although the rank counted it as dropped,
    # so Jaeger may hold more than "exported", never more than the rank ended.
    ids = _wait_for_spans(stack, service, result["exported"])
    assert result["exported"] <= len(ids) <= result["spans_ended"], (len(ids), result)
    steps = len(read_timings(timings_file))
    print(f"collector SIGKILL under load ({steps} steps, down {DOWNTIME_S:.0f} s+): rank ended {result['spans_ended']} spans, "
          f"acknowledged {result['exported']}, dropped and counted {result['dropped']}; in Jaeger {len(ids)}; "
          f"acknowledged but missing: {max(0, result['exported'] - len(ids))}")


SHORT_OUTAGE_S = 5.0


def test_a_short_collector_outage_costs_the_sdk_nothing(durable_stack, tmp_path):
    """With the SDK's defaults (queue 2048 spans, OTLP retries within 10 s), a rank
    making about 100 spans/s rides out a 5 s outage: nothing dropped, all in Jaeger."""
    stack = durable_stack
    service = new_job_id("durable-outage")
    argv, stop_file, timings_file, result_file = _until_stopped(tmp_path)
    env = training_env(stack, service=service, job_id=service)
    env.pop("OTEL_BSP_SCHEDULE_DELAY")  # the SDK's default 5 s, not the tests' 200 ms
    with Training(argv, env=env, log=tmp_path / "worker.log") as worker:
        _wait_for_spans(stack, service, 30)
        stack.kill("collector")
        down = time.time()
        wait_until(lambda: time.time() - down >= SHORT_OUTAGE_S, timeout=SHORT_OUTAGE_S + 5, interval=0.05, what="the outage")
        stack.restart("collector")
        up = time.time()
        wait_until(lambda: read_timings(timings_file)[-1]["start"] > up + 2, timeout=DEADLINE, what="2 s after the restart")
        stop_file.touch()
        assert worker.wait(timeout=DEADLINE) == 0, worker.output()[-4000:]
    result = json.loads(result_file.read_text())
    timings = read_timings(timings_file)
    during = [t for t in timings if down <= t["start"] <= up]
    rate = result["spans_ended"] / (timings[-1]["start"] - timings[0]["start"])
    assert result["dropped"] == 0 and result["exported"] == result["spans_ended"], result
    ids = _wait_for_spans(stack, service, result["exported"])
    assert len(ids) == result["spans_ended"]
    print(f"collector down {up - down:.1f} s under a rank making {rate:.0f} spans/s ({len(during)} steps meanwhile): "
          f"SDK defaults dropped 0 of {result['spans_ended']} spans, all in Jaeger")
