"""The native stack's command as the README gives it: what `up` says a new user can and cannot do with it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def test_stack_up_says_where_to_export_that_jaeger_is_api_only_and_how_to_stop_it(
        stack_binaries: object, tmp_path: Path) -> None:
    stack = [sys.executable, str(REPO / "scripts" / "stack" / "stack.py")]
    run_dir = tmp_path / "stack"
    up = subprocess.run([*stack, "up", "--run-dir", str(run_dir), "--fast"], capture_output=True, text=True,
                        timeout=180, check=False)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        out = up.stdout
        # The ports are picked at start: the export line is the one to use, not a fixed 4317.
        assert re.search(r"^export OTEL_EXPORTER_OTLP_ENDPOINT=http://127\.0\.0\.1:\d+$", out, re.M), out
        jaeger = re.search(r"jaeger serves its query API at (http://\S+), not the UI", out)
        assert jaeger is not None, out
        assert f"otel-training report --jaeger {jaeger.group(1)} --service NAME" in out
        # The stop command names the interpreter that ran it (a bare `python` lacks the project).
        assert f"stop with: {sys.executable} scripts/stack/stack.py down --run-dir {run_dir}" in out
        # Without --webhook-url, pages reach the stack's own receiver (the Docker host's name resolves only in
        # docker-compose): an alert sent to the real Alertmanager arrives in the file `up` names.
        notifications = run_dir / "webhook" / "notifications.jsonl"
        assert f"the stack's own receiver, which writes them to {notifications}" in out, out
        alertmanager = re.search(r'"alertmanager": "(http://[^"]+)"', out)
        assert alertmanager is not None, out
        alert = [{"labels": {"alertname": "TrainingStepStuck", "severity": "page", "training_job_id": "cli-test",
                             "training_rank": "1"}, "annotations": {"summary": "a test page"}}]
        request = urllib.request.Request(alertmanager.group(1) + "/api/v2/alerts", method="POST",
                                         data=json.dumps(alert).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200

        def paged() -> bool:
            return notifications.exists() and "cli-test" in notifications.read_text()

        assert wait_until(paged, 60, 0.2), (run_dir / "logs" / "alertmanager.log").read_text()[-2000:]
        (line,) = [json.loads(text) for text in notifications.read_text().splitlines() if "cli-test" in text]
        assert line["status"] == "firing" and line["alerts"][0]["labels"]["training_rank"] == "1"
        assert "webhook: firing: TrainingStepStuck [firing] (training_job_id=cli-test, training_rank=1)" in (
            run_dir / "logs" / "webhook.log").read_text()
    finally:
        subprocess.run([*stack, "down", "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=120,
                       check=False)
