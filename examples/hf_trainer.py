"""Hugging Face Trainer with the OpenTelemetry callback, on a tiny BERT built from a
config (nothing downloaded), CPU, synthetic data:

    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 python examples/hf_trainer.py --output-dir traces
"""

import argparse
import tempfile

import torch
import transformers

import otel_training
from otel_training.integrations.transformers import OpenTelemetryCallback


class Synthetic(torch.utils.data.Dataset):
    def __init__(self, size: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 100, (size, 16), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.ids[index], "labels": self.ids[index, 0] % 2}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", default=None)
    args = parser.parse_args()
    telemetry = otel_training.configure(**({"output_dir": args.output_dir} if args.output_dir else {}))
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=32, num_labels=2)
    training_args = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-trainer-"), per_device_train_batch_size=8,
        gradient_accumulation_steps=2, num_train_epochs=2, logging_steps=2, eval_strategy="epoch",
        save_strategy="epoch", report_to=[], use_cpu=True, disable_tqdm=True,
    )
    trainer = transformers.Trainer(model=transformers.BertForSequenceClassification(config), args=training_args,
                                   train_dataset=Synthetic(64), eval_dataset=Synthetic(16),
                                   callbacks=[OpenTelemetryCallback()])
    trainer.train()
    telemetry.shutdown()
    print(f"traces: {telemetry.trace_path}")


if __name__ == "__main__":
    main()
