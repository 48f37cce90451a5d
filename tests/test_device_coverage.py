"""The device timeline wherever steps come from: torch loops with gradient accumulation, several
optimizers, AMP skips, DDP, FSDP2 and torch.compile, and the Lightning, Hugging Face and Keras
callbacks, on real frameworks (CPU) with the fake asynchronous device standing in for CUDA
(tests/fake_device.py).

What each test checks: every host step has exactly one device step as its child, and the device step
covers all the device work the iteration launched, up to and including its last optimizer step.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_device import FakeDevice
from otlp_json import read_spans
from requirements import require

from otel_training import semconv as sc

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("KERAS_BACKEND", "torch")
torch = require("torch")

from otel_training.integrations.torch import TorchInstrumentor  # noqa: E402

#: Device seconds each launch stands for; the optimizer's own launch is longer, so it is seen.
KERNEL_S = 0.002
OPTIMIZER_S = 0.006




@pytest.fixture
def instrumented(configure, fake):
    telemetry = configure(stuck_threshold_s=30)
    TorchInstrumentor().instrument()
    yield telemetry
    TorchInstrumentor().uninstrument()


def spans_of(telemetry, fake: FakeDevice) -> list[dict]:
    fake.synchronize()
    assert telemetry.shutdown(timeout_s=5).completed
    return read_spans(telemetry.trace_path)


def steps_and_device_steps(spans: list[dict]) -> list[tuple[dict, dict]]:
    """(host step, its device step) pairs, checking the structure on the way."""
    hosts = sorted((s for s in spans if s["name"] == sc.SPAN_STEP), key=lambda s: s["start"])
    devices = {s["parent_id"]: s for s in spans if s["name"] == sc.SPAN_DEVICE_STEP}
    assert hosts, "no step spans"
    assert len(devices) == len(hosts), (len(devices), len(hosts))
    pairs = []
    for host in hosts:
        assert host["attributes"][sc.STEP_DEVICE_TIMED] is True
        device_step = devices[host["span_id"]]
        assert device_step["attributes"].get(sc.STEP) == host["attributes"].get(sc.STEP)
        pairs.append((host, device_step))
    return pairs


def device_s(span: dict) -> float:
    return (span["end"] - span["start"]) / 1e9


def launching_optimizer(fake: FakeDevice, params, cls=torch.optim.SGD):
    """An optimizer whose step launches device work, as a fused CUDA optimizer does."""

    class Launching(cls):  # type: ignore[misc, valid-type]
        def step(self, *args, **kwargs):
            fake.launch(OPTIMIZER_S)
            return super().step(*args, **kwargs)

    return Launching(params, lr=0.01)


def test_gradient_accumulation_one_device_step_per_optimizer_step(instrumented, fake) -> None:
    model = torch.nn.Linear(4, 1)
    optimizer = launching_optimizer(fake, model.parameters())
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1)),
                                       batch_size=2)
    for index, (x, y) in enumerate(data):
        fake.launch(KERNEL_S)  # forward + backward of one micro-batch
        torch.nn.functional.mse_loss(model(x), y).backward()
        if index % 4 == 3:
            optimizer.step()
            optimizer.zero_grad()
    pairs = steps_and_device_steps(spans_of(instrumented, fake))
    assert len(pairs) == 4
    for host, device_step in pairs:
        assert host["attributes"][sc.STEP_SUBSTEPS] == 4
        # Four micro-batches and the optimizer's own launch, all inside the device step.
        assert device_s(device_step) >= 4 * KERNEL_S + OPTIMIZER_S


def test_several_optimizers_the_device_step_ends_after_the_last(instrumented, fake) -> None:
    generator, critic = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    g_opt = launching_optimizer(fake, generator.parameters())
    c_opt = launching_optimizer(fake, critic.parameters())
    data = torch.utils.data.DataLoader(torch.randn(12, 4), batch_size=2)
    for x in data:
        fake.launch(KERNEL_S)
        critic(generator(x)).mean().backward()
        g_opt.step()
        c_opt.step()
        g_opt.zero_grad()
        c_opt.zero_grad()
    pairs = steps_and_device_steps(spans_of(instrumented, fake))
    assert len(pairs) == 6
    for host, device_step in pairs[1:]:  # from the second iteration on, both optimizers are expected
        assert host["attributes"][sc.STEP_OPTIMIZER_STEPS] == 2
        assert device_s(device_step) >= KERNEL_S + 2 * OPTIMIZER_S


def test_a_gradscaler_skip_still_ends_the_device_step(instrumented, fake) -> None:
    model = torch.nn.Linear(4, 1)
    optimizer = launching_optimizer(fake, model.parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**20)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 1)),
                                       batch_size=2)
    for index, (x, y) in enumerate(data):
        fake.launch(KERNEL_S)
        loss = torch.nn.functional.mse_loss(model(x), y)
        if index == 1:
            loss = loss * float("inf")  # inf gradients: the scaler skips optimizer.step()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    pairs = steps_and_device_steps(spans_of(instrumented, fake))
    assert [host["attributes"][sc.STEP_SKIPPED] for host, _ in pairs] == [False, True, False, False]
    assert device_s(pairs[1][1]) >= KERNEL_S  # the skipped step's device work is still timed


def test_lightning_steps_run_on_the_device_timeline(configure, fake, tmp_path: Path) -> None:
    lightning = require("lightning")
    from otel_training.integrations.lightning import OpenTelemetryCallback

    telemetry = configure(stuck_threshold_s=30)

    class Tiny(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            fake.launch(KERNEL_S)
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return launching_optimizer(fake, self.parameters())

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1)),
                                       batch_size=4)
    trainer = lightning.Trainer(max_epochs=2, callbacks=[OpenTelemetryCallback()], logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                default_root_dir=str(tmp_path), accelerator="cpu")
    trainer.fit(Tiny(), data)
    pairs = steps_and_device_steps(spans_of(telemetry, fake))
    assert len(pairs) == 8
    assert all(device_s(device_step) >= KERNEL_S + OPTIMIZER_S for _, device_step in pairs)


def test_transformers_steps_run_on_the_device_timeline(configure, fake, tmp_path: Path) -> None:
    transformers = require("transformers")
    from otel_training.integrations.transformers import OpenTelemetryCallback

    telemetry = configure(stuck_threshold_s=30)

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def forward(self, x, labels=None):
            fake.launch(KERNEL_S)
            out = self.layer(x)
            return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, index):
            return {"x": torch.randn(4), "labels": torch.randn(1)}

    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4,
                                          num_train_epochs=1, report_to=[], save_strategy="no",
                                          logging_steps=100, use_cpu=True, disable_tqdm=True)
    trainer = transformers.Trainer(model=Tiny(), args=args, train_dataset=Data(),
                                   callbacks=[OpenTelemetryCallback()])
    trainer.train()
    pairs = steps_and_device_steps(spans_of(telemetry, fake))
    assert len(pairs) == 4
    assert all(device_s(device_step) >= KERNEL_S for _, device_step in pairs)


def test_ddp_steps_run_on_the_device_timeline(instrumented, fake, tmp_path: Path) -> None:
    # DDP (gloo, one rank): its reducer runs inside backward; the device step still ends after the
    # optimizer step and covers the iteration's device work (on CUDA, DDP joins its comm stream to
    # the current stream before backward returns, so the end marker follows the all-reduce too).
    with one_rank_group(tmp_path):
        train_four_steps(fake, torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1)))
    pairs = steps_and_device_steps(spans_of(instrumented, fake))
    assert len(pairs) == 4
    for host, device_step in pairs:
        assert host["attributes"][sc.STEP_OPTIMIZER_STEPS] == 1
        assert device_s(device_step) >= KERNEL_S + OPTIMIZER_S


@contextlib.contextmanager
def one_rank_group(tmp_path: Path) -> Iterator[None]:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def train_four_steps(fake: FakeDevice, model) -> None:
    """Four DataLoader-driven steps, each launching a kernel and an optimizer step on the fake device."""
    optimizer = launching_optimizer(fake, model.parameters())
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 1)),
                                       batch_size=2)
    for x, y in data:
        fake.launch(KERNEL_S)
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()


@pytest.mark.parametrize("driven_by", ["dataloader", "forward"])
def test_compiled_model_steps_run_on_the_device_timeline(instrumented, fake, driven_by: str) -> None:
    # torch.compile (the eager backend: dynamo's tracing, without a C++ toolchain): the step hooks
    # run outside the compiled frames (the forward pre-hook is on the compiled module's own call, and
    # disarmed once a step is open), so compiling neither breaks nor changes the device steps.
    model = torch.compile(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)),
                          backend="eager")
    optimizer = launching_optimizer(fake, model.parameters())
    batches = [(torch.randn(2, 4), torch.randn(2, 1)) for _ in range(4)]
    if driven_by == "dataloader":
        batches = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 1)),
                                              batch_size=2)
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)  # (a forward-driven step begins here)
        fake.launch(KERNEL_S)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    pairs = steps_and_device_steps(spans_of(instrumented, fake))
    assert len(pairs) == 4
    for _, device_step in pairs:
        assert device_s(device_step) >= KERNEL_S + OPTIMIZER_S


def test_fsdp_steps_run_on_the_device_timeline(instrumented, fake, tmp_path: Path) -> None:
    # FSDP2 (fully_shard on a one-rank gloo mesh): its all-gathers and reduce-scatters run from its own
    # forward and backward hooks; the step's boundaries and its device step are the same as without it.
    from torch.distributed.device_mesh import init_device_mesh

    fully_shard = getattr(pytest.importorskip("torch.distributed.fsdp"), "fully_shard", None)
    if fully_shard is None:
        pytest.skip(f"torch {torch.__version__} has no torch.distributed.fsdp.fully_shard (FSDP2, torch >= 2.6)")
    with one_rank_group(tmp_path):
        mesh = init_device_mesh("cpu", (1,))
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        train_four_steps(fake, model)
    pairs = steps_and_device_steps(spans_of(instrumented, fake))
    assert len(pairs) == 4
    for host, device_step in pairs:
        assert host["attributes"][sc.STEP_OPTIMIZER_STEPS] == 1
        assert device_s(device_step) >= KERNEL_S + OPTIMIZER_S


def test_keras_steps_run_on_the_device_timeline(configure, fake) -> None:
    keras = require("keras")
    from otel_training.integrations.keras import OpenTelemetryCallback

    telemetry = configure(stuck_threshold_s=30)

    class Launching(keras.layers.Layer):
        """The step's device work, launched from the forward pass."""

        def call(self, x):
            fake.launch(KERNEL_S)
            return x

    model = keras.Sequential([keras.Input(shape=(4,)), Launching(), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = torch.randn(16, 4).numpy(), torch.randn(16, 1).numpy()
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[OpenTelemetryCallback()])
    pairs = steps_and_device_steps(spans_of(telemetry, fake))
    assert len(pairs) == 8
    assert all(device_s(device_step) >= KERNEL_S for _, device_step in pairs)
