"""Wall-time cost of TorchInstrumentor on a real training loop, measured side by side.

One process trains a small MLP on CPU with a DataLoader, alternating rounds with
and without instrumentation (``instrument()`` / ``uninstrument()`` between
rounds, the order flipped every round so warm-up and drift hit both alike). Each
instrumented round produces what auto-instrumentation produces: a step span and
a data-wait span per iteration, exported by the default pipeline (OTLP JSON
file, batch span processor).

    .venv/bin/python bench/bench_torch_overhead.py
    .venv/bin/python bench/bench_torch_overhead.py --device cuda --hidden 4096 --batch-size 512 --batches 50
    .venv/bin/python bench/bench_torch_overhead.py --hidden 64 --batch-size 8 --batches 200 --flush [--offload]
    .venv/bin/python bench/bench_torch_overhead.py --hidden 16 --batch-size 2 --batches 500 --rounds 7 --split [--offload]
    .venv/bin/python bench/bench_torch_overhead.py --hidden 16 --batch-size 2 --batches 40 --rounds 80 --split --offload

(``--device cuda``: the loop on the GPU, pinned memory, ``non_blocking`` copies,
``loss.item()`` every 10 steps, so the instrumented rounds also time every step
on the device timeline; pick ``--hidden``/``--batch-size`` for the step time
you want, e.g. about 4 ms.)

prints the median of the per-round ratios instrumented / plain (goal <= 1.02)
for wall time and for process CPU time (which includes the exporter thread but
not other processes on a shared machine), the cost per step in microseconds,
and the cyclic GC's collections and pauses during each mode's rounds.
``--flush`` ends each instrumented round with a flush, inside its timing (what
was made in a round is paid in that round); ``--offload`` runs the pipeline
with ``offload=True`` (docs/offload.md), so the CPU figure is the training
process's alone and the drain process's is printed apart. ``--split`` takes the
instrumented rounds' extra CPU apart instead (``split()``): the hooks alone,
the step tracker without spans, and all of it; it also prints each variant's
median step against the plain loop's, from every step's own CPU time (short
rounds, many of them: the steadiest time figure on a machine whose speed
varies from round to round); with ``--instructions`` it counts
instructions under callgrind instead of CPU time (``bench/_callgrind.py``: the same
split, deterministic, for a machine whose speed varies from round to round):

    .venv/bin/python bench/bench_torch_overhead.py --hidden 16 --batch-size 2 --batches 500 --rounds 2 --split --offload --instructions
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import torch
from opentelemetry.trace import INVALID_SPAN

import otel_training
from otel_training.integrations.torch import TorchInstrumentor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _callgrind


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

    def epoch(stamps: list[int] | None = None) -> int:
        """One pass; ``stamps``: the process CPU clock as each iteration's body begins (a step is the time
        between two: the fetch, forward, backward and optimizer step, and the hooks in them)."""
        steps = 0
        for x, y in loader:
            if stamps is not None:
                stamps.append(time.process_time_ns())
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


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far."""
    fields = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40, help="rounds per mode (default: %(default)s)")
    parser.add_argument("--batches", type=int, default=10, help="steps per round (default: %(default)s)")
    parser.add_argument("--hidden", type=int, default=1024, help="MLP width (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=128, help="(default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default: %(default)s)")
    parser.add_argument("--ballast", type=int, default=0,
                        help="objects kept alive as a big program's heap would (a transformers model, its "
                             "tokenizer...): a full GC collection walks them all (default: %(default)s)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: the loop on the GPU, with the device timeline on (default: %(default)s)")
    parser.add_argument("--flush", action="store_true", help="flush at the end of each instrumented round, timed")
    parser.add_argument("--offload", action="store_true", help="configure(offload=True): spans built by a drain")
    parser.add_argument("--split", action="store_true",
                        help="instead: where the instrumented rounds' extra CPU goes (see split())")
    parser.add_argument("--instructions", action="store_true",
                        help="with --split: count instructions under callgrind instead of CPU time "
                             "(deterministic; bench/_callgrind.py)")
    args = parser.parse_args()
    if args.split and args.instructions and not _callgrind.active():
        report_instructions(args, _callgrind.run(sys.argv))
        return
    if args.split:
        split(args)
        return
    torch.set_num_threads(args.threads)
    ballast = [{"i": index, "children": []} for index in range(args.ballast // 3)]  # dict + list each, and the list

    with tempfile.TemporaryDirectory(prefix="bench-torch-") as output:
        telemetry = otel_training.configure(output_dir=output, signal_hooks=False, exception_hooks=False,
                                            offload=args.offload)
        if args.offload and not telemetry.drain_ready(timeout_s=30):  # the steady state: the drain runs
            raise SystemExit("the drain process did not start within 30 s")
        drain = getattr(telemetry, "_drain", None)
        drain_cpu = _cpu_of(drain.pid) if drain is not None else 0.0
        epoch = make_loop(args.hidden, args.batch_size, args.batches, args.device)
        instrumentor = TorchInstrumentor()
        epoch()  # warm-up, both code paths
        instrumentor.instrument()
        epoch()
        instrumentor.uninstrument()

        times: dict[bool, list[float]] = {False: [], True: []}
        cpu: dict[bool, list[float]] = {False: [], True: []}
        ratios, cpu_ratios = [], []
        # Python's cyclic GC, by the mode whose round it interrupted: the spans a pipeline keeps
        # (queued for export, awaiting goodput settling) outlive the young generations, and once
        # enough have been promoted a full collection walks every object of the process (torch's
        # and the model's included), pausing the training thread.
        collections = {mode: [0, 0, 0] for mode in (False, True)}
        paused = {False: 0.0, True: 0.0}
        full_paused = {False: 0.0, True: 0.0}
        longest = {False: 0.0, True: 0.0}
        mode = [False]
        began = [0.0]

        def on_gc(phase: str, info: dict) -> None:
            if phase == "start":
                began[0] = time.perf_counter()
                return
            took = time.perf_counter() - began[0]
            collections[mode[0]][info["generation"]] += 1
            paused[mode[0]] += took
            longest[mode[0]] = max(longest[mode[0]], took)
            if info["generation"] == 2:
                full_paused[mode[0]] += took

        gc.callbacks.append(on_gc)
        for round_index in range(args.rounds):
            for instrumented in ((False, True) if round_index % 2 == 0 else (True, False)):
                mode[0] = instrumented
                if instrumented:
                    instrumentor.instrument()
                started, started_cpu = time.perf_counter(), time.process_time()
                steps = epoch()
                if instrumented and args.flush:
                    telemetry.force_flush(timeout_s=30)
                times[instrumented].append(time.perf_counter() - started)
                cpu[instrumented].append(time.process_time() - started_cpu)
                if instrumented:
                    instrumentor.uninstrument()
            ratios.append(times[True][-1] / times[False][-1])
            cpu_ratios.append(cpu[True][-1] / cpu[False][-1])
        gc.callbacks.remove(on_gc)
        telemetry.force_flush(timeout_s=30)
        drain_cpu = _cpu_of(drain.pid) - drain_cpu if drain is not None else 0.0
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
    if drain is not None:
        print(f"the drain process (offload): {drain_cpu / (args.rounds * steps) * 1e6:.0f} us CPU per instrumented "
              "step, in another process")
    total_steps = args.rounds * steps
    for instrumented, label in ((False, "plain"), (True, "instrumented")):
        young, middle, full = collections[instrumented]
        print(f"GC during {label + ' rounds:':19s} {young}/{middle}/{full} collections (gen 0/1/2), "
              f"{paused[instrumented] / total_steps * 1e6:.1f} us/step paused "
              f"({full_paused[instrumented] / total_steps * 1e6:.1f} in full collections), longest pause "
              f"{longest[instrumented] * 1e3:.1f} ms; {len(gc.get_objects())} objects tracked")
    del ballast


#: The step tracker's entry points (what the instrumentor's wrappers and hooks call).
HOOKS = ("fetch_begin", "fetch_end", "backward_begin", "backward_end", "optimizer_pre", "optimizer_post")


def split(args: argparse.Namespace) -> None:
    """The instrumented rounds' extra CPU per step, taken apart, in interleaved rounds of one process.

    ``hooks only``: the wrappers and hooks call step-tracker methods that do nothing (what the
    instrumentation costs before it records anything); ``no spans``: the tracker's state machine
    runs (steps open and close, waits are timed) but no span is made; ``full``: as shipped.
    """
    from otel_training.integrations.torch import instrumentor as instrumentor_module
    from otel_training.integrations.torch.tracker_class import tracker_class

    def nothing(self: Any, *args: Any, **kwargs: Any) -> None:
        return None

    class BareStep:  # what the hooks read of an open step, and no span
        span = INVALID_SPAN
        device_step = None

    def open_bare(self: Any, awaiting_input: bool = False, rt: Any = None) -> None:
        self._step, self._ctx = BareStep(), None

    def close_bare(self: Any) -> None:
        if self._step is not None:
            self._step = None
            self._number += 1
            self._reset()
            self._just_closed = True

    variants: dict[str, dict[str, Any] | None] = {
        "plain": None, "hooks only": dict.fromkeys(HOOKS, nothing),
        "no spans": {"_open": open_bare, "_close": close_bare}, "full": {},
    }
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-torch-") as output:
        telemetry = otel_training.configure(output_dir=output, signal_hooks=False, exception_hooks=False,
                                            offload=args.offload)
        if args.offload and not telemetry.drain_ready(timeout_s=30):  # the steady state: the drain runs
            raise SystemExit("the drain process did not start within 30 s")
        core = instrumentor_module._native_core()  # the class instrument() makes: with the C hooks where they load
        tracker = tracker_class(core[0].StepCore if core is not None else None)
        shipped = {name: getattr(tracker, name) for name in (*HOOKS, "_open", "_close")}
        epoch = make_loop(args.hidden, args.batch_size, args.batches, args.device)
        instrumentor = TorchInstrumentor()
        if _callgrind.active():
            # ~50x slower under valgrind, a prefetched batch's fetch can pass the 1 ms past which a wait gets a
            # span of its own, in some rounds and not others; natively it takes microseconds: no such spans
            from otel_training.integrations.torch import steps

            steps.DATA_WAIT_SPAN_MIN_NS = 10**15
        epoch()
        _callgrind.start()
        cpu: dict[str, list[float]] = {name: [] for name in variants}
        per_step: dict[str, list[list[int]]] = {name: [] for name in variants}
        for round_index in range(args.rounds):
            order = list(variants) if round_index % 2 == 0 else list(reversed(variants))
            for name in order:
                for attribute, method in {**shipped, **(variants[name] or {})}.items():
                    setattr(tracker, attribute, method)
                if variants[name] is not None:
                    instrumentor.instrument()
                _callgrind.mark(name)
                stamps: list[int] = []
                started = time.process_time()
                steps_done = epoch(stamps)
                cpu[name].append((time.process_time() - started) / steps_done)
                # every step but the round's first (it opens the epoch) and last (no stamp after it)
                per_step[name].append([later - earlier for earlier, later in zip(stamps[1:], stamps[2:])])
                _callgrind.count(steps_done)
                _callgrind.mark(None)
                if variants[name] is not None:
                    instrumentor.uninstrument()
        for attribute, method in shipped.items():
            setattr(tracker, attribute, method)
        telemetry.shutdown(timeout_s=10)
    if _callgrind.active():
        _callgrind.finish()
        return
    plain = statistics.median(cpu["plain"])
    print(f"MLP 256-{args.hidden}-{args.hidden}-10, batch {args.batch_size}, {args.batches} steps a round, "
          f"{args.rounds} rounds of each, {'offload=True' if args.offload else 'in-process'}; process CPU per step")
    floor = min(cpu["plain"])
    for name, values in cpu.items():
        extra = [value - base for value, base in zip(values, cpu["plain"])]
        print(f"{name:11s} {statistics.median(values) * 1e6:8.1f} us   extra {statistics.median(extra) * 1e6:7.1f} us "
              f"(rounds {min(extra) * 1e6:.1f} to {max(extra) * 1e6:.1f}; at the floor, each side's fastest round: "
              f"{(min(values) - floor) * 1e6:.1f})" if name != "plain"
              else f"{name:11s} {plain * 1e6:8.1f} us   (fastest round {floor * 1e6:.1f} us)")
    report_per_step(per_step)


def report_per_step(per_step: dict[str, list[list[int]]], groups: int = 5) -> None:
    """The extra CPU a step from every step's own time: each variant's median step against the plain one's.

    A round's mean moves with the machine's speed from one round to the next (a quarter on a shared
    2-core guest); the median of thousands of steps, taken from rounds that alternate the variants, does
    not move with a few slow rounds. The spread: the same figure in ``groups`` consecutive groups of rounds.
    """
    rounds = len(per_step["plain"])
    base_all = statistics.median(step for steps in per_step["plain"] for step in steps)
    print(f"per step (median of every step's process CPU, all rounds; in brackets: the same in {groups} groups "
          f"of consecutive rounds, min to max)")
    for name, by_round in per_step.items():
        median = statistics.median(step for steps in by_round for step in steps)
        if name == "plain":
            print(f"{name:11s} {median / 1000:8.1f} us")
            continue
        extras = []
        for group in range(groups):
            chosen = range(group * rounds // groups, (group + 1) * rounds // groups)
            if not chosen:
                continue
            ours = statistics.median(step for index in chosen for step in by_round[index])
            base = statistics.median(step for index in chosen for step in per_step["plain"][index])
            extras.append((ours - base) / 1000)
        print(f"{name:11s} {median / 1000:8.1f} us   extra {(median - base_all) / 1000:6.1f} us "
              f"({min(extras):.1f} to {max(extras):.1f})")


def report_instructions(args: argparse.Namespace, per_step: dict[str, list[float]]) -> None:
    """``--split --instructions``: each variant's instructions a step, and the extra over the plain loop's."""
    print(f"MLP 256-{args.hidden}-{args.hidden}-10, batch {args.batch_size}, {args.batches} steps a round, "
          f"{args.rounds} rounds of each, {'offload=True' if args.offload else 'in-process'}; instructions a step "
          f"counted by callgrind in the training process (all its threads)")
    plain = per_step["plain"]
    for name, values in per_step.items():
        extra = [value - base for value, base in zip(values, plain)]
        print(f"{name:11s} {statistics.median(values):11.0f}" + (
            f"   extra {statistics.median(extra):8.0f} (rounds {min(extra):.0f} to {max(extra):.0f})"
            if name != "plain" else f"   (rounds {min(values):.0f} to {max(values):.0f})"))


if __name__ == "__main__":
    main()
