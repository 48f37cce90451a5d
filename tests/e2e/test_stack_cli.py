"""The native stack's command as the README gives it: what `up` says a new user can and cannot do with it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

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
    finally:
        subprocess.run([*stack, "down", "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=120,
                       check=False)
