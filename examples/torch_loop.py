"""A plain PyTorch training loop on synthetic data (CPU). No tracing code: run it with

    otel-training run --output-dir traces -- python examples/torch_loop.py

and every iteration becomes a ``training.step`` span (with its data waits,
gradient-accumulation substeps and the checkpoint save) in traces/traces-r0.jsonl.
"""

import argparse
import tempfile
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batches", type=int, default=8, help="batches per epoch")
    parser.add_argument("--accumulation", type=int, default=2, help="micro-batches per optimizer step")
    parser.add_argument("--checkpoint-dir", default=None)
    args = parser.parse_args()

    torch.manual_seed(0)
    features = torch.randn(args.batches * 16, 32)
    targets = features @ torch.randn(32, 1) + 0.1 * torch.randn(args.batches * 16, 1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(features, targets), batch_size=16, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    checkpoint_dir = Path(args.checkpoint_dir or tempfile.mkdtemp(prefix="torch-loop-"))

    for epoch in range(args.epochs):
        model.train()
        for index, (x, y) in enumerate(loader):
            loss = torch.nn.functional.mse_loss(model(x), y) / args.accumulation
            loss.backward()
            if (index + 1) % args.accumulation == 0:
                optimizer.step()
                optimizer.zero_grad()
        model.eval()
        with torch.no_grad():
            total = sum(torch.nn.functional.mse_loss(model(x), y).item() for x, y in loader)
        print(f"epoch {epoch}: eval loss {total / len(loader):.4f}")
        torch.save({"model": model.state_dict(), "epoch": epoch}, checkpoint_dir / f"epoch-{epoch}.pt")


if __name__ == "__main__":
    main()
