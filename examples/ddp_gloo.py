"""Data-parallel training on CPU with two processes and gloo, under torchrun:

    otel-training run --output-dir traces -- \
        torchrun --nproc-per-node 2 --master-port 29511 examples/ddp_gloo.py

Each worker writes traces/traces-r<rank>.jsonl with its rank and world size in
the resource: process-group setup, barrier and teardown, one step span per
iteration, and rank 0's checkpoint save. The script itself has no tracing code.
"""

import argparse
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=6, help="batches per rank")
    parser.add_argument("--checkpoint-dir", default=None)
    args = parser.parse_args()

    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR/PORT come from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(args.batches * 8 * world, 16), torch.randn(args.batches * 8 * world, 1))
    sampler = torch.utils.data.distributed.DistributedSampler(data, num_replicas=world, rank=rank)
    loader = torch.utils.data.DataLoader(data, batch_size=8, sampler=sampler)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()  # gradients all-reduced over gloo
        optimizer.step()
    dist.barrier()
    if rank == 0:
        directory = Path(args.checkpoint_dir or tempfile.mkdtemp(prefix="ddp-"))
        torch.save(model.module.state_dict(), directory / "model.pt")
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}/{world} (pid {os.getpid()}): done")


if __name__ == "__main__":
    main()
