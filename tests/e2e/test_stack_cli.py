"""The native stack's command as the README gives it: what `up` says a new user can and cannot do with it,
and the Jaeger of the user's own (``--jaeger-binary``/``OTEL_TRAINING_JAEGER_BIN``) it checks before starting."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_until

from otel_training._pids import pid_running

REPO = Path(__file__).resolve().parents[2]
STACK = [sys.executable, str(REPO / "scripts" / "stack" / "stack.py")]
pytestmark = pytest.mark.e2e


def test_stack_up_says_where_to_export_that_jaeger_is_api_only_and_how_to_stop_it(
        stack_binaries: object, tmp_path: Path) -> None:
    stack = STACK
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


# -- a Jaeger of the user's own (issue 30, item 1) ----------------------------------------------------
def _up(run_dir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*STACK, "up", "--run-dir", str(run_dir), "--fast", *args], capture_output=True, text=True,
                          timeout=180, check=False, env=env)


def _down(run_dir: Path) -> None:
    subprocess.run([*STACK, "down", "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=120, check=False)


def _script(path: Path, text: str, mode: int = 0o755) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


WRONG_VERSION = '#!/bin/sh\necho \'{"gitCommit":"0","gitVersion":"v1.76.0","buildDate":""}\'\n'


@pytest.mark.parametrize("case", ["missing", "not executable", "a directory", "wrong version", "not jaeger"])
@pytest.mark.parametrize("named_by", ["--jaeger-binary", "OTEL_TRAINING_JAEGER_BIN"])
def test_a_jaeger_binary_that_cannot_run_the_stack_is_refused_before_anything_starts(
        case: str, named_by: str, tmp_path: Path) -> None:
    """A wrong path fails at once in one line naming the option (or variable) and the value, exit code 2, not in
    a log minutes later: nothing is started, not even the run dir is made."""
    value = {
        "missing": lambda: tmp_path / "no-such-jaeger",
        "not executable": lambda: _script(tmp_path / "jaeger", "#!/bin/sh\n", mode=0o644),
        "a directory": lambda: tmp_path,
        "wrong version": lambda: _script(tmp_path / "jaeger", WRONG_VERSION),
        "not jaeger": lambda: _script(tmp_path / "jaeger", "#!/bin/sh\necho hello\n"),
    }[case]()
    run_dir = tmp_path / "stack"
    env = {k: v for k, v in os.environ.items() if k != "OTEL_TRAINING_JAEGER_BIN"}
    if named_by == "--jaeger-binary":
        up = _up(run_dir, "--jaeger-binary", str(value), env=env)
        spelled = f"--jaeger-binary {value}: "
    else:
        up = _up(run_dir, env=dict(env, OTEL_TRAINING_JAEGER_BIN=str(value)))
        spelled = f"OTEL_TRAINING_JAEGER_BIN={value}: "
    assert up.returncode == 2, (up.stdout, up.stderr)
    assert up.stdout == "" and "Traceback" not in up.stderr
    (line,) = up.stderr.splitlines()
    assert line.startswith(f"scripts/stack/stack.py up: {spelled}"), line
    assert {"missing": "no such file", "not executable": "not an executable file", "a directory": "not an executable file",
            "wrong version": "is Jaeger v1.76.0; the stack runs Jaeger v2",
            "not jaeger": "did not answer as Jaeger does"}[case] in line
    assert not run_dir.exists()


def test_our_built_jaeger_named_as_the_release_binary_is_the_one_that_runs(stack_binaries: Any, tmp_path: Path) -> None:
    """No Jaeger release binary can be fetched here (no network to its releases, and nothing may download at run
    time), so the Jaeger build.sh built stands in for one, under another name: `up` checks it (it answers `version`
    without a version stamp and validates collector-config/jaeger.yaml), runs it, names it in its output and in
    `status`'s process list, and says that it has no UI either (it is the build without UI assets)."""
    named = tmp_path / "jaeger-2.13.0-linux-amd64" / "jaeger"
    named.parent.mkdir()
    named.symlink_to(stack_binaries.jaeger)
    run_dir = tmp_path / "stack"
    try:
        up = _up(run_dir, "--jaeger-binary", str(named))
        assert up.returncode == 0, up.stderr[-3000:]
        assert f"# {named} (no version stamp, from --jaeger-binary), the Jaeger you named, has no UI assets either" in up.stdout
        status = subprocess.run([*STACK, "status", "--run-dir", str(run_dir)], capture_output=True, text=True,
                                timeout=60, check=False)
        jaeger = json.loads(status.stdout)["components"]["jaeger"]
        assert jaeger["binary"] == str(named) and jaeger["healthy"], status.stdout
        with open(f"/proc/{jaeger['pid']}/cmdline", "rb") as fh:
            assert fh.read().split(b"\0")[0].decode() == str(named)
    finally:
        _down(run_dir)


FAKE_RELEASE = '''#!{python}
"""A stand-in for a Jaeger v2 release binary: its version answer, its config check, and a UI page."""
import json, os, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

if sys.argv[1:2] == ["version"]:
    print(json.dumps({{"gitCommit": "0" * 40, "gitVersion": "v2.13.0", "buildDate": "2025-12-03T00:00:00Z"}}))
    sys.exit(0)
if sys.argv[1:2] == ["validate"]:
    sys.exit(0)


class Page(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'<!doctype html><html><div id="jaeger-ui-root"></div></html>' if self.path == "/" else b'{{"data": []}}'
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def serve(address):
    host, port = address.rsplit(":", 1)
    ThreadingHTTPServer((host, int(port)), Page).serve_forever()


threading.Thread(target=serve, args=(os.environ["JAEGER_HEALTH_ENDPOINT"],), daemon=True).start()
serve(os.environ["JAEGER_QUERY_HTTP_ENDPOINT"])
'''


def test_a_jaeger_that_serves_the_ui_is_announced_with_its_url(stack_binaries: Any, tmp_path: Path) -> None:
    """What `up` says when the Jaeger named by OTEL_TRAINING_JAEGER_BIN serves the UI, as a release binary does. No
    release binary can be fetched here: a stand-in answers `version` as v2.13.0 does and serves a page at `/`."""
    fake = _script(tmp_path / "jaeger", FAKE_RELEASE.format(python=sys.executable))
    run_dir = tmp_path / "stack"
    try:
        up = _up(run_dir, env=dict(os.environ, OTEL_TRAINING_JAEGER_BIN=str(fake)))
        assert up.returncode == 0, up.stderr[-3000:]
        url = re.search(r'"jaeger": "(http://[^"]+)"', up.stdout)
        assert url is not None, up.stdout
        assert f"# jaeger ({fake}) serves its UI at {url.group(1)} (and its query API)" in up.stdout
        assert "not the UI" not in up.stdout
        status = subprocess.run([*STACK, "status", "--run-dir", str(run_dir)], capture_output=True, text=True,
                                timeout=60, check=False)
        pid = json.loads(status.stdout)["components"]["jaeger"]["pid"]
        assert isinstance(pid, int), status.stdout  # known though it runs as its interpreter (it was forgotten)
    finally:
        _down(run_dir)
    # `down` stops it, though it runs as its interpreter (it was left running, a process per CI run)
    assert wait_until(lambda: not pid_running(pid), 30), f"jaeger {pid} still runs"
