"""A job whose collector was unreachable loses nothing: its spool, sent later, is in Jaeger.

A real training process exports OTLP to a port where nothing listens, with
``spool_dir`` set; every span it ends goes to the spool. ``otel-training spool
send`` then posts the spool to the real collector's OTLP/HTTP receiver, and
Jaeger's API holds every step, with its parent and attributes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from otelstack import wait_until
from otlp_json import read_spans
from training_helpers import REPO, jaeger_spans, new_job_id

pytestmark = pytest.mark.e2e

STEPS = 40


def test_a_spool_written_while_no_collector_answered_is_sent_later_and_lands_in_jaeger(stack, tmp_path: Path) -> None:
    job_id = new_job_id("spool")
    service = f"spool-{job_id}"
    spool_dir = tmp_path / "spool"
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "OTEL_SERVICE_NAME": service,
        "OTEL_TRAINING_JOB_ID": job_id,
        "OTEL_TRAINING_EXPORTER": "otlp",
        "OTEL_TRAINING_METRICS": "false",
        "OTEL_TRAINING_SPOOL_DIR": str(spool_dir),
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",  # nothing listens there
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    job = subprocess.run([sys.executable, str(REPO / "tests" / "scripts" / "steps_then_result.py"), str(STEPS)],
                         env=env, capture_output=True, text=True, timeout=120)
    assert job.returncode == 0, job.stderr
    exported, dropped, spooled = map(int, job.stdout.split("RESULT", 1)[1].split())
    assert (exported, dropped) == (0, 0) and spooled >= STEPS + 1
    (spool,) = spool_dir.glob("spool-r0-*.jsonl")
    assert len(read_spans(spool)) == spooled
    assert "otel-training spool send" in job.stderr  # the shutdown says where the spans are and how to send them

    send = subprocess.run([sys.executable, "-m", "otel_training.cli.main", "spool", "send", str(spool_dir),
                           "--endpoint", stack.otlp_http_endpoint], env={**env, "OTEL_EXPORTER_OTLP_ENDPOINT": ""},
                          capture_output=True, text=True, timeout=120)
    assert send.returncode == 0, send.stderr
    assert "sent" in send.stdout and not spool.exists() and spool.with_name(spool.name + ".done").exists()

    def steps_in_jaeger() -> list[dict]:
        return [span for span in jaeger_spans(stack.jaeger_url, service) if span["name"] == "training.step"]

    assert wait_until(lambda: len(steps_in_jaeger()) == STEPS, timeout=60, what="the spooled steps in Jaeger")
    steps = steps_in_jaeger()
    assert sorted(span["attributes"]["training.step"] for span in steps) == list(range(STEPS))
    epochs = [span for span in jaeger_spans(stack.jaeger_url, service) if span["name"] == "training.epoch"]
    assert len(epochs) == 1 and {span["parent_id"] for span in steps} == {epochs[0]["span_id"]}
    assert all(span["resource"]["training.job.id"] == job_id for span in steps)

    again = subprocess.run([sys.executable, "-m", "otel_training.cli.main", "spool", "send", str(spool_dir),
                            "--endpoint", stack.otlp_http_endpoint], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "sent" not in again.stdout  # a file sent whole is not sent twice
