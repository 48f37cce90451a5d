"""The alert rules, Prometheus and Alertmanager configs, checked by their own tools.

promtool (Debian package ``prometheus``) runs the rule unit tests in
collector-config/tests/; amtool (package ``prometheus-alertmanager``) checks
alertmanager.yml. Skipped only when the tool is absent and CI is unset.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "collector-config"
RULE_TESTS = sorted((CONFIG / "tests").glob("*.yml"))


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        msg = f"{name} not installed (scripts/stack/install-deps.sh installs Debian's prometheus/prometheus-alertmanager)"
        if os.environ.get("CI"):
            pytest.fail(msg + "; CI is set, so this is a failure", pytrace=False)
        pytest.skip(msg)
    return path


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=CONFIG, capture_output=True, text=True, timeout=120)


def test_rule_test_files_exist():
    assert RULE_TESTS, "no promtool rule tests in collector-config/tests/"


@pytest.mark.parametrize("test_file", RULE_TESTS, ids=lambda p: p.name)
def test_promtool_rule_unit_tests(test_file: Path):
    proc = _run(_tool("promtool"), "test", "rules", str(test_file))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_promtool_rule_tests_can_fail(tmp_path: Path):
    """Guard against a vacuous harness: a wrong expectation must make promtool fail."""
    src = (CONFIG / "tests" / "alert-rules-test.yml").read_text()
    broken = src.replace("training_job_id: j1\n              training_run_id: r1", "training_job_id: WRONG\n              training_run_id: r1", 1)
    assert broken != src
    (tmp_path / "tests").mkdir()
    (tmp_path / "alert-rules.yml").write_text((CONFIG / "alert-rules.yml").read_text())
    (tmp_path / "tests" / "broken.yml").write_text(broken)
    proc = subprocess.run([_tool("promtool"), "test", "rules", str(tmp_path / "tests" / "broken.yml")], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "FAILED" in proc.stdout + proc.stderr


def test_promtool_check_rules():
    proc = _run(_tool("promtool"), "check", "rules", "alert-rules.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_check_config():
    # Also checks that rule_files resolves (relative to prometheus.yml).
    proc = _run(_tool("promtool"), "check", "config", "prometheus.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_amtool_check_config():
    proc = _run(_tool("amtool"), "check-config", "alertmanager.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "training-webhook" in (CONFIG / "alertmanager.yml").read_text()
