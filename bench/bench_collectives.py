"""Collective tracking: cost per collective, and the overhead on a healthy DDP loop.

Prints, in one run (one process, gloo, world size 1 on CPU; tracked and untracked rounds
interleaved; medians, ratios of paired rounds):

1. cost per collective: ``all_reduce`` of a 4-byte tensor with the process
   group's collective hooks attached vs detached (the tracking's own cost is the
   difference; a 1-rank gloo all-reduce is about the cheapest collective there
   is, so the ratio is a worst case);
2. a healthy loop: a DDP model instrumented by ``TorchInstrumentor`` (steps,
   data waits, the file exporter) whose gradients go out in ``--buckets``
   all-reduces per step plus one ``all_gather`` of the loss, with the tracking
   attached vs detached: step time ratio (goal <= 1.02), for each ``--compute-ms``
   of busy compute added per step (0: a tight CPU loop, the worst case; 20: a
   short real step). The tracking costs a fixed time per collective, so the
   ratio is about 1 + collectives/step x cost / step time.

    .venv/bin/python bench/bench_collectives.py [--rounds 9] [--calls 3000] [--steps 200] [--compute-ms 0 20]
    .venv/bin/python bench/bench_collectives.py --route sequence     # the route torch without hooks takes

``--route``: the collective tracking route measured (``collective_tracking``): ``hooks`` (torch's
ProcessGroup hooks, two Python calls per collective) or ``sequence`` (nothing per collective; the
per-group counter is read at each step's end).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist

import otel_training
from otel_training.integrations.torch import TorchInstrumentor


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def per_call_us(call, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - started) / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--buckets", type=int, default=12, help="gradient all-reduces per step (DDP buckets)")
    parser.add_argument("--compute-ms", type=float, nargs="+", default=[0.0, 20.0],
                        help="busy compute added to each step (ms), one loop each")
    parser.add_argument("--route", choices=("hooks", "sequence"), default="hooks",
                        help="the collective tracking route (default: %(default)s)")
    args = parser.parse_args()

    out = tempfile.mkdtemp(prefix="bench-collectives-")
    telemetry = otel_training.configure(output_dir=out, signal_hooks=False, exception_hooks=False,
                                        offload=False,  # as measured: the in-process pipeline
                                        collective_tracking=args.route)
    instrumentor = TorchInstrumentor()
    instrumentor.instrument()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    tracker = TorchInstrumentor.tracker.collectives
    if tracker is None or tracker.route != args.route:
        print(f"this torch does not take the {args.route} route: nothing to measure")
        return 1
    world = dist.group.WORLD

    def tracking(on: bool) -> None:
        if on:
            tracker.attach(world)
        else:
            tracker.detach(world)

    # -- 1. cost per collective --------------------------------------------
    small = torch.ones(1)
    results: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.rounds):
        for on in (False, True):
            tracking(on)
            results[on].append(per_call_us(lambda: dist.all_reduce(small), args.calls))
    off_us, on_us = statistics.median(results[False]), statistics.median(results[True])
    print(f"route: {args.route}")
    print(f"1. all_reduce (4 B, gloo, 1 rank), median of {args.rounds} rounds x {args.calls} calls:")
    print(f"   untracked {off_us:8.2f} us   tracked {on_us:8.2f} us   cost {on_us - off_us:6.2f} us/collective"
          f"   ratio {statistics.median(a / b for a, b in zip(results[True], results[False])):.3f}")

    # -- 2. a healthy DDP loop -----------------------------------------------
    torch.manual_seed(0)
    layers = [torch.nn.Linear(128, 128) for _ in range(args.buckets)]
    bucket_mb = 128 * 129 * 4 / 2**20  # one layer's parameters per bucket
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers), bucket_cap_mb=bucket_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    data = torch.utils.data.TensorDataset(torch.randn(args.steps * 16, 128), torch.randn(args.steps * 16, 128))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    losses = [torch.zeros(1)]

    def epoch(compute_s: float) -> float:
        started = time.perf_counter()
        for x, y in loader:
            deadline = time.perf_counter() + compute_s
            while time.perf_counter() < deadline:
                pass
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            dist.all_gather(losses, loss.detach().reshape(1))
            optimizer.step()
            optimizer.zero_grad()
        return (time.perf_counter() - started) / len(loader) * 1e3

    tracking(True)
    before = tracker.groups[world.group_name].entered
    epoch(0.0)  # warm-up (and the collectives per step)
    per_step = (tracker.groups[world.group_name].entered - before) / len(loader)
    for compute_ms in args.compute_ms:
        loop: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.rounds):
            for on in (False, True):
                tracking(on)
                loop[on].append(epoch(compute_ms / 1e3))
        off_ms, on_ms = statistics.median(loop[False]), statistics.median(loop[True])
        paired = statistics.median(on / off for on, off in zip(loop[True], loop[False]))
        print(f"2. DDP loop, {per_step:.0f} collectives/step, +{compute_ms:g} ms compute, median of {args.rounds} "
              f"rounds x {len(loader)} steps:")
        print(f"   untracked {off_ms:8.3f} ms/step   tracked {on_ms:8.3f} ms/step   ratio {paired:.3f}"
              f" (median of paired rounds; goal <= 1.02)   {(on_ms - off_ms) / per_step * 1e3:+.1f} us per collective")
    tracking(True)
    dist.destroy_process_group()
    instrumentor.uninstrument()
    telemetry.shutdown(timeout_s=5)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OTEL_TRAINING_EXPORTER", "file")
    raise SystemExit(main())
