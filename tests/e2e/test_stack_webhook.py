"""The native stack's own Alertmanager webhook receiver (scripts/stack/otelstack/webhook.py), on its own.

The whole path, Alertmanager's notification to this receiver, is in test_stack_cli.py (real binaries).
"""

from __future__ import annotations

import json
import stat
import threading
import urllib.error
import urllib.request
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
from otelstack import webhook


@pytest.fixture
def receiver(tmp_path: Path):
    out = tmp_path / "webhook" / "notifications.jsonl"
    out.parent.mkdir()
    server = ThreadingHTTPServer(("127.0.0.1", 0), webhook.make_handler(out, threading.Lock()))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", out
    server.shutdown()
    server.server_close()


def _post(url: str, body: bytes) -> int:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


def test_each_notification_is_kept_as_one_line_only_its_owner_reads(receiver, capsys) -> None:
    base, out = receiver
    notification = {"status": "firing", "alerts": [{"status": "firing", "labels": {
        "alertname": "TrainingStepStuck", "training_job_id": "j1", "training_rank": "3"}}]}
    assert _post(base + webhook.PATH, json.dumps(notification).encode()) == 200
    assert _post(base + webhook.PATH, json.dumps({**notification, "status": "resolved"}).encode()) == 200
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["status"] for line in lines] == ["firing", "resolved"] and lines[0] == notification
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert "webhook: firing: TrainingStepStuck [firing] (training_job_id=j1, training_rank=3)" in capsys.readouterr().out


def test_what_is_not_a_notification_is_refused_and_nothing_is_written(receiver) -> None:
    base, out = receiver
    assert _post(base + webhook.PATH, b"not json") == 400
    assert _post(base + webhook.PATH, b"[1, 2]") == 400
    assert _post(base + "/elsewhere", b"{}") == 404
    assert not out.exists()
    with urllib.request.urlopen(base + "/-/ready", timeout=10) as answer:
        assert answer.status == 200
