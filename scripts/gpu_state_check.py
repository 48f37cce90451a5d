"""Issue 31 on a real GPU: a short offloaded training loop, then the GPU state it left in its files, checked.

``scripts/gpu-check``'s last part (docs/gpu-state.md#what-was-verified-and-what-was-not). It needs CUDA, torch
and nvidia-ml-py (``pip install -e '.[torch,report,gpu]'``). The loop runs here, offloaded (the drain samples
NVML every 0.2 s and writes its metrics every 0.5 s), then its files are read back:

* ``metrics-r0.drain.jsonl``: real readings of ``hw.gpu.utilization``, ``hw.gpu.memory.*``,
  ``training.gpu.sm_clock`` (at most its maximum), ``training.gpu.power.draw`` and the temperature, where
  NVML offers them, on the device the loop ran on (``hw.id`` = torch's UUID of it);
* ``traces-r0.jsonl``: the device state on the step spans (``training.gpu.sm_clock.min_mhz``,
  ``training.gpu.throttled``);
* the report: the verdicts' GPU data and the GPU plot's series read from those files.

Each check is written to ``OUT_DIR/gpu-state.jsonl`` (and printed) as it is done, so a part killed by its
timeout still leaves what it found; the exit status is 1 if any failed. ``--stand-in`` runs it without a
GPU (the loop on the CPU, NVML a stand-in module on PYTHONPATH): the tests run it that way
(``tests/test_gpu_state_check.py``), so that this script is exercised where no GPU is.

    python scripts/gpu_state_check.py OUT_DIR [--steps 200] [--stand-in]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout: the package next to this script


class Results:
    """Each check, appended to the results file and printed as it is done."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.write_text("")
        self.failed: list[str] = []

    def check(self, name: str, ok: bool, detail: Any = "") -> bool:
        with self.path.open("a") as handle:
            handle.write(json.dumps({"check": name, "ok": bool(ok), "detail": detail}, default=str) + "\n")
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
        if not ok:
            self.failed.append(name)
        return bool(ok)


def _loop(steps: int, stand_in: bool, traces: Path) -> str | None:
    """The training loop, offloaded; the UUID torch gives its device (None on the CPU)."""
    os.environ["OTEL_METRIC_EXPORT_INTERVAL"] = "500"  # the drain inherits it: several collections in a short run
    import otel_training

    telemetry = otel_training.configure(exporter="file", output_dir=str(traces), offload=True,
                                        gpu_state_interval_s=0.2, job_id="gpu-state-check", rank=0)
    trainer = otel_training.TrainerProcess()
    uuid = None
    if stand_in:
        work = lambda: time.sleep(0.02)  # noqa: E731 - a step's worth of time; no GPU
    else:
        import torch

        device = torch.device("cuda")
        x = torch.randn(4096, 4096, device=device)

        def work() -> None:
            for _ in range(8):
                x.matmul(x)
            torch.cuda.synchronize()

        uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    with trainer.train():
        for step in range(steps):
            with trainer.step(global_step=step):
                work()
    telemetry.shutdown(timeout_s=30)
    return uuid


def _points(path: Path) -> dict[str, list[tuple[int, float, dict[str, Any]]]]:
    """Every gauge and counter point of an OTLP JSON metrics file: name -> [(time, value, attributes)]."""
    from otel_training.report.reader import attributes

    points: dict[str, list[tuple[int, float, dict[str, Any]]]] = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        for resource in json.loads(line).get("resourceMetrics", ()):
            for scope in resource.get("scopeMetrics", ()):
                for metric in scope.get("metrics", ()):
                    data = metric.get("gauge") or metric.get("sum") or {}
                    for point in data.get("dataPoints", ()):
                        value = float(point.get("asDouble", point.get("asInt", "nan")))
                        points.setdefault(metric["name"], []).append(
                            (int(point.get("timeUnixNano", 0)), value, attributes(point.get("attributes"))))
    return points


def _check_metrics(results: Results, path: Path, uuid: str | None, stand_in: bool) -> None:
    if not results.check("metrics file", path.is_file(), str(path)):
        return
    points = _points(path)
    results.check("collections", len(points.get("training.gpu.sample.time", ())) >= 2,
                  f"{len(points.get('training.gpu.sample.time', ()))} collections of training.gpu.sample.time")

    def values(name: str) -> list[float]:
        return [value for _, value, _ in points.get(name, ()) if not math.isnan(value)]

    utilization = values("hw.gpu.utilization")
    results.check("hw.gpu.utilization", bool(utilization) and all(0 <= value <= 1 for value in utilization)
                  and max(utilization) > 0, f"{utilization[-5:]} (the loop keeps the GPU busy: some above 0)")
    usage, limit = values("hw.gpu.memory.usage"), values("hw.gpu.memory.limit")
    results.check("hw.gpu.memory", bool(usage) and bool(limit) and 0 < max(usage) <= max(limit),
                  f"usage {max(usage, default=None)} B of {max(limit, default=None)} B")
    clocks, maximum = values("training.gpu.sm_clock"), values("training.gpu.sm_clock.max")
    results.check("training.gpu.sm_clock", bool(clocks) and min(clocks) > 0 and (
        not maximum or max(clocks) <= max(maximum)), f"{min(clocks, default=None)}-{max(clocks, default=None)} Hz, "
                  f"max {max(maximum, default=None)} Hz")
    power = values("training.gpu.power.draw")
    results.check("training.gpu.power.draw", not power or min(power) > 0,
                  f"{power[-3:]} W" if power else "not offered by this GPU (NVML NOT_SUPPORTED): no point, as designed")
    temperature = values("training.gpu.temperature")
    results.check("training.gpu.temperature", not temperature or all(5 < value < 120 for value in temperature),
                  f"{temperature[-3:]} Cel")
    ids = [attributes.get("hw.id") for _, _, attributes in points.get("training.gpu.sm_clock", ())]
    if uuid is not None:
        expected = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
        results.check("hw.id is the loop's device", bool(ids) and ids[-1] == expected,
                      f"sampled {ids[-1] if ids else None}, torch's device {expected}")
    elif not stand_in:
        results.check("hw.id is the loop's device", False, "no UUID from torch")


def _check_steps(results: Results, path: Path) -> None:
    from otel_training.report.reader import read_file

    records, problems = read_file(path)
    steps = [record for record in records if record.name == "training.step"]
    joined = [record for record in steps if "training.gpu.sm_clock.min_mhz" in record.attributes]
    results.check("trace file", bool(steps) and not problems, f"{len(steps)} steps, problems {problems[:3]}")
    # The first steps may end before the first sample: most, not all, carry the state.
    results.check("step spans carry the GPU state", len(joined) >= 0.8 * len(steps) > 0,
                  f"{len(joined)} of {len(steps)} steps")
    clocks = [record.attributes["training.gpu.sm_clock.min_mhz"] for record in joined]
    flags = [record.attributes.get("training.gpu.throttled") for record in joined]
    results.check("step state values", all(isinstance(clock, int) and clock > 0 for clock in clocks)
                  and all(isinstance(flag, bool) for flag in flags),
                  f"lowest SM clocks {sorted(set(clocks))[:5]} MHz, throttled on {sum(map(bool, flags))} steps")
    errors = [(record.attributes.get("training.step"), record.attributes["training.gpu.error"]) for record in steps
              if "training.gpu.error" in record.attributes]  # the report's reader puts the events there
    results.check("GPU errors during the loop (said, not judged)", True, errors[:5] or "none")


def _check_report(results: Results, traces: Path) -> None:
    from otel_training.report.files import report_files
    from otel_training.report.summary import render_summary

    report = report_files([traces], workers=1, progress=False)
    gpu, series = report.rank_gpu.get(0), report.gpu_series.get(0)
    results.check("report: steps' GPU state", gpu is not None and gpu.has_clocks, "rank 0's sampled steps")
    results.check("report: drain metrics series", series is not None and series.has_clocks,
                  f"{len(series.times) if series else 0} collections, "
                  f"power {'yes' if series and series.has_power else 'no'}")
    results.check("report: no input problems", not report.problems, [str(problem) for problem in report.problems])
    print(render_summary(report), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--stand-in", action="store_true", help="no GPU: the loop on the CPU, NVML a stand-in")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    traces = args.out / "traces"
    shutil.rmtree(traces, ignore_errors=True)
    results = Results(args.out / "gpu-state.jsonl")
    try:
        import pynvml  # noqa: F401 - the gpu extra
    except ImportError:
        results.check("nvidia-ml-py", False, "not installed: pip install 'otel-training[gpu]'")
        return 1
    from otel_training.hardware.nvml import load_nvml

    nvml, why = load_nvml()
    if not results.check("NVML", nvml is not None, why or f"{nvml.nvmlDeviceGetCount()} device(s)"):
        return 1
    if not args.stand_in:
        import torch

        if not results.check("CUDA", torch.cuda.is_available(), torch.__version__):
            return 1
    started = time.monotonic()
    uuid = _loop(args.steps, args.stand_in, traces)
    results.check("loop", True, f"{args.steps} steps in {time.monotonic() - started:.1f} s")
    _check_metrics(results, traces / "metrics-r0.drain.jsonl", uuid, args.stand_in)
    _check_steps(results, traces / "traces-r0.jsonl")
    _check_report(results, traces)
    print(f"gpu-state: {'FAILED ' + ', '.join(results.failed) if results.failed else 'all checks passed'}")
    return 1 if results.failed else 0


if __name__ == "__main__":
    sys.exit(main())
