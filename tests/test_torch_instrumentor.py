"""TorchInstrumentor on real torch (CPU): steps, substeps, data waits, checkpoints, uninstrument."""

from __future__ import annotations

import datetime
import io
import socket
import time
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from requirements import require

torch = require("torch")

import torch.optim.optimizer as optimizer_module  # noqa: E402
import torch.utils.data.dataloader as dataloader_module  # noqa: E402
from otlp_json import read_spans  # noqa: E402

import otel_training  # noqa: E402
from otel_training import semconv as sc  # noqa: E402
from otel_training.integrations.torch import TorchInstrumentor  # noqa: E402
from otel_training.integrations.torch.instrumentor import _grad_scaler_module  # noqa: E402


@pytest.fixture
def instrumented(configure):
    telemetry = configure()
    instrumentor = TorchInstrumentor()
    instrumentor.instrument()
    yield telemetry
    instrumentor.uninstrument()


def spans_of(telemetry) -> list[dict]:
    assert telemetry.force_flush(5).completed
    return read_spans(telemetry.trace_path)


def named(spans: list[dict], name: str) -> list[dict]:
    return sorted((s for s in spans if s["name"] == name), key=lambda s: s["start"])


class SlowData(torch.utils.data.Dataset):
    """A dataset whose items take ``delay_s`` to produce: fetches that block."""

    def __init__(self, size: int, delay_s: float) -> None:
        self.x, self.y, self.delay_s = torch.randn(size, 8), torch.randn(size, 1), delay_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        time.sleep(self.delay_s)
        return self.x[index], self.y[index]


def make_loader(batches: int, batch_size: int = 4, delay_s: float = 0.0) -> torch.utils.data.DataLoader:
    if delay_s:
        return torch.utils.data.DataLoader(SlowData(batches * batch_size, delay_s), batch_size=batch_size)
    data = torch.utils.data.TensorDataset(torch.randn(batches * batch_size, 8), torch.randn(batches * batch_size, 1))
    return torch.utils.data.DataLoader(data, batch_size=batch_size)


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def test_one_numbered_step_span_per_iteration_covering_the_data_wait(instrumented):
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters())
    for _epoch in range(2):
        for x, y in make_loader(5, delay_s=0.001):  # 4 ms per batch: a blocking wait
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()

    spans = spans_of(instrumented)
    steps = named(spans, sc.SPAN_STEP)
    assert [s["attributes"][sc.STEP] for s in steps] == list(range(10))
    assert all(s["attributes"][sc.STEP_SUBSTEPS] == 1 for s in steps)
    assert all(s["attributes"][sc.STEP_SKIPPED] is False for s in steps)
    assert all(s["attributes"][sc.INSTRUMENTATION_SOURCE] == "torch" for s in steps)
    waits = named(spans, sc.SPAN_DATA_WAIT)
    assert len(waits) == 10  # the fetch that only raises StopIteration is no wait
    step_ids = {s["span_id"]: s for s in steps}
    for wait in waits:
        step = step_ids[wait["parent_id"]]
        assert step["start"] <= wait["start"] and wait["end"] <= step["end"]
        assert step["attributes"][sc.STEP_DATA_WAIT_S] >= (wait["end"] - wait["start"]) / 1e9 >= 0.004
    # Steps do not overlap: each ends before the next begins.
    for before, after in zip(steps, steps[1:]):
        assert before["end"] <= after["start"]


def test_an_evaluation_loop_between_epochs_is_an_evaluate_span_and_a_sanity_check_before_training_is_not(
        instrumented):
    """Batches fetched without gradients after a step are an evaluation: one ``training.evaluate`` span from the
    first such fetch until the next step opens (host work: no hang between steps, and goodput's evaluation)."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with torch.no_grad():  # a sanity check before training: no step before it, so no evaluation span
        for x, _ in make_loader(2):
            model(x)
    for _epoch in range(2):
        model.train()
        for x, y in make_loader(3):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, _ in make_loader(4, delay_s=0.001):
                model(x)
    assert instrumented.shutdown(timeout_s=10).completed  # the last evaluation ends with the pipeline
    spans = read_spans(instrumented.trace_path)
    steps, evaluations = named(spans, sc.SPAN_STEP), named(spans, sc.SPAN_EVALUATE)
    assert len(steps) == 6 and len(evaluations) == 2, [s["name"] for s in spans]
    assert all(e["attributes"][sc.INSTRUMENTATION_SOURCE] == "torch" for e in evaluations)
    # the first after epoch 0's last step, ended when epoch 1's first step opened; the second ends at shutdown
    assert steps[2]["end"] <= evaluations[0]["start"] and evaluations[0]["end"] <= steps[3]["start"]
    assert steps[5]["end"] <= evaluations[1]["start"]


def test_gradient_accumulation_gives_substeps(instrumented):
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    accumulation = 3
    for index, (x, y) in enumerate(make_loader(12, delay_s=0.0005)):
        (torch.nn.functional.mse_loss(model(x), y) / accumulation).backward()
        if (index + 1) % accumulation == 0:
            optimizer.step()
            optimizer.zero_grad()

    spans = spans_of(instrumented)
    steps = named(spans, sc.SPAN_STEP)
    assert len(steps) == 4
    assert [s["attributes"][sc.STEP_SUBSTEPS] for s in steps] == [3, 3, 3, 3]
    for step in steps:
        substeps = [s for s in named(spans, sc.SPAN_SUBSTEP) if s["parent_id"] == step["span_id"]]
        assert [s["attributes"][sc.SUBSTEP] for s in substeps] == [0, 1, 2]
        assert all(step["start"] <= s["start"] <= s["end"] <= step["end"] for s in substeps)
        assert sum(1 for w in named(spans, sc.SPAN_DATA_WAIT) if w["parent_id"] == step["span_id"]) == 3


def test_several_optimizers_in_one_iteration_make_one_step(instrumented):
    model = make_model()
    first = torch.optim.SGD(model[0].parameters(), lr=0.01)
    second = torch.optim.Adam(model[2].parameters())
    for x, y in make_loader(6):
        torch.nn.functional.mse_loss(model(x), y).backward()
        first.step()
        second.step()
        first.zero_grad()
        second.zero_grad()

    steps = named(spans_of(instrumented), sc.SPAN_STEP)
    assert len(steps) == 6
    assert all(s["attributes"][sc.STEP_OPTIMIZER_STEPS] == 2 for s in steps)


def test_gan_style_loop_with_backward_between_optimizers_is_one_step_per_batch(instrumented):
    generator, critic = make_model(), make_model()
    opt_g, opt_c = torch.optim.SGD(generator.parameters(), lr=0.01), torch.optim.SGD(critic.parameters(), lr=0.01)
    for x, _y in make_loader(5):
        critic(x).mean().backward()
        opt_c.step()
        opt_c.zero_grad()
        generator(x).mean().backward()
        opt_g.step()
        opt_g.zero_grad()

    steps = named(spans_of(instrumented), sc.SPAN_STEP)
    assert len(steps) == 5
    assert all(s["attributes"][sc.STEP_SUBSTEPS] == 2 and s["attributes"][sc.STEP_OPTIMIZER_STEPS] == 2
               for s in steps)


@pytest.mark.skipif(not hasattr(torch.amp, "GradScaler"),
                    reason=f"torch {torch.__version__} has no CPU GradScaler (torch.amp.GradScaler came in 2.3)")
def test_grad_scaler_skip_is_marked_and_ends_at_the_iteration_boundary(instrumented):
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    for index, (x, y) in enumerate(make_loader(4)):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        if index == 2:
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    steps = named(spans_of(instrumented), sc.SPAN_STEP)
    assert [s["attributes"][sc.STEP_SKIPPED] for s in steps] == [False, False, True, False]
    assert [s["attributes"][sc.STEP_OPTIMIZER_STEPS] for s in steps] == [1, 1, 0, 1]


def test_loop_without_dataloader_opens_steps_at_the_forward_pass(instrumented):
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    for _ in range(7):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():  # evaluation: no steps
        for _ in range(3):
            model(x)

    steps = named(spans_of(instrumented), sc.SPAN_STEP)
    assert len(steps) == 7
    assert [s["attributes"][sc.STEP] for s in steps] == list(range(7))


def test_fast_fetches_add_to_the_step_without_spans_of_their_own(instrumented):
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in make_loader(4):  # in-memory tensors: microseconds per fetch
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    spans = spans_of(instrumented)
    steps = named(spans, sc.SPAN_STEP)
    assert len(steps) == 4
    waits = [s["attributes"][sc.STEP_DATA_WAIT_S] for s in steps]
    assert all(wait > 0 for wait in waits)  # every fetch adds to its step
    # A span only for a fetch that blocked 1 ms or more: on a loaded machine a GC pause or a
    # preemption can make one of these in-memory fetches that slow, and then it gets its span.
    slow = [wait for wait in waits if wait >= 0.001]
    assert len(named(spans, sc.SPAN_DATA_WAIT)) == len(slow)
    assert len(slow) < len(waits)  # the fast ones (nearly always all of them) have none


def test_evaluation_under_no_grad_creates_no_step(instrumented):
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in make_loader(3):
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    with torch.no_grad():
        for x, _ in make_loader(4, delay_s=0.001):
            model(x)

    spans = spans_of(instrumented)
    assert len(named(spans, sc.SPAN_STEP)) == 3
    steps = {s["span_id"] for s in named(spans, sc.SPAN_STEP)}
    evaluation_waits = [w for w in named(spans, sc.SPAN_DATA_WAIT) if w["parent_id"] not in steps]
    assert len(evaluation_waits) == 4
    # under the evaluation span, still open (it ends when the next step opens or the pipeline closes)
    assert len({w["parent_id"] for w in evaluation_waits}) == 1 and evaluation_waits[0]["parent_id"]


def test_steps_nest_under_the_users_epoch_span(instrumented):
    from otel_training import TrainerProcess

    trainer = TrainerProcess()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with trainer.epoch(epoch=0) as epoch:
        for x, y in make_loader(3):
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        trainer.log(loss=1.0)
    epoch_id = format(epoch.span.get_span_context().span_id, "016x")

    spans = spans_of(instrumented)
    steps = named(spans, sc.SPAN_STEP)
    assert len(steps) == 3 and all(s["parent_id"] == epoch_id for s in steps)
    # The user's own event landed on the epoch, not on a step that ended earlier.
    epoch_span = next(s for s in spans if s["span_id"] == epoch_id)
    assert [e["name"] for e in epoch_span["events"]] == ["#log"]


def test_save_and_load_are_checkpoint_spans_with_path_and_bytes(instrumented, tmp_path: Path):
    model = make_model()
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    torch.load(path)

    spans = spans_of(instrumented)
    saves = named(spans, sc.SPAN_SAVE_CHECKPOINT)
    assert len(saves) == 2
    assert saves[0]["attributes"][sc.CHECKPOINT_PATH] == str(path)
    assert saves[0]["attributes"][sc.CHECKPOINT_BYTES] == path.stat().st_size
    assert saves[1]["attributes"][sc.CHECKPOINT_BYTES] == len(buffer.getvalue())
    (load,) = named(spans, sc.SPAN_LOAD_CHECKPOINT)
    assert load["attributes"][sc.CHECKPOINT_PATH] == str(path)
    assert load["attributes"][sc.CHECKPOINT_BYTES] == path.stat().st_size


def test_failed_save_is_an_error_span_and_raises_unchanged(instrumented, tmp_path: Path):
    with pytest.raises(RuntimeError):
        torch.save({"x": 1}, tmp_path / "missing-dir" / "model.pt")
    (save,) = named(spans_of(instrumented), sc.SPAN_SAVE_CHECKPOINT)
    assert save["status"].get("code") == 2  # ERROR


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_distributed_checkpoint_and_process_group_spans(instrumented, tmp_path: Path):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        dist.barrier()
        state = {"model": make_model().state_dict()}
        if hasattr(dcp, "save"):
            dcp.save(state, checkpoint_id=str(tmp_path / "dcp"))
            dcp.load(state, checkpoint_id=str(tmp_path / "dcp"))
        else:  # torch 2.1: the API before save/load
            dcp.save_state_dict(state, storage_writer=dcp.FileSystemWriter(str(tmp_path / "dcp")))
            dcp.load_state_dict(state, storage_reader=dcp.FileSystemReader(str(tmp_path / "dcp")))
    finally:
        dist.destroy_process_group()

    spans = spans_of(instrumented)
    (init,) = named(spans, sc.SPAN_DISTRIBUTED_INIT)
    assert init["attributes"][sc.DISTRIBUTED_BACKEND] == "gloo"
    assert init["attributes"][sc.DISTRIBUTED_WORLD_SIZE] == 1
    assert len(named(spans, sc.SPAN_DISTRIBUTED_BARRIER)) == 1
    assert len(named(spans, sc.SPAN_DISTRIBUTED_DESTROY)) == 1
    (save,) = named(spans, sc.SPAN_SAVE_CHECKPOINT)  # DCP's inner torch.save is part of it
    assert save["attributes"][sc.CHECKPOINT_FORMAT] == "torch.distributed.checkpoint"
    total = sum(f.stat().st_size for f in (tmp_path / "dcp").rglob("*") if f.is_file())
    assert save["attributes"][sc.CHECKPOINT_BYTES] == total > 0
    (load,) = named(spans, sc.SPAN_LOAD_CHECKPOINT)
    assert load["attributes"][sc.CHECKPOINT_PATH] == str(tmp_path / "dcp")


def test_uninstrument_restores_everything(configure):
    import torch.distributed as dist

    telemetry = configure()
    originals = {
        "save": torch.save, "load": torch.load, "backward": torch.autograd.backward,
        "next": dataloader_module._BaseDataLoaderIter.__next__,
        "scaler": _grad_scaler_module().GradScaler.step, "init": dist.init_process_group, "barrier": dist.barrier,
    }
    pre, post = dict(optimizer_module._global_optimizer_pre_hooks), dict(optimizer_module._global_optimizer_post_hooks)
    forward_hooks = dict(torch.nn.modules.module._global_forward_pre_hooks)
    instrumentor = TorchInstrumentor()
    instrumentor.instrument()
    assert torch.save is not originals["save"]
    assert len(optimizer_module._global_optimizer_pre_hooks) == len(pre) + 1
    instrumentor.uninstrument()

    assert torch.save is originals["save"] and torch.load is originals["load"]
    assert torch.autograd.backward is originals["backward"]
    assert dataloader_module._BaseDataLoaderIter.__next__ is originals["next"]
    assert _grad_scaler_module().GradScaler.step is originals["scaler"]
    assert dist.init_process_group is originals["init"] and dist.barrier is originals["barrier"]
    assert dict(optimizer_module._global_optimizer_pre_hooks) == pre
    assert dict(optimizer_module._global_optimizer_post_hooks) == post
    assert dict(torch.nn.modules.module._global_forward_pre_hooks) == forward_hooks
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in make_loader(3):
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    assert telemetry.force_flush(5).completed
    path = telemetry.trace_path
    assert not path.exists() or not Counter(s["name"] for s in read_spans(path))[sc.SPAN_STEP]


def test_uninstrument_after_someone_wrapped_over_us_leaves_theirs_and_ours_only_passes_calls_on(configure, caplog):
    """Another tool wraps the DataLoader fetch after us: uninstrumenting cannot take ours out of their chain
    without dropping theirs, so ours stays there, closed (no step recorded), and the log says so once."""
    import wrapt

    telemetry = configure()
    original = dataloader_module._BaseDataLoaderIter.__next__
    theirs: list[int] = []

    def their_wrapper(wrapped, instance, args, kwargs):
        theirs.append(1)
        return wrapped(*args, **kwargs)

    instrumentor = TorchInstrumentor()
    instrumentor.instrument()
    ours = vars(dataloader_module._BaseDataLoaderIter)["__next__"]
    wrapt.wrap_function_wrapper(dataloader_module, "_BaseDataLoaderIter.__next__", their_wrapper)
    try:
        with caplog.at_level("WARNING", logger="otel_training"):
            instrumentor.uninstrument()
        assert vars(dataloader_module._BaseDataLoaderIter)["__next__"].__wrapped__ is ours  # theirs kept
        assert "wrapped again" in caplog.text
        model = make_model()
        train(model, torch.optim.SGD(model.parameters(), lr=0.01), 3)
        assert len(theirs) == 4  # three batches and the end of the epoch, through theirs and ours
        assert telemetry.force_flush(5).completed
        path = telemetry.trace_path
        assert not path.exists() or not Counter(s["name"] for s in read_spans(path))[sc.SPAN_STEP]
    finally:
        dataloader_module._BaseDataLoaderIter.__next__ = original


def test_instrumentation_errors_never_reach_the_training_loop(instrumented, monkeypatch):
    from otel_training.integrations.torch import steps

    def broken(*args, **kwargs):
        raise RuntimeError("instrumentation bug")

    monkeypatch.setattr(steps.StepTracker, "_open", broken)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in make_loader(3):
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    assert model[0].weight.grad is not None


# -- dormant instrumentation: a process started by an instrumented one (auto-instrumentation)


@pytest.fixture
def unconfigured(monkeypatch):
    """This process as a freshly spawned one: nothing configured yet."""
    from otel_training.assembly import configure as telemetry_module

    monkeypatch.setattr(telemetry_module, "_current", None)


def train(model, optimizer, batches: int) -> None:
    for x, y in make_loader(batches):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def test_dormant_instrumentation_records_and_configures_nothing_until_the_process_trains(
        configure, unconfigured, tmp_path: Path):
    import torch.distributed as dist

    from otel_training.assembly.configure import get_telemetry

    claims = []

    def claim(rank, world_size):
        claims.append((rank, world_size))
        configure(rank=rank, world_size=world_size)
        return True

    instrumentor = TorchInstrumentor()
    instrumentor.instrument(claim=claim)
    try:
        model = make_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        # What a DataLoader worker or a helper process does: blocking fetches,
        # forward passes in training mode, a save. No backward, no optimizer.
        for x, _y in make_loader(2, delay_s=0.001):
            model(x)
        torch.save(model.state_dict(), tmp_path / "before.pt")
        assert claims == [] and get_telemetry() is None
        started = time.time_ns()
        # Positional arguments, as a spawned rank may pass its rank.
        dist.init_process_group("gloo", f"tcp://127.0.0.1:{_free_port()}", datetime.timedelta(seconds=60), 1, 0)
        try:
            assert claims == [(0, 1)]
            train(model, optimizer, 3)
            torch.save(model.state_dict(), tmp_path / "after.pt")
        finally:
            dist.destroy_process_group()
        telemetry = get_telemetry()
    finally:
        instrumentor.uninstrument()

    assert claims == [(0, 1)]
    spans = spans_of(telemetry)
    assert min(s["start"] for s in spans) >= started  # nothing from before the claim
    assert [s["attributes"][sc.STEP] for s in named(spans, sc.SPAN_STEP)] == [0, 1, 2]
    (init,) = named(spans, sc.SPAN_DISTRIBUTED_INIT)
    assert init["attributes"][sc.DISTRIBUTED_RANK] == 0
    (save,) = named(spans, sc.SPAN_SAVE_CHECKPOINT)
    assert save["attributes"][sc.CHECKPOINT_PATH] == str(tmp_path / "after.pt")


@pytest.mark.parametrize("outcome", ["refused", "raises"])
def test_a_refused_or_failing_claim_leaves_the_process_uninstrumented_and_training(
        unconfigured, outcome, tmp_path: Path):
    from otel_training.assembly.configure import get_telemetry

    claims = []

    def claim(rank, world_size):
        claims.append((rank, world_size))
        if outcome == "raises":
            raise RuntimeError("configure failed")
        return False

    instrumentor = TorchInstrumentor()
    instrumentor.instrument(claim=claim)
    try:
        model = make_model()
        before = model[0].weight.detach().clone()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        train(model, optimizer, 3)  # the first backward claims: no process group, rank unknown
        torch.save(model.state_dict(), tmp_path / "model.pt")
    finally:
        instrumentor.uninstrument()
    assert claims == [(None, None)]  # once
    assert get_telemetry() is None  # nothing configured a pipeline behind its back
    assert not torch.equal(before, model[0].weight)


def test_a_dormant_process_its_own_code_configures_is_traced_without_a_claim(configure, unconfigured):
    claims = []
    instrumentor = TorchInstrumentor()
    instrumentor.instrument(claim=lambda rank, world_size: claims.append((rank, world_size)) or True)
    try:
        telemetry = configure()  # the user's own configure() in the spawned function
        model = make_model()
        train(model, torch.optim.SGD(model.parameters(), lr=0.01), 3)
    finally:
        instrumentor.uninstrument()
    assert claims == []
    assert len(named(spans_of(telemetry), sc.SPAN_STEP)) == 3


def test_init_process_group_rank_from_arguments_or_url():
    import torch.distributed as dist

    from otel_training.integrations.torch.distributed import init_rank

    init = dist.init_process_group
    assert init_rank(init, ("gloo",), {"rank": 1, "world_size": 2}) == (1, 2)
    assert init_rank(init, ("gloo", None, None, 4, 3), {}) == (3, 4)
    assert init_rank(init, ("gloo", "tcp://127.0.0.1:1234?rank=5&world_size=8"), {}) == (5, 8)
    assert init_rank(init, ("gloo", "env://"), {}) == (None, None)  # RANK/WORLD_SIZE: configure() reads them


def test_an_optimizer_subclass_calling_super_step_counts_once(instrumented):
    # torch wraps each optimizer class's step() with the hooks once that class has an instance, so
    # a subclass whose step() calls super().step() runs the global hooks twice, nested.
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # SGD.step is now wrapped too

    class Logging(torch.optim.SGD):
        def step(self, *args, **kwargs):
            return super().step(*args, **kwargs)

    model = make_model()
    optimizer = Logging(model.parameters(), lr=0.01)
    for x, y in make_loader(3):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    steps = named(spans_of(instrumented), sc.SPAN_STEP)
    assert [s["attributes"][sc.STEP_OPTIMIZER_STEPS] for s in steps] == [1, 1, 1]


def _train(batches: int, accumulation: int = 1) -> None:
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for index, (x, y) in enumerate(make_loader(batches, delay_s=0.0003)):
        (torch.nn.functional.mse_loss(model(x), y) / accumulation).backward()
        if (index + 1) % accumulation == 0:
            optimizer.step()
            optimizer.zero_grad()


def _train_into_a_provider(batches: int, accumulation: int) -> InMemorySpanExporter:
    """Train instrumented with ``tracer_provider=`` a provider of its own; the in-memory exporter it fed."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = TorchInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        _train(batches, accumulation=accumulation)
    finally:
        instrumentor.uninstrument()
    return exporter


def test_an_injected_tracer_provider_gets_the_spans_the_pipeline_does_not(configure):
    """As contrib's instrumentors: ``instrument(tracer_provider=...)`` sends the spans to that provider."""
    telemetry = configure()
    exporter = _train_into_a_provider(6, accumulation=2)
    mine = exporter.get_finished_spans()
    steps = sorted((s for s in mine if s.name == sc.SPAN_STEP), key=lambda s: s.start_time)
    assert [s.attributes[sc.STEP] for s in steps] == [0, 1, 2]
    assert {s.instrumentation_scope.name for s in mine} == {sc.INSTRUMENTATION_SCOPE}
    # substeps and data waits, recorded after the fact, follow their step into the same provider
    by_id = {s.context.span_id: s for s in steps}
    substeps = [s for s in mine if s.name == sc.SPAN_SUBSTEP]
    waits = [s for s in mine if s.name == sc.SPAN_DATA_WAIT]
    assert len(substeps) == 6 and all(s.parent.span_id in by_id for s in substeps)
    assert len(waits) == 6 and all(s.parent.span_id in by_id for s in waits)
    assert telemetry.force_flush(5).completed
    in_pipeline = read_spans(telemetry.trace_path) if telemetry.trace_path.exists() else []  # written on first span
    assert not [s for s in in_pipeline if s["name"] in (sc.SPAN_STEP, sc.SPAN_SUBSTEP, sc.SPAN_DATA_WAIT)]


def test_suppress_instrumentation_records_nothing(instrumented):
    from opentelemetry.instrumentation.utils import suppress_instrumentation

    with suppress_instrumentation():
        _train(4)
    _train(3)
    steps = named(spans_of(instrumented), sc.SPAN_STEP)
    assert [s["attributes"][sc.STEP] for s in steps] == [0, 1, 2]  # only the loop outside it
    assert not [s for s in named(spans_of(instrumented), sc.SPAN_DATA_WAIT) if s["end"] < steps[0]["start"]]


class _BucketedBatches(torch.utils.data.Sampler):
    """A bucketing batch sampler: how many batches an epoch has changes with the epoch."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths, self.epoch = lengths, 0

    def __len__(self) -> int:
        return self.lengths[self.epoch]

    def __iter__(self):
        return iter([[index] for index in range(len(self))])


def test_a_persistent_loader_whose_epochs_differ_in_length_closes_each_epochs_last_step(instrumented):
    """Persistent workers: one iterator object for every epoch, its length asked again as it starts over.
    A length kept from the longer epoch would take the shorter one's end-of-data fetch for a batch and
    leave a step open over the time between epochs."""
    sampler = _BucketedBatches([5, 3, 4])
    data = torch.utils.data.TensorDataset(torch.randn(8, 8), torch.randn(8, 1))
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler, num_workers=1, persistent_workers=True)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    between_epochs = []
    iterators = set()
    for epoch in range(3):
        sampler.epoch = epoch
        iterator = iter(loader)
        iterators.add(id(iterator))
        for x, y in iterator:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        between_epochs.append(time.time_ns())  # an evaluation would run here: no step is open
    assert len(iterators) == 1  # the case at hand: torch reuses the iterator
    steps = named(spans_of(instrumented), sc.SPAN_STEP)
    assert [s["attributes"][sc.STEP] for s in steps] == list(range(12))
    assert all(s["attributes"][sc.STEP_OPTIMIZER_STEPS] == 1 for s in steps)
    assert not [(s["attributes"][sc.STEP], mark) for s in steps for mark in between_epochs
                if s["start"] < mark < s["end"]]


@pytest.mark.parametrize("offload", [True, False], ids=["offloaded", "in-process"])
def test_an_unmodified_loops_steps_follow_their_epoch_into_each_trace_segment(configure, offload):
    """The tracker begins a step under its loop's epoch span directly (not in the epoch's context): a trace over
    budget still continues in a new segment, and every step is a child of the epoch or the segment it is in."""
    telemetry = configure(trace_max_spans=6, offload=offload)
    from otel_training.integrations.torch import TorchInstrumentor

    instrumentor = TorchInstrumentor()
    instrumentor.instrument()
    try:
        model = make_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for x, y in make_loader(20):
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    finally:
        instrumentor.uninstrument()
    spans = spans_of(telemetry)
    by_id = {span["span_id"]: span for span in spans}
    steps = named(spans, sc.SPAN_STEP)
    assert sorted(s["attributes"][sc.STEP] for s in steps) == list(range(20))
    epochs = named(spans, sc.SPAN_EPOCH)
    segments = [s for s in epochs if sc.TRACE_SEGMENT in s["attributes"]]
    assert len(segments) >= 2  # 20 steps in traces of at most 6 spans
    for step in steps:
        parent = by_id[step["parent_id"]]
        assert parent["name"] == sc.SPAN_EPOCH and parent["trace_id"] == step["trace_id"]
    per_trace = {}
    for span in spans:
        per_trace[span["trace_id"]] = per_trace.get(span["trace_id"], 0) + 1
    assert max(per_trace.values()) <= 7  # the budget, plus the continuation span itself


def test_an_injected_tracer_provider_configures_nothing_global(tmp_path, monkeypatch):
    """As contrib's instrumentors: given a provider, nothing configures the process's pipeline (no global
    provider, no trace files, no drain); the spans still arrive, under the environment's options."""
    assembly = _nothing_configured(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OTEL_TRAINING_OUTPUT_DIR", str(tmp_path / "traces"))
    exporter = _train_into_a_provider(4, accumulation=1)
    assert assembly.get_telemetry() is None
    assert not (tmp_path / "traces").exists()
    steps = [s for s in exporter.get_finished_spans() if s.name == sc.SPAN_STEP]
    assert [s.attributes[sc.STEP] for s in steps] == [0, 1, 2, 3]


def _nothing_configured(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """This process as a user's that injects a provider: no pipeline configured yet, no options-only handle."""
    from otel_training.assembly import configure as assembly

    monkeypatch.setattr(assembly, "_current", None)
    monkeypatch.setattr(assembly, "_options_only", None)
    return assembly


def test_an_injected_provider_reads_the_environments_collective_tracking(monkeypatch):
    """Nothing configured: the collectives' route comes from the environment, as the pipeline would read it."""
    from otel_training.integrations.torch import distributed

    _nothing_configured(monkeypatch)
    monkeypatch.setenv("OTEL_TRAINING_COLLECTIVE_TRACKING", "off")
    asked: list[str] = []
    monkeypatch.setattr(distributed, "route", lambda option: (asked.append(option), ("off", "asked"))[1])

    class Tracker:
        dormant, collectives = False, None

    distributed._track(Tracker())
    assert asked == ["off"] and Tracker.collectives is None


def test_an_injected_provider_still_records_when_a_setting_is_bad(monkeypatch, caplog):
    """A bad SDK variable: the options-only handle cannot be built; the defaults stand in, said once, and the
    injected provider still gets its spans."""
    provider, exporter = TracerProvider(), InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _nothing_configured(monkeypatch)
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "abc")
    trainer = otel_training.TrainerProcess(tracer_provider=provider)
    for index in range(2):
        with trainer.step(global_step=index):
            pass
    assert [span.attributes[sc.STEP] for span in exporter.get_finished_spans() if span.name == sc.SPAN_STEP] == [0, 1]
    assert "an injected tracer provider's events use the defaults" in caplog.text


def test_a_process_on_an_injected_provider_reads_a_later_configures_options(configure, monkeypatch):
    """Begun before ``configure()``, a ``Process`` on an injected provider reads the environment's options; once
    a pipeline is configured it reads that pipeline's (one runtime per provider, not two)."""
    provider = TracerProvider()
    assembly = _nothing_configured(monkeypatch)
    trainer = otel_training.TrainerProcess(tracer_provider=provider)
    trainer.instant("before")
    before = trainer.events_runtime().telemetry
    assert before is assembly._options_only
    telemetry = configure()
    trainer.instant("after")
    assert trainer.events_runtime().telemetry is telemetry and before.is_shut_down
