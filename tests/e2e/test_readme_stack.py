"""The README's native-stack section, followed literally: its own commands, as a new user types them.

The blocks marked ``<!-- e2e: readme-stack -->`` in README.md are run line by line with bash, in order: the
stack up (with the shipped intervals), the ``export`` line with the port ``up`` printed in place of
``<port it printed>`` (the one substitution the README asks for), the demo with its stuck step, and the stack
down. Meanwhile the test asks Alertmanager's API for the stuck alert and Jaeger's API for the trace, then
checks that nothing the commands started is left running.

Isolation, not substitution: the commands run in a temporary directory holding links to the parts of the
repository they name (``scripts``, ``collector-config``, ``.venv``), so nothing is written into the working
tree, and with ``HOME`` a temporary directory whose ``.cache/otel-training/bin/`` links to the binaries already
built, so ``build.sh`` finds them and ``up``/``down`` use a run dir of their own. Not ``OTEL_TRAINING_CACHE``:
otel-training refuses an ``OTEL_TRAINING_*`` variable that is none of its options, so the demo would fail
in that shell. Every process the commands start inherits a marker in its environment, which is how
"nothing left running" is checked.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import pytest
from environ import child_environ
from otelstack import cached_binary_paths, http_get
from stack_helpers import jaeger_traces
from training_helpers import E2E_MARKS, RUN_MARKER, processes_marked
from waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
MARK = "<!-- e2e: readme-stack"
PLACEHOLDER = "<port it printed>"
#: What the commands reach in the repository; the temporary directory links these.
LINKED = ("scripts", "collector-config")
#: The shipped intervals: flush, count one flush later, scrape, evaluation, each up to 15 s, plus slack.
ALERT_DEADLINE_S = 240.0

pytestmark = E2E_MARKS


def readme_commands(text: str) -> list[str]:
    """The command lines of the marked ```bash blocks, in order (blank and comment-only lines left out)."""
    blocks = re.findall(re.escape(MARK) + r"[^>]*-->\s*\n```bash\n(.*?)```", text, re.S)
    assert blocks, f"no block marked {MARK} --> in {README}"
    return [line for block in blocks for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_marked_blocks_are_the_commands_this_test_knows_how_to_run() -> None:
    """A changed README fails here first, by name, rather than somewhere in the stack."""
    commands = readme_commands(README.read_text())
    assert any("stack.py up" in c for c in commands), commands
    assert any(c.startswith("export ") and PLACEHOLDER in c for c in commands), commands
    assert any("otel-training demo" in c and "--stuck-threshold" in c for c in commands), commands
    assert commands[-1].split("#")[0].strip().endswith("stack.py down"), commands


def _venv() -> Path:
    """The .venv the README's commands name: the repository's, else the one running this test."""
    for candidate in (REPO / ".venv", Path(sys.prefix)):
        if (candidate / "bin" / "otel-training").exists():
            return candidate
    pytest.skip("no virtual environment with otel-training (scripts/test sets up .venv)")


def _workdir(tmp_path: Path) -> tuple[Path, dict[str, str], str]:
    """A directory that looks like the repository's root to the commands, and their environment."""
    root = tmp_path / "clone"
    root.mkdir()
    for name in LINKED:
        (root / name).symlink_to(REPO / name)
    (root / ".venv").symlink_to(_venv())
    home = tmp_path / "home"
    cache = home / ".cache" / "otel-training"
    (cache / "bin").mkdir(parents=True)
    for key in ("OTELCOL_BIN", "JAEGER_BIN"):
        built = Path(cached_binary_paths()[key])
        (cache / "bin" / built.name).symlink_to(built)
    marker = uuid.uuid4().hex
    env = dict(child_environ(RUN_MARKER), HOME=str(home), **{RUN_MARKER: marker})
    return root, env, marker


def _run(command: str, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, f"{command!r} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _export(command: str, cwd: Path, env: dict[str, str]) -> dict[str, str]:
    """The environment after ``command`` (an export line), as the user's shell would have it."""
    out = subprocess.run(["bash", "-c", f"{command}\nenv -0"], cwd=cwd, env=env, capture_output=True, timeout=30,
                         check=True).stdout
    return dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)


def _endpoint(up: str, name: str) -> str:
    found = re.search(rf'"{name}": "([^"]+)"', up)
    assert found is not None, f"`up` printed no {name} endpoint:\n{up}"
    return found.group(1)


def _alert_active(alertmanager: str) -> bool:
    query = urllib.parse.urlencode({"filter": 'alertname="TrainingStepStuck"'})
    status, body = http_get(f"{alertmanager}/api/v2/alerts?{query}")
    return status == 200 and any(a["status"]["state"] == "active" for a in json.loads(body))


def _paged(notifications: Path) -> bool:
    if not notifications.exists():
        return False
    notes = [json.loads(line) for line in notifications.read_text().splitlines() if line.strip()]
    return any(n["status"] == "firing" and n["commonLabels"].get("alertname") == "TrainingStepStuck" for n in notes)


def _spans(jaeger: str, **tags: str) -> list[dict[str, Any]]:
    return [span for trace in jaeger_traces(jaeger, "llm-pretrain", tags=tags or None) for span in trace["spans"]]


def test_the_readme_native_stack_section_as_written(stack_binaries: object, tmp_path: Path) -> None:
    """Up, export, the demo's stuck step paged through Alertmanager and its trace in Jaeger, down, nothing left."""
    commands = readme_commands(README.read_text())
    cwd, env, marker = _workdir(tmp_path)
    up = ""
    demo: subprocess.Popen[bytes] | None = None
    demo_log = tmp_path / "demo.log"
    try:
        for command in commands[:-1]:
            if command.startswith("export "):
                printed = re.search(r"^export OTEL_EXPORTER_OTLP_ENDPOINT=http://127\.0\.0\.1:(\d+)$", up, re.M)
                assert printed is not None, f"no export line printed by `up` before {command!r}:\n{up}"
                for line in (text for text in up.splitlines() if text.startswith("export ")):  # pasted as `up` says
                    env = _export(line, cwd, env)
                env = _export(command.replace(PLACEHOLDER, printed.group(1)), cwd, env)
            elif "otel-training demo" in command:
                # The job blocks for about a minute; the APIs are asked while it runs, as a second shell would.
                with open(demo_log, "wb") as log:
                    demo = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=env, stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            else:
                out = _run(command, cwd, env)
                up = out if "stack.py up" in command else up
        assert demo is not None and up, commands
        alertmanager, jaeger = _endpoint(up, "alertmanager"), _endpoint(up, "jaeger")
        assert wait_until(lambda: _alert_active(alertmanager), ALERT_DEADLINE_S, 0.5), (
            f"TrainingStepStuck never active in {alertmanager}; demo:\n{demo_log.read_text()[-3000:]}")
        assert wait_until(lambda: _paged(Path(_endpoint(up, "notifications_file"))), 60, 0.5)
        assert demo.wait(timeout=ALERT_DEADLINE_S) == 0, demo_log.read_text()[-3000:]
        assert "ALERT stuck: training.step (step 3)" in demo_log.read_text()
        assert wait_until(lambda: _spans(jaeger, **{"training.alert.kind": "stuck"}), 60, 0.5)
        assert wait_until(lambda: any(s["operationName"] == "training.train" for s in _spans(jaeger)), 60, 0.5)
    finally:
        if demo is not None and demo.poll() is None:
            demo.kill()
            demo.wait()
        down = subprocess.run(["bash", "-c", commands[-1]], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=120, check=False)  # the README's own stop command, whatever happened above
    assert down.returncode == 0 and "stopped the stack" in down.stdout, (down.stdout, down.stderr)
    assert wait_until(lambda: not processes_marked(marker), 30, 0.1), (
        f"still running after `{commands[-1]}`: {processes_marked(marker)}")
