"""A plain, unmodified CUDA training loop, written the ordinary way (no otel_training import).

8 x Linear(4096) + GELU, AdamW, a pinned-memory DataLoader, ``non_blocking``
copies and ``loss.item()`` every ``--item-every`` steps: the loop in which a
host-timeline step span measures launch time and the GPU's work lands in the
DataLoader wait or in no span at all.

Run it under ``otel-training run`` to see the device timeline. For checking
figures, it records its own CUDA events at the top of every iteration (the
"true" step time) and prints one JSON line: the median true step time, wall
time, the device's own busy and idle time between those events and each optimizer step's end,
the host's own time from each iteration's top to its optimizer step's return (launching, unless
it blocked), and the step it stalled (``--stall-step`` sleeps the GPU for
``--stall-s`` at the top of that step's forward pass, as a hung kernel would).

    otel-training run --output-dir traces -- python examples/cuda_plain_loop.py --steps 200
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--item-every", type=int, default=10, help="loss.item() every this many steps")
    parser.add_argument("--stall-step", type=int, default=None, help="sleep the GPU at this step's forward")
    parser.add_argument("--stall-s", type=float, default=4.0)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--epoch-batches", type=int, default=8,
                        help="batches per epoch (with workers, each epoch's first batch starts the pipeline anew)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("this example needs CUDA")

    device = torch.device("cuda")
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    samples = args.batch * args.epoch_batches
    data = torch.utils.data.TensorDataset(torch.randn(samples, args.width), torch.randn(samples, args.width))
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=True, pin_memory=True, drop_last=True,
                                         num_workers=args.workers, persistent_workers=args.workers > 0)

    cycles_per_s = cycles_per_second() if args.stall_step is not None else 0
    tops: list[torch.cuda.Event] = []
    dones: list[torch.cuda.Event] = []
    launches: list[float] = []  # host time from an iteration's top to its optimizer step's return
    step = 0
    started = time.perf_counter()
    while step < args.steps:
        for x, y in loader:
            if step >= args.steps:
                break
            launched = time.perf_counter()
            top = torch.cuda.Event(enable_timing=True)
            top.record()
            tops.append(top)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            if step == args.stall_step:
                torch.cuda._sleep(int(args.stall_s * cycles_per_s))  # noqa: SLF001 - torch's own spin kernel: a hung kernel
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            launches.append(time.perf_counter() - launched)
            done = torch.cuda.Event(enable_timing=True)
            done.record()
            dones.append(done)
            if step % args.item_every == args.item_every - 1:
                loss.item()
            step += 1
    torch.cuda.synchronize()
    wall_s = time.perf_counter() - started
    periods = [a.elapsed_time(b) / 1e3 for a, b in itertools.pairwise(tops)]
    warm = periods[5:] if len(periods) > 10 else periods
    # The device's own account: busy from an iteration's top to its optimizer step's end, idle from
    # there to the next top (the device waited for the host: its next batch, a sync, the launch).
    busy = [top.elapsed_time(done) / 1e3 for top, done in zip(tops, dones)]
    idle = [done.elapsed_time(top) / 1e3 for done, top in zip(dones, tops[1:])]
    window_s = tops[0].elapsed_time(dones[-1]) / 1e3
    print(json.dumps({
        "steps": step, "wall_s": wall_s, "true_step_median_s": statistics.median(warm),
        "busy_step_median_s": statistics.median(busy[6:] if len(busy) > 11 else busy),
        # Far below the step time: the GPU, not the host, sets the pace.
        "host_launch_median_s": statistics.median(launches[6:] if len(launches) > 11 else launches),
        "device_busy_s": sum(busy), "device_idle_s": sum(idle), "device_window_s": window_s,
        "stall_step": args.stall_step, "device": torch.cuda.get_device_name(),
    }), flush=True)


def cycles_per_second() -> float:
    """GPU clock cycles per second, measured with ``torch.cuda._sleep`` itself (the tests and
    bench/bench_device.py stall the GPU with it too)."""
    cycles = 100_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)  # noqa: SLF001 - torch's own spin kernel, timed
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) / 1e3)


if __name__ == "__main__":
    main()
