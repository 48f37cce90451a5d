"""The device timeline end to end: a training process whose steps run on the fake asynchronous device
(tests/e2e/device_worker.py) exports to the real collector; its device steps and the stalled device
step's alert reach Jaeger, Prometheus's span metrics and rules, and Alertmanager's webhook.
"""

from __future__ import annotations

import re
import sys

from stack_helpers import wait_until
from training_helpers import (
    DEADLINE,
    E2E_MARKS,
    HERE,
    Training,
    alert_fired,
    jaeger_spans,
    new_job_id,
    prometheus_query,
    training_env,
)

pytestmark = E2E_MARKS

THRESHOLD_S = 2.0
STEPS, STALL_STEP = 30, 12


def test_a_stalled_device_step_alerted_through_the_pipeline(stack, alert_webhook, tmp_path):
    job_id = new_job_id("e2e-device")
    service = f"{job_id}-svc"
    env = training_env(stack, service=service, job_id=job_id)
    argv = [sys.executable, str(HERE / "device_worker.py"), str(THRESHOLD_S)]
    with Training(argv, env=env, log=tmp_path / "device.log", cwd=tmp_path) as worker:
        assert worker.wait(timeout=DEADLINE + 20) == 0, worker.output()[-4000:]
    out = worker.output()
    # Alerts (repeated every threshold while it stays stuck) name the stalled step's device execution
    # only, never the later step the host blocked in; then it recovers.
    raised = re.findall(r"ALERT (\w+) (\S+) (\d+)", out)
    assert {(name, step) for _, name, step in raised} == {("training.device_step", str(STALL_STEP))}, out
    kinds = [kind for kind, _, _ in raised]
    assert kinds[-1] == "recovered" and set(kinds[:-1]) == {"stuck"}, out
    delivered = int(re.search(r"delivered (\d+) spans, dropped 0", out).group(1))

    spans = wait_until(lambda: (s := jaeger_spans(stack.jaeger_url, service)) and len(s) >= delivered and s,
                       timeout=DEADLINE, what=f"the worker's {delivered} spans in Jaeger")
    hosts = {s["span_id"]: s for s in spans if s["name"] == "training.step"}
    devices = [s for s in spans if s["name"] == "training.device_step"]
    assert len(hosts) == len(devices) == STEPS
    for device_step in devices:  # each a child of its host step, in the same trace
        host = hosts[device_step["parent_id"]]
        assert host["attributes"]["training.step.device_timed"] is True
        assert device_step["attributes"]["training.step"] == host["attributes"]["training.step"]
        assert device_step["trace_id"] == host["trace_id"]
    (stalled,) = [s for s in devices if s["attributes"]["training.step"] == STALL_STEP]
    assert stalled["duration_us"] >= THRESHOLD_S * 1e6
    alerts = [s for s in spans if s["name"] == "training.alert"]
    assert sorted(a["attributes"]["training.alert.kind"] for a in alerts) == sorted(kinds)
    assert {a["attributes"]["training.alert.span.id"] for a in alerts} == {stalled["span_id"]}
    stuck = next(a["attributes"] for a in alerts if a["attributes"]["training.alert.count"] == 1
                 and a["attributes"]["training.alert.kind"] == "stuck")
    assert stuck["training.alert.span.id"] == stalled["span_id"]
    assert stuck["training.device"] == "fake:0" and stuck["training.device.last_completed_step"] == STALL_STEP - 1
    assert stuck["training.step.launched"] is True

    # Prometheus: span metrics for the device steps (the step-time and no-progress rules use them).
    def device_calls():
        found = prometheus_query(stack.prometheus_url,
                                 f'sum(traces_span_metrics_calls_total{{span_name="training.device_step",'
                                 f'training_job_id="{job_id}"}})')
        return found if found and float(found[0]["value"][1]) >= STEPS else None

    wait_until(device_calls, timeout=DEADLINE, what="device-step span metrics in Prometheus")
    (fired,) = wait_until(lambda: alert_fired(stack.prometheus_url, "TrainingStepStuck", job_id),
                          timeout=DEADLINE, what="TrainingStepStuck firing in Prometheus")
    assert fired["metric"]["training_rank"] == "0"
    alert_webhook.wait_for_alert(lambda p, a: a["labels"].get("alertname") == "TrainingStepStuck"
                                 and a["labels"].get("training_job_id") == job_id and a["status"] == "resolved",
                                 timeout=DEADLINE)
