"""PyTorch Lightning with the OpenTelemetry callback (CPU, synthetic data):

    python examples/lightning_fit.py --output-dir traces

Lightning's checkpoints go to --checkpoint-dir (default: a new temporary
directory), never into the current directory.
"""

import argparse
import tempfile

import lightning
import torch

import otel_training
from otel_training.integrations.lightning import OpenTelemetryCallback


class Regressor(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", default=None)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--checkpoint-dir", default=None, help="Lightning's default_root_dir (default: a temp dir)")
    args = parser.parse_args()
    telemetry = otel_training.configure(**({"output_dir": args.output_dir} if args.output_dir else {}))
    data = torch.utils.data.TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    root_dir = args.checkpoint_dir or tempfile.mkdtemp(prefix="lightning-fit-")
    trainer = lightning.Trainer(default_root_dir=root_dir, max_epochs=args.epochs, accumulate_grad_batches=2,
                                accelerator="cpu", devices=1, callbacks=[OpenTelemetryCallback()], logger=False,
                                enable_progress_bar=False)
    trainer.fit(Regressor(), loader, loader)
    telemetry.shutdown()
    print(f"traces: {telemetry.trace_path}; checkpoints: {root_dir}")


if __name__ == "__main__":
    main()
