"""``otel-training demo`` shows a new user a stuck-step alert within seconds (and ``--no-stuck`` does not)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from environ import child_environ
from otlp_json import read_spans

from otel_training import semconv as sc

REPO = Path(__file__).resolve().parent.parent


def run_demo(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    env = child_environ()
    env["PYTHONPATH"] = str(REPO)
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from otel_training.cli.main import main; sys.exit(main(sys.argv[1:]))",
         "demo", "--epochs", "1", "--steps", "6", "--output-dir", str(tmp_path / "traces"), *extra],
        env=env, capture_output=True, text=True, timeout=60,
    )
    return result, read_spans(tmp_path / "traces" / "traces-r0.jsonl")


def test_demo_shows_the_stuck_alert_on_the_console_and_in_the_trace(tmp_path: Path) -> None:
    result, spans = run_demo(tmp_path, "--stuck-threshold", "0.3")
    assert result.returncode == 0, result.stderr
    assert "ALERT stuck: training.step (step 3)" in result.stdout
    assert "ALERT recovered: training.step (step 3)" in result.stdout
    kinds = sorted(span["attributes"][sc.ALERT_KIND] for span in spans if span["name"] == sc.SPAN_ALERT)
    assert kinds == ["recovered", "stuck"]


def test_demo_no_stuck(tmp_path: Path) -> None:
    result, spans = run_demo(tmp_path, "--no-stuck")
    assert result.returncode == 0, result.stderr
    assert "ALERT" not in result.stdout
    assert not [span for span in spans if span["name"] == sc.SPAN_ALERT]


def test_demo_runs_with_only_the_core_installed(tmp_path: Path) -> None:
    """The report extra (matplotlib) is optional: without it the demo still summarises, and says why no HTML."""
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "matplotlib").mkdir()
    (blocker / "matplotlib" / "__init__.py").write_text("raise ImportError('matplotlib is not installed')\n")
    env = child_environ()
    env["PYTHONPATH"] = os.pathsep.join([str(blocker), str(REPO)])
    code = ("import importlib.util, sys\n"
            "real = importlib.util.find_spec\n"
            "importlib.util.find_spec = lambda name, *a: None if name == 'matplotlib' else real(name, *a)\n"
            "from otel_training.cli.main import main; sys.exit(main(sys.argv[1:]))")
    result = subprocess.run([sys.executable, "-c", code, "demo", "--epochs", "1", "--steps", "4", "--no-stuck",
                             "--output-dir", str(tmp_path / "traces")],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "goodput:" in result.stdout
    assert "pip install 'otel-training[report]'" in result.stdout
    assert not (tmp_path / "traces" / "otel-training-report.html").exists()
