"""One rank of a small DDP job on CPU (gloo) that hangs on purpose, for the hang-verdict tests.

Started once per rank with torchrun's variables (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT); configured from ``OTEL_TRAINING_*``/``OTEL_*``
variables and auto-instrumented by ``TorchInstrumentor``. Each step: fetch a
batch, forward, backward (DDP's reducer all-reduces the gradients from C++),
an ``all_gather`` of the loss for logging, optimizer step.

``--scenario`` at ``--at-step K`` (``--culprit R`` is the rank that misbehaves):

* ``sleeper``: rank R sleeps before its forward pass (compute phase), while the
  others enter the gradient all-reduce;
* ``skip``: rank R skips the loss all_gather, so its next collective (step K+1's
  all-reduce) meets the others' all_gather: an unmatched collective;
* ``kill``: rank R SIGKILLs itself before its forward pass;
* ``equal``: every rank sleeps before its forward pass;
* ``freeze``: rank R SIGSTOPs itself (frozen: no heartbeat) before its forward pass;
* ``slow_data``: rank R's Dataset blocks for ``--hang-s`` seconds while its
  DataLoader fetches step K's batch (slow storage), then the job goes on: a hang
  that recovers;
* ``after_step``: rank R sleeps ``--hang-s`` seconds right after step K's
  ``optimizer.step()``, between two steps (a slow logging or checkpoint call
  there), then the job goes on;
* ``logging``: every rank all-reduces its loss for logging after
  ``optimizer.step()`` (outside the step span); rank R sleeps ``--hang-s`` seconds
  before it at step K, so the others wait in that all-reduce, between steps;
* ``healthy``: no fault; every rank all-reduces its loss for logging after
  ``optimizer.step()``; every 6 steps rank 0 saves a checkpoint while the others
  wait in a barrier, and every 6 steps (offset 3) every rank evaluates, each for
  ``--pause`` seconds; runs ``--steps`` steps and exits 0.

Prints ``READY rank=R pid=P`` once the process group is up, ``HANG rank=R step=K``
just before the fault, and ``DONE rank=R`` at a clean end.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import torch
import torch.distributed as dist

import otel_training
from otel_training.integrations.torch import TorchInstrumentor


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", default="healthy",
                        choices=("healthy", "sleeper", "skip", "kill", "equal", "freeze", "slow_data",
                                 "after_step", "logging"))
    parser.add_argument("--culprit", type=int, default=1)
    parser.add_argument("--at-step", type=int, default=4)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--pause", type=float, default=0.5)
    parser.add_argument("--hang-s", type=float, default=3600.0)
    args = parser.parse_args()

    telemetry = otel_training.configure()
    TorchInstrumentor().instrument()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"READY rank={rank} pid={os.getpid()}", flush=True)

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    slow = {"armed": False}

    class Storage(torch.utils.data.TensorDataset):
        """Reads that block once, when armed: slow storage under one rank's DataLoader."""

        def __getitem__(self, index: int):
            if slow["armed"]:
                slow["armed"] = False
                print(f"HANG rank={rank} step={args.at_step}", flush=True)
                time.sleep(args.hang_s)
            return super().__getitem__(index)

    data = Storage(torch.randn(64, 16), torch.randn(64, 16))
    checkpoint = os.path.join(os.environ.get("HANG_WORKER_DIR", "."), f"ckpt-{rank}.pt")

    def batches():
        while True:
            yield from torch.utils.data.DataLoader(data, batch_size=8)

    losses = [torch.zeros(1) for _ in range(world)]
    fault = rank == args.culprit or args.scenario == "equal"
    for step, (x, y) in zip(range(args.steps), batches()):
        if step == args.at_step and fault and args.scenario in ("sleeper", "equal", "kill", "freeze"):
            print(f"HANG rank={rank} step={step}", flush=True)
            if args.scenario == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if args.scenario == "freeze":
                os.kill(os.getpid(), signal.SIGSTOP)
            time.sleep(args.hang_s)
        deadline = time.perf_counter() + args.step_time
        while time.perf_counter() < deadline:  # compute
            pass
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if args.scenario == "skip" and rank == args.culprit and step == args.at_step:
            print(f"HANG rank={rank} step={step}", flush=True)  # skips the all_gather below
        else:
            dist.all_gather(losses, loss.detach().reshape(1))
        optimizer.step()
        optimizer.zero_grad()
        if args.scenario == "slow_data" and rank == args.culprit and step == args.at_step - 1:
            slow["armed"] = True  # the next fetch, step K's, reads from slow storage
        if args.scenario == "after_step" and rank == args.culprit and step == args.at_step:
            print(f"HANG rank={rank} step={step}", flush=True)
            time.sleep(args.hang_s)  # between this step and the next: no step of its own is open
        if args.scenario == "healthy":
            logged = loss.detach().clone()
            dist.all_reduce(logged)  # a real loop's logging all-reduce after optimizer.step(): no hang
        if args.scenario == "logging":
            if rank == args.culprit and step == args.at_step:
                print(f"HANG rank={rank} step={step}", flush=True)
                time.sleep(args.hang_s)  # slow in its own logging code, before the logging all-reduce
            logged = loss.detach().clone()
            dist.all_reduce(logged)  # the loss for logging, after optimizer.step(): between steps
        if args.scenario == "healthy" and step % 6 == 0 and step:
            if rank == 0:
                torch.save(model.state_dict(), checkpoint)
                time.sleep(args.pause)
            dist.barrier()
        if args.scenario == "healthy" and step % 6 == 3:
            with torch.no_grad():
                model(x)
            time.sleep(args.pause)
    dist.destroy_process_group()
    telemetry.shutdown(timeout_s=10)
    print(f"DONE rank={rank}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
