"""The first fetch of a second DataLoader, plain and instrumented with the watchdog off and on, side by side.

Issue 30, item 4: under ``otel-training run`` with the watchdog on (its default
there), the first ``next()`` on a validation loader took 165-236 ms where the
same script without instrumentation took 2.2 ms; it was not reproduced later. The
watchdog is a sidecar process in-process (``offload=False``: started at
``configure()``, a Python interpreter importing the package beside the training
process) and the drain's work when offloaded, so if it costs the first fetch
anything it shows here, where nothing else differs.

Each trial does what a script under ``otel-training run`` does: configure (as
``otel_training.integrations.auto`` does at interpreter start: ``configure()``,
then ``TorchInstrumentor().instrument()``), wait ``--startup-s`` (what the
script spends importing torch and building its model before it trains; 0 puts
the first fetch as close to the sidecar's start as it can be), train ``--steps``
steps of a small MLP from a first DataLoader, then build a fresh second DataLoader
(a small ``TensorDataset``, batch 32, ``num_workers`` 0 and 2) and time
``next(iter(loader))``: its first fetch, worker start-up included. The plain
trials configure nothing and instrument nothing.

All modes run in one process, in interleaved rounds whose order is flipped every
round, so drift and warm-up hit them alike; each trial reconfigures (a fresh
drain and a fresh watchdog, as a new run would have) and shuts down after.

    .venv/bin/python bench/bench_first_fetch.py --rounds 7
    .venv/bin/python bench/bench_first_fetch.py --rounds 7 --startup-s 0   # the fetch right after start-up

prints, per ``num_workers`` and mode, the median first fetch with its spread
(min, quartiles, max over the rounds) and the ratio of medians to plain, then
watchdog on over off with the rest of the pipeline alike (offloaded, in-process).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import otel_training
from otel_training.integrations.torch import TorchInstrumentor

#: Mode name -> configure() options (None: plain, nothing configured or instrumented); offload is "auto" unless
#: named, as under `otel-training run`.
MODES: dict[str, dict[str, Any] | None] = {
    "plain": None,
    "watchdog-off": {"watchdog": False},  # offloaded where it runs: `otel-training run`'s default
    "watchdog-on": {"watchdog": True},  # the watchdog's work is the drain's
    "watchdog-off-inprocess": {"watchdog": False, "offload": False},
    "watchdog-on-inprocess": {"watchdog": True, "offload": False},  # a sidecar process
}


def make_training(steps: int) -> Callable[[], None]:
    """``steps`` steps of a small MLP from a first DataLoader, as a script trains before it validates."""
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(steps * 32, 256), torch.randint(0, 10, (steps * 32,)))
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train() -> None:
        for x, y in torch.utils.data.DataLoader(data, batch_size=32, shuffle=True):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()

    return train


def first_fetch_s(workers: int) -> float:
    """Wall seconds of the first ``next(iter(loader))`` of a fresh second DataLoader."""
    data = torch.utils.data.TensorDataset(torch.randn(1024, 256), torch.randint(0, 10, (1024,)))
    loader = torch.utils.data.DataLoader(data, batch_size=32, num_workers=workers)
    start = time.perf_counter()
    iterator = iter(loader)
    next(iterator)
    elapsed = time.perf_counter() - start
    del iterator  # its workers stop here, outside the timing
    return elapsed


def trial(options: dict[str, Any] | None, workers: int, args: argparse.Namespace, output: Path) -> float:
    """One run of the script in one mode; returns its first fetch's wall seconds."""
    telemetry = instrumentor = None
    if options is not None:
        # What auto-instrumentation does at interpreter start (the options as `otel-training run` hands them down).
        telemetry = otel_training.configure(reconfigure=True, exporter="file", output_dir=str(output), **options)
        instrumentor = TorchInstrumentor()
        instrumentor.instrument()
    try:
        time.sleep(args.startup_s)  # the script importing torch and building its model
        make_training(args.steps)()
        return first_fetch_s(workers)
    finally:
        if instrumentor is not None:
            instrumentor.uninstrument()
        if telemetry is not None:
            telemetry.shutdown(timeout_s=10)


def _spread(values: list[float]) -> str:
    quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return (f"{statistics.median(values) * 1e3:8.2f} ms  (min {min(values) * 1e3:.2f}, "
            f"quartiles {quartiles[0] * 1e3:.2f}-{quartiles[2] * 1e3:.2f}, max {max(values) * 1e3:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="trials per mode and num_workers (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=20, help="training steps before the fetch (default: %(default)s)")
    parser.add_argument("--startup-s", type=float, default=1.0,
                        help="seconds between configure() and training (default: %(default)s)")
    parser.add_argument("--workers", default="0,2", help="num_workers of the second loader (default: %(default)s)")
    parser.add_argument("--modes", default=",".join(MODES), help="(default: %(default)s)")
    args = parser.parse_args()
    modes = [name.strip() for name in args.modes.split(",")]
    unknown = [name for name in modes if name not in MODES]
    if unknown or "plain" not in modes:
        raise SystemExit(f"--modes: plain and any of {list(MODES)} (unknown: {unknown})")
    workers_list = [int(value) for value in args.workers.split(",")]
    torch.set_num_threads(1)
    times: dict[tuple[int, str], list[float]] = {(w, m): [] for w in workers_list for m in modes}
    with tempfile.TemporaryDirectory(prefix="bench-first-fetch-") as output:
        for workers in workers_list:  # warm-up of both code paths and of torch's DataLoader, not counted
            trial(None, workers, argparse.Namespace(startup_s=0.0, steps=args.steps), Path(output))
            trial(MODES[modes[-1]], workers, argparse.Namespace(startup_s=0.0, steps=args.steps), Path(output))
        for round_index in range(args.rounds):
            order = [(w, m) for w in workers_list for m in modes]
            for workers, mode in order if round_index % 2 == 0 else reversed(order):
                times[(workers, mode)].append(trial(MODES[mode], workers, args, Path(output)))
            print(f"round {round_index + 1}/{args.rounds}: " + ", ".join(
                f"w{w} {m} {times[(w, m)][-1] * 1e3:.1f}" for w in workers_list for m in modes), flush=True)
    print(f"\nfirst next(iter(loader)) of a fresh second DataLoader (batch 32) after {args.steps} steps, "
          f"{args.rounds} interleaved rounds, --startup-s {args.startup_s}, torch {torch.__version__}")
    for workers in workers_list:
        plain = statistics.median(times[(workers, "plain")])
        print(f"num_workers={workers}")
        for mode in modes:
            values = times[(workers, mode)]
            ratios = [value / base for value, base in zip(values, times[(workers, "plain")])]
            print(f"  {mode:24s} {_spread(values)}  median / plain's {statistics.median(values) / plain:.3f} "
                  f"(per round {min(ratios):.2f}-{max(ratios):.2f})")
        for on, off in (("watchdog-on", "watchdog-off"), ("watchdog-on-inprocess", "watchdog-off-inprocess")):
            if on in modes and off in modes:  # what the watchdog itself adds, the rest of the pipeline alike
                ons, offs = times[(workers, on)], times[(workers, off)]
                ratios = [a / b for a, b in zip(ons, offs)]
                print(f"  {on} / {off}: medians {statistics.median(ons) / statistics.median(offs):.3f}, "
                      f"per round median {statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
