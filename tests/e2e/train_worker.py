"""A small instrumented training loop for the end-to-end tests.

Run directly (one rank) or under torchrun (one process per rank, gloo
all-reduce inside every substep). It uses the events API
(``TrainerProcess``), so every rank exports ``training.train`` >
``training.epoch`` > ``training.step`` > ``training.substep`` with its rank in
the resource; ``configure()`` options come from ``OTEL_TRAINING_*`` variables
and the collector from ``OTEL_EXPORTER_OTLP_*``.

Hooks for the failure tests:

* ``--timings FILE``: one JSON line per finished step (``rank``, ``step``,
  ``start`` wall clock, ``wall_s`` measured around the ``with trainer.step()``
  block), written and flushed as each step ends;
* ``--stop-file FILE``: keep training (up to ``--steps`` per epoch) until the
  file exists, then finish the epoch and the run normally;
* ``--hang-rank R --hang-step N``: rank R prints ``HANG rank=R step=N pid=P``
  and blocks inside step N until it is killed (the other ranks block in the
  next all-reduce);
* ``--freeze-gil S`` (with ``--hang-rank``/``--hang-step``): instead, rank R
  prints ``FREEZE rank=R step=N pid=P``, holds the GIL in one C call for S
  seconds (libc's ``sleep`` through ``ctypes.PyDLL``: no thread of the process
  runs Python meanwhile) and then trains on;
* ``--result FILE``: the ``FlushResult`` of the final bounded shutdown, and the
  number of spans the process ended, as JSON.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import os
import time
from pathlib import Path

from opentelemetry.sdk.trace import SpanProcessor

import otel_training


class _SpanCounter(SpanProcessor):
    """Counts every span the process ends (to check exported + dropped against it)."""

    def __init__(self) -> None:
        self.ended = 0

    def on_end(self, span) -> None:
        self.ended += 1


def _busy(seconds: float) -> None:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5, help="steps per epoch (upper bound with --stop-file)")
    parser.add_argument("--substeps", type=int, default=2)
    parser.add_argument("--step-time", type=float, default=0.01, help="seconds of busy work per step")
    parser.add_argument("--timings", type=Path)
    parser.add_argument("--stop-file", type=Path)
    parser.add_argument("--hang-rank", type=int)
    parser.add_argument("--hang-step", type=int)
    parser.add_argument("--freeze-gil", type=int, help="seconds rank --hang-rank holds the GIL in step --hang-step")
    parser.add_argument("--result", type=Path)
    parser.add_argument("--shutdown-timeout", type=float, default=10.0)
    args = parser.parse_args()

    telemetry = otel_training.configure(offload=False)  # in-process: it counts its spans with its own processor
    counter = _SpanCounter()
    telemetry.add_span_processor(counter)
    rank = telemetry.rank

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        tensor = torch.ones(64)

    timings = open(args.timings, "a", buffering=1) if args.timings else None
    trainer = otel_training.TrainerProcess()
    global_step = 0
    stopped = False
    with trainer.train():
        for epoch in range(args.epochs):
            with trainer.epoch(epoch=epoch):
                for _ in range(args.steps):
                    if args.stop_file is not None and args.stop_file.exists():
                        stopped = True
                        break
                    started_wall, started = time.time(), time.perf_counter()
                    with trainer.step(global_step=global_step, batch_size=8, samples=8):
                        for substep in range(args.substeps):
                            with trainer.substep(substep=substep):
                                _busy(args.step_time / args.substeps)
                                if distributed:
                                    dist.all_reduce(tensor)
                        if rank == args.hang_rank and global_step == args.hang_step and args.freeze_gil:
                            print(f"FREEZE rank={rank} step={global_step} pid={os.getpid()}", flush=True)
                            ctypes.PyDLL(None).sleep(args.freeze_gil)
                        elif rank == args.hang_rank and global_step == args.hang_step:
                            print(f"HANG rank={rank} step={global_step} pid={os.getpid()}", flush=True)
                            while True:
                                time.sleep(1)
                        trainer.log(loss=1.0 / (global_step + 1))
                    wall_s = time.perf_counter() - started
                    if timings is not None:
                        timings.write(json.dumps({"rank": rank, "step": global_step, "start": started_wall, "wall_s": wall_s}) + "\n")
                    global_step += 1
            if stopped:
                break
    if distributed:
        dist.destroy_process_group()
    if timings is not None:
        timings.close()
    result = telemetry.shutdown(timeout_s=args.shutdown_timeout)
    if args.result is not None:
        args.result.write_text(json.dumps({"rank": rank, "steps": global_step, "spans_ended": counter.ended, **dataclasses.asdict(result)}))
    print(f"rank {rank}: {global_step} steps, delivered {result.exported} spans, dropped {result.dropped}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
