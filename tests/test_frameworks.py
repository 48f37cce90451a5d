"""Framework callbacks on real Lightning, transformers and Keras (torch backend), tiny local models."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
from requirements import require

os.environ.setdefault("KERAS_BACKEND", "torch")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

torch = require("torch")
from otlp_json import read_spans  # noqa: E402

from otel_training import semconv as sc  # noqa: E402
from otel_training.integrations.torch import TorchInstrumentor  # noqa: E402


def spans_of(telemetry) -> list[dict]:
    assert telemetry.force_flush(5).completed
    return read_spans(telemetry.trace_path)


def by_name(spans: list[dict], name: str) -> list[dict]:
    return sorted((s for s in spans if s["name"] == name), key=lambda s: s["start"])


def parent_of(spans: list[dict], span: dict) -> dict:
    return next(s for s in spans if s["span_id"] == span["parent_id"])


@pytest.fixture
def instrumented(configure):
    """Torch auto-instrumentation on too: callbacks must suspend its steps (no double steps)."""
    telemetry = configure()
    TorchInstrumentor().instrument()
    yield telemetry
    TorchInstrumentor().uninstrument()


def test_lightning_callback(instrumented, tmp_path: Path):
    lightning = require("lightning")
    from otel_training.integrations.lightning import OpenTelemetryCallback

    class Tiny(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)  # 8 batches per epoch
    trainer = lightning.Trainer(
        max_epochs=2, accumulate_grad_batches=2, callbacks=[OpenTelemetryCallback()], default_root_dir=tmp_path,
        logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1,
        num_sanity_val_steps=0, limit_val_batches=2,
    )
    trainer.fit(Tiny(), loader, loader)

    spans = spans_of(instrumented)
    counts = Counter(s["name"] for s in spans)
    assert counts[sc.SPAN_TRAIN] == 1 and counts[sc.SPAN_EPOCH] == 2
    steps = by_name(spans, sc.SPAN_STEP)
    assert len(steps) == 8  # 16 batches / 2 accumulated (the torch instrumentor added none)
    assert {s["attributes"][sc.INSTRUMENTATION_SOURCE] for s in steps} == {"lightning"}
    assert [s["attributes"][sc.STEP] for s in steps] == list(range(8))
    assert all(s["attributes"][sc.STEP_SUBSTEPS] == 2 for s in steps)
    assert counts[sc.SPAN_SUBSTEP] == 16
    assert all(parent_of(spans, s)["name"] == sc.SPAN_STEP for s in by_name(spans, sc.SPAN_SUBSTEP))
    assert all(parent_of(spans, s)["name"] == sc.SPAN_EPOCH for s in steps)
    assert counts[sc.SPAN_EVALUATE] == 2
    # Loss and learning rate of each batch as log events.
    logs = [e for s in by_name(spans, sc.SPAN_SUBSTEP) for e in s["events"] if e["name"] == "#log"]
    assert len(logs) == 16 and all(sc.LOSS in e["attributes"] and e["attributes"][sc.LEARNING_RATE] == 0.1
                                   for e in logs)
    saves = by_name(spans, sc.SPAN_SAVE_CHECKPOINT)  # ModelCheckpoint, once per epoch, no nested torch.save span
    assert len(saves) == 2
    assert all(Path(s["attributes"][sc.CHECKPOINT_PATH]).suffix == ".ckpt" and s["attributes"][sc.CHECKPOINT_BYTES] > 0
               for s in saves)


def test_lightning_exception_fails_open_spans(instrumented, tmp_path: Path):
    lightning = require("lightning")
    from otel_training.integrations.lightning import OpenTelemetryCallback

    class Exploding(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.configure_optimizers = lambda: torch.optim.SGD(self.parameters(), lr=0.1)

        def training_step(self, batch, batch_idx):
            if batch_idx == 2:
                raise ValueError("boom")
            return self.layer(batch[0]).sum()

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 4)), batch_size=4)
    trainer = lightning.Trainer(max_epochs=1, callbacks=[OpenTelemetryCallback()], default_root_dir=tmp_path,
                                logger=False, enable_progress_bar=False, enable_model_summary=False,
                                enable_checkpointing=False, accelerator="cpu", devices=1)
    with pytest.raises(ValueError, match="boom"):
        trainer.fit(Exploding(), loader)

    spans = spans_of(instrumented)
    failed = {s["name"] for s in spans if s["status"].get("code") == 2}
    assert {sc.SPAN_STEP, sc.SPAN_EPOCH, sc.SPAN_TRAIN} <= failed


def test_transformers_trainer_callback(instrumented, tmp_path: Path):
    transformers = require("transformers")
    from otel_training.integrations.transformers import OpenTelemetryCallback

    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=16, max_position_embeddings=16, num_labels=2)
    model = transformers.BertForSequenceClassification(config)

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, index):
            return {"input_ids": torch.randint(0, 50, (8,)), "labels": torch.tensor(index % 2)}

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, per_device_eval_batch_size=4,
        gradient_accumulation_steps=2, num_train_epochs=2, logging_steps=1, save_strategy="epoch",
        eval_strategy="epoch", report_to=[], use_cpu=True, disable_tqdm=True, dataloader_num_workers=0,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Data(), eval_dataset=Data(),
                                   callbacks=[OpenTelemetryCallback()])
    trainer.train()

    spans = spans_of(instrumented)
    counts = Counter(s["name"] for s in spans)
    assert counts[sc.SPAN_TRAIN] == 1 and counts[sc.SPAN_EPOCH] == 2
    steps = by_name(spans, sc.SPAN_STEP)
    assert len(steps) == 4  # 16 samples / (4 x 2 accumulated) x 2 epochs
    assert {s["attributes"][sc.INSTRUMENTATION_SOURCE] for s in steps} == {"transformers"}
    assert [s["attributes"][sc.STEP] for s in steps] == [0, 1, 2, 3]
    assert counts[sc.SPAN_SUBSTEP] == 8
    assert counts[sc.SPAN_EVALUATE] == 2
    saves = by_name(spans, sc.SPAN_SAVE_CHECKPOINT)
    hf_saves = [s for s in saves if s["attributes"].get(sc.CHECKPOINT_FORMAT) == "transformers"]
    assert [s["attributes"][sc.CHECKPOINT_STEP] for s in hf_saves] == [2, 4]
    assert all(s["attributes"][sc.CHECKPOINT_BYTES] > 0 for s in hf_saves)
    logged = [e["attributes"] for s in spans for e in s["events"] if e["name"] == "#log"]
    assert any(sc.LOSS in attributes and sc.LEARNING_RATE in attributes for attributes in logged)


def test_keras_callback(configure):
    keras = require("keras")
    from otel_training.integrations.keras import OpenTelemetryCallback

    telemetry = configure()
    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = torch.randn(24, 4).numpy(), torch.randn(24, 1).numpy()
    callback = OpenTelemetryCallback()
    model.fit(x, y, batch_size=8, epochs=2, validation_data=(x[:8], y[:8]), verbose=0, callbacks=[callback])
    model.predict(x[:16], batch_size=8, verbose=0, callbacks=[callback])

    spans = spans_of(telemetry)
    counts = Counter(s["name"] for s in spans)
    assert counts[sc.SPAN_TRAIN] == 1 and counts[sc.SPAN_EPOCH] == 2
    steps = by_name(spans, sc.SPAN_STEP)
    assert [s["attributes"][sc.STEP] for s in steps] == list(range(6))
    assert counts[sc.SPAN_EVALUATE] == 2 and counts[sc.SPAN_PREDICT] == 1 and counts[sc.SPAN_PREDICT_STEP] == 2
    step_logs = [e for s in steps for e in s["events"] if e["name"] == "#log"]
    assert len(step_logs) == 6 and all(sc.LOSS in e["attributes"] for e in step_logs)


def test_a_callback_given_a_tracer_provider_sends_its_spans_there(configure):
    """As contrib's instrumentors: a callback built with ``tracer_provider=`` records into that provider."""
    keras = require("keras")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_training.integrations.keras import OpenTelemetryCallback

    telemetry = configure()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = torch.randn(16, 4).numpy(), torch.randn(16, 1).numpy()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[OpenTelemetryCallback(tracer_provider=provider)])
    counts = Counter(span.name for span in exporter.get_finished_spans())
    assert counts[sc.SPAN_TRAIN] == 1 and counts[sc.SPAN_EPOCH] == 1 and counts[sc.SPAN_STEP] == 2
    assert telemetry.force_flush(5).completed
    assert not telemetry.trace_path.exists() or not by_name(spans_of(telemetry), sc.SPAN_STEP)
