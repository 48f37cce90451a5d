"""Wall-time overhead of ``otel-training run`` on an unmodified CUDA loop, as a user would see it.

Runs ``examples/cuda_plain_loop.py`` (8 x Linear, AdamW, a pinned DataLoader,
``loss.item()`` every 10 steps) as plain ``python`` and under ``otel-training
run`` (torch auto-instrumentation, the device timeline, the default OTLP JSON
file pipeline), alternating, the order flipped every round. Each run prints its
own loop wall time (from the first step to a final ``torch.cuda.synchronize()``,
so process start-up and CUDA initialisation are not counted) and its median
CUDA-event step time. Printed: the median of the per-round ratios
instrumented/plain, with their spread, and how much of the loop the device sat
idle between steps (from the loop's own events) and the host's median time to
launch a step: a loop whose host launch time nears its step time is host-bound,
and pays the host's extra time in full. Goal: <= 1.02 with ~4 ms steps on a loop
like the device-timeline issue's, one the GPU keeps busy (the second command; the
defaults, ``--layers 4 --batch 128``, are ~4 ms steps of host launches).

    .venv/bin/python bench/bench_cuda_loop.py --rounds 3 --steps 500
    .venv/bin/python bench/bench_cuda_loop.py --rounds 4 --steps 500 --width 8192 --layers 4 --batch 64 \
        --workers 4 --epoch-batches 100
    .venv/bin/python bench/bench_cuda_loop.py --rounds 4 --steps 500 --offload   # also -o offload=true
    .venv/bin/python bench/bench_cuda_loop.py --rounds 8 --steps 500 --modes plain,offload   # the default alone

``--offload`` adds a third mode, ``otel-training run -o offload=true`` (spans built
by a drain process: docs/offload.md), in the same interleaved rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOOP = REPO / "examples" / "cuda_plain_loop.py"


# "run" is in-process, said explicitly: offload became otel-training run's default (docs/offload.md).
MODES = {"plain": None, "run": ["-o", "offload=false"], "offload": ["-o", "offload=true"]}
LABELS = {"plain": "plain", "run": "otel-training run, offload=false", "offload": "run, offload=true (default)"}


def run_once(mode: str, loop_args: list[str], output: Path) -> dict:
    command = [sys.executable, str(LOOP), *loop_args]
    options = MODES[mode]
    if options is not None:
        command = [str(Path(sys.executable).parent / "otel-training"), "run", "--output-dir", str(output), *options,
                   "--", *command]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="runs per mode (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=400, help="steps per run (default: %(default)s)")
    parser.add_argument("--batch", type=int, default=128, help="batch size; sets the step time (default: %(default)s)")
    parser.add_argument("--layers", type=int, default=4, help="Linear layers; sets the step time (default: %(default)s)")
    parser.add_argument("--width", type=int, default=4096, help="Linear width (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers (default: %(default)s)")
    parser.add_argument("--epoch-batches", type=int, default=8,
                        help="batches per epoch; with workers, each epoch's first batch waits (default: %(default)s)")
    parser.add_argument("--offload", action="store_true", help="also run under otel-training run -o offload=true")
    parser.add_argument("--modes", help="the modes, comma-separated, plain first (plain, run, offload); more rounds "
                        "of fewer modes in the same time: plain,offload")
    args = parser.parse_args()
    loop_args = ["--steps", str(args.steps), "--batch", str(args.batch), "--layers", str(args.layers),
                 "--width", str(args.width),
                 "--workers", str(args.workers), "--epoch-batches", str(args.epoch_batches)]

    modes = ["plain", "run"] + (["offload"] if args.offload else [])
    if args.modes:
        modes = args.modes.split(",")
        if modes[0] != "plain" or len(modes) < 2 or not set(modes) <= set(MODES):
            parser.error(f"--modes {args.modes}: plain first, then one or more of run, offload")
    walls: dict[str, list[float]] = {mode: [] for mode in modes}
    steps: dict[str, list[float]] = {mode: [] for mode in modes}
    idle: dict[str, list[float]] = {mode: [] for mode in modes}
    launch: dict[str, list[float]] = {mode: [] for mode in modes}
    ratios: dict[str, list[float]] = {mode: [] for mode in modes[1:]}
    device = "?"
    with tempfile.TemporaryDirectory(prefix="bench-cuda-loop-") as scratch:
        for round_index in range(args.rounds):
            shift = round_index % len(modes)
            for mode in modes[shift:] + modes[:shift]:  # the order rotated every round
                result = run_once(mode, loop_args, Path(scratch) / f"r{round_index}-{mode}")
                walls[mode].append(result["wall_s"])
                steps[mode].append(result["true_step_median_s"])
                idle[mode].append(result["device_idle_s"] / result["device_window_s"])
                launch[mode].append(result["host_launch_median_s"])
                device = result["device"]
            for mode in ratios:
                ratios[mode].append(walls[mode][-1] / walls["plain"][-1])
            print(f"round {round_index}: " + ", ".join(f"{LABELS[mode]} {walls[mode][-1]:.3f} s" for mode in modes)
                  + "; ratios " + ", ".join(f"{ratios[mode][-1]:.4f}" for mode in ratios), flush=True)

    print(f"loop: examples/cuda_plain_loop.py {' '.join(loop_args)}, {args.rounds} rounds per mode, {device}")
    for mode in modes:
        print(f"{LABELS[mode]:18s} loop wall median {statistics.median(walls[mode]):.3f} s, "
              f"CUDA-event step median {statistics.median(steps[mode]) * 1e3:.2f} ms, "
              f"host launch median {statistics.median(launch[mode]) * 1e3:.2f} ms, "
              f"device idle {statistics.median(idle[mode]):.1%} of the loop")
    for mode, values in ratios.items():
        quartiles = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
        print(f"ratio {LABELS[mode]}/plain: median {statistics.median(values):.4f} "
              f"(quartiles {quartiles[0]:.4f}-{quartiles[2]:.4f}, min {min(values):.4f}, max {max(values):.4f}); "
              f"goal <= 1.02")


if __name__ == "__main__":
    main()
