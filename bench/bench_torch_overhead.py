"""Wall-time cost of TorchInstrumentor on a real training loop, measured side by side.

One process trains a small MLP on CPU with a DataLoader, alternating rounds with
and without instrumentation (``instrument()`` / ``uninstrument()`` between
rounds, the order flipped every round so warm-up and drift hit both alike). Each
instrumented round produces what auto-instrumentation produces: a step span and
a data-wait span per iteration, exported by the default pipeline (OTLP JSON
file, batch span processor).

    .venv/bin/python bench/bench_torch_overhead.py
    .venv/bin/python bench/bench_torch_overhead.py --device cuda --hidden 4096 --batch-size 512 --batches 50

(``--device cuda``: the loop on the GPU, pinned memory, ``non_blocking`` copies,
``loss.item()`` every 10 steps, so the instrumented rounds also time every step
on the device timeline; pick ``--hidden``/``--batch-size`` for the step time
you want, e.g. about 4 ms.)

prints the median of the per-round ratios instrumented / plain (goal <= 1.02)
for wall time and for process CPU time (which includes the exporter thread but
not other processes on a shared machine), and the cost per step in microseconds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

import otel_training
from otel_training.integrations.torch import TorchInstrumentor


def make_loop(hidden: int, batch_size: int, batches: int, device: str = "cpu"):
    """The loop as people write it: on CUDA, pinned batches, ``non_blocking`` copies, ``loss.item()`` every 10."""
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(batches * batch_size, 256), torch.randint(0, 10, (batches * batch_size,)))
    cuda = device == "cuda"
    loader = torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=True, pin_memory=cuda)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10),
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def epoch() -> int:
        steps = 0
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            steps += 1
            if steps % 10 == 0:
                loss.item()
        if cuda:
            torch.cuda.synchronize()  # a round ends when the GPU has done its work
        return steps

    return epoch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40, help="rounds per mode (default: %(default)s)")
    parser.add_argument("--batches", type=int, default=10, help="steps per round (default: %(default)s)")
    parser.add_argument("--hidden", type=int, default=1024, help="MLP width (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=128, help="(default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default: %(default)s)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: the loop on the GPU, with the device timeline on (default: %(default)s)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory(prefix="bench-torch-") as output:
        telemetry = otel_training.configure(output_dir=output, signal_hooks=False, exception_hooks=False)
        epoch = make_loop(args.hidden, args.batch_size, args.batches, args.device)
        instrumentor = TorchInstrumentor()
        epoch()  # warm-up, both code paths
        instrumentor.instrument()
        epoch()
        instrumentor.uninstrument()

        times: dict[bool, list[float]] = {False: [], True: []}
        cpu: dict[bool, list[float]] = {False: [], True: []}
        ratios, cpu_ratios = [], []
        for round_index in range(args.rounds):
            for instrumented in ((False, True) if round_index % 2 == 0 else (True, False)):
                if instrumented:
                    instrumentor.instrument()
                started, started_cpu = time.perf_counter(), time.process_time()
                steps = epoch()
                times[instrumented].append(time.perf_counter() - started)
                cpu[instrumented].append(time.process_time() - started_cpu)
                if instrumented:
                    instrumentor.uninstrument()
            ratios.append(times[True][-1] / times[False][-1])
            cpu_ratios.append(cpu[True][-1] / cpu[False][-1])
        result = telemetry.shutdown(timeout_s=10)

    plain, traced = statistics.median(times[False]), statistics.median(times[True])
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"model: MLP 256-{args.hidden}-{args.hidden}-10, batch {args.batch_size}, {steps} steps/round, "
          f"{args.rounds} rounds per mode, torch {torch.__version__}, {where}")
    print(f"plain:        median {plain * 1e3:8.1f} ms/round  ({plain / steps * 1e3:.2f} ms/step)")
    print(f"instrumented: median {traced * 1e3:8.1f} ms/round  ({traced / steps * 1e3:.2f} ms/step)")
    print(f"ratio instrumented/plain: median {statistics.median(ratios):.4f} "
          f"(min {min(ratios):.4f}, max {max(ratios):.4f}); goal <= 1.02")
    print(f"ratio of CPU time:        median {statistics.median(cpu_ratios):.4f} "
          f"(min {min(cpu_ratios):.4f}, max {max(cpu_ratios):.4f})")
    print(f"cost per step: {(traced - plain) / steps * 1e6:.0f} us; spans exported {result.exported}, "
          f"dropped {result.dropped}")


if __name__ == "__main__":
    main()
