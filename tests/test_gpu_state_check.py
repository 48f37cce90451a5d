"""``scripts/gpu-check``'s issue-31 part, run here the only way it can be without a GPU.

The part (``scripts/gpu_state_check.py``) runs a short offloaded loop and checks the GPU state its files hold.
On a GPU it reads the real NVML; here it runs through ``scripts/gpu-check`` itself with
``GPU_STATE_STAND_IN=1``: the loop on the CPU, the drain importing the stand-in ``pynvml``
(``tests/stand_in_nvml``). That proves the wiring, the file reading and the checks; not that a real GPU
answers as the stand-in does (docs/gpu-state.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


def _env(*paths: Path, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("OTEL_", "CUDA_VISIBLE"))}
    env["PYTHONPATH"] = os.pathsep.join(str(path) for path in paths)
    env.update(extra)
    return env


def _results(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_gpu_check_is_valid_bash() -> None:
    proc = subprocess.run(["bash", "-n", str(REPO / "scripts" / "gpu-check")], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr


def test_the_gpu_state_part_runs_in_gpu_check_against_the_stand_in(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run([str(REPO / "scripts" / "gpu-check"), str(out)], capture_output=True, text=True,
                          timeout=300, env=_env(TESTS / "stand_in_nvml", TESTS, PARTS="gpu-state",
                                                GPU_STATE_STAND_IN="1", PYTHON=sys.executable))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "=== gpu-state:" in proc.stdout and "all parts passed" in proc.stdout
    results = _results(out / "gpu-state" / "gpu-state.jsonl")
    assert all(result["ok"] for result in results), [result for result in results if not result["ok"]]
    checks = {result["check"] for result in results}
    assert {"hw.gpu.utilization", "hw.gpu.memory", "training.gpu.sm_clock", "training.gpu.power.draw",
            "step spans carry the GPU state", "step state values", "report: drain metrics series"} <= checks
    assert (out / "gpu-state.log").read_text().count("ok ") == len(results)  # the part's log, as the others'


def test_gpu_check_starts_no_part_once_its_budget_is_spent_and_says_which(tmp_path: Path) -> None:
    """A session's device time is short: past GPU_CHECK_BUDGET_S the parts left are not started, each says
    so in its log, and the exit status (3) is not a pass."""
    out = tmp_path / "out"
    proc = subprocess.run([str(REPO / "scripts" / "gpu-check"), str(out)], capture_output=True, text=True,
                          timeout=300, env=_env(TESTS / "stand_in_nvml", TESTS, PARTS="gpu-state cuda-tests",
                                                GPU_STATE_STAND_IN="1", GPU_CHECK_BUDGET_S="0",
                                                PYTHON=sys.executable))
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "NOT RUN (the budget of 0 s was spent): cuda-tests gpu-state" in proc.stdout
    assert "all parts passed" not in proc.stdout
    assert "not run" in (out / "gpu-state.log").read_text()
    assert not (out / "gpu-state" / "gpu-state.jsonl").exists()


def test_gpu_check_runs_its_parts_most_valuable_first() -> None:
    """The real-CUDA tests, then the GPU's state, then the default path's wall-time goals, before the rest."""
    parts = [line.split()[1] for line in (REPO / "scripts" / "gpu-check").read_text().splitlines()
             if line.startswith("part ")]
    assert parts[:5] == ["cuda-tests", "gpu-state", "bench-cuda-loop-default", "bench-cuda-loop-gpu-bound",
                         "gil-share"]
    assert len(parts) == len(set(parts)) == 12


def test_without_nvidia_ml_py_the_part_says_so_and_fails(tmp_path: Path) -> None:
    missing = tmp_path / "no_nvml"
    missing.mkdir()
    (missing / "pynvml.py").write_text('raise ImportError("stand-in: nvidia-ml-py is not installed")\n')
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_state_check.py"), str(tmp_path / "out"),
                           "--stand-in"], capture_output=True, text=True, timeout=120, env=_env(missing, TESTS))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert _results(tmp_path / "out" / "gpu-state.jsonl") == [
        {"check": "nvidia-ml-py", "ok": False, "detail": "not installed: pip install 'otel-training[gpu]'"}]
