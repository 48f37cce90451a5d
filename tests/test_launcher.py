"""``otel-training run`` and ``opentelemetry-instrument`` on real subprocesses, torchrun with 2 gloo workers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest
from environ import child_environ
from otlp_json import read_spans
from requirements import require

from otel_training import semconv as sc
from otel_training.integrations.auto import DESCENDANT, LAUNCHER, OWNER, decide, is_launcher

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
OTEL_TRAINING = str(BIN / "otel-training")

TRAIN = textwrap.dedent(
    """
    import sys
    import torch
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(20, 4), torch.randn(20, 1)), batch_size=4)
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    """
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(args: list[str], timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=kwargs.pop("cwd", REPO), **kwargs)


def _run_in_own_session(args: list[str], tmp_path: Path, timeout: float) -> tuple[int | None, str]:
    """Run ``args`` in a new session, output to files, and kill the whole session afterwards.

    A failing ``torch.multiprocessing.spawn`` job can orphan its DataLoader
    workers (a worker that starts after its rank died waits forever); they keep
    pipes open, so ``subprocess.run`` would wait for them. Returns (exit status
    or None on timeout, stderr).
    """
    stdout_path, stderr_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(stdout_path, "w") as stdout, open(stderr_path, "w") as stderr:
        process = subprocess.Popen(args, stdout=stdout, stderr=stderr, cwd=tmp_path, start_new_session=True)
    try:
        returncode: int | None = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        returncode = None
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # our session only: leftovers of this job
        except ProcessLookupError:
            pass
        process.wait()
    return returncode, stderr_path.read_text()


def test_launcher_detection():
    assert is_launcher(["python", "/venv/bin/torchrun", "--nproc-per-node", "2", "train.py"])
    assert is_launcher(["python", "-u", "-m", "torch.distributed.run", "train.py"])
    assert not is_launcher(["python", "-u", "train.py"])
    assert not is_launcher(["python", "-c", "import torchrun"])
    assert not is_launcher(["python", "-m", "mypackage.train"])
    assert decide({}, ["python", "train.py"], 10) == OWNER
    assert decide({"OTEL_TRAINING__AUTO_OWNER": "10"}, ["python", "train.py"], 10) == OWNER
    assert decide({"OTEL_TRAINING__AUTO_OWNER": "9"}, ["python", "train.py"], 10) == DESCENDANT
    assert decide({"OTEL_TRAINING__AUTO_OWNER": "9"}, ["python", "/venv/bin/torchrun", "t.py"], 10) == LAUNCHER


def test_run_instruments_an_unmodified_script_and_forwards_the_exit_code(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    out = tmp_path / "traces"
    result = _run([OTEL_TRAINING, "run", "--output-dir", str(out), "--", sys.executable, str(script), "7"])
    assert result.returncode == 7, result.stderr
    steps = [s for s in read_spans(out / "traces-r0.jsonl") if s["name"] == sc.SPAN_STEP]
    assert [s["attributes"][sc.STEP] for s in steps] == [0, 1, 2, 3, 4]
    assert all(s["attributes"][sc.STEP_DATA_WAIT_S] > 0 for s in steps)


def test_a_zero_code_run_is_one_trace_rooted_at_training_train_with_epochs_evaluations_and_checkpoints(
        tmp_path: Path):
    """Issue 30 item 2: an unmodified script under ``otel-training run`` gave a trace per step. Now the run is one
    trace, as the README says and the manual API gives: ``training.train`` > ``training.epoch`` (one per
    DataLoader pass) > ``training.step``, with each epoch's evaluation and checkpoint save under its epoch."""
    out = tmp_path / "traces"
    (tmp_path / "checkpoints").mkdir()
    result = _run([OTEL_TRAINING, "run", "--output-dir", str(out), "--", sys.executable,
                   str(REPO / "examples" / "torch_loop.py"), "--epochs", "2", "--batches", "8",
                   "--checkpoint-dir", str(tmp_path / "checkpoints")])
    assert result.returncode == 0, result.stderr
    spans = read_spans(out / "traces-r0.jsonl")
    (train,) = [s for s in spans if s["name"] == sc.SPAN_TRAIN]
    assert train["parent_id"] is None or train["parent_id"] == ""
    assert {s["trace_id"] for s in spans} == {train["trace_id"]}, Counter(s["name"] for s in spans)
    by_id = {s["span_id"]: s for s in spans}
    epochs = sorted((s for s in spans if s["name"] == sc.SPAN_EPOCH), key=lambda s: s["attributes"][sc.EPOCH])
    assert [e["attributes"][sc.EPOCH] for e in epochs] == [0, 1]
    assert all(e["parent_id"] == train["span_id"] for e in epochs)
    steps = sorted((s for s in spans if s["name"] == sc.SPAN_STEP), key=lambda s: s["attributes"][sc.STEP])
    assert [by_id[s["parent_id"]]["attributes"][sc.EPOCH] for s in steps] == [0] * 4 + [1] * 4
    evaluations = sorted((s for s in spans if s["name"] == sc.SPAN_EVALUATE), key=lambda s: s["start"])
    saves = sorted((s for s in spans if s["name"] == sc.SPAN_SAVE_CHECKPOINT), key=lambda s: s["start"])
    # each epoch's evaluation and save under it, after its steps: the evaluation ends where the save begins
    assert [e["parent_id"] for e in evaluations] == [s["parent_id"] for s in saves] == [e["span_id"] for e in epochs]
    assert all(e["start"] >= last["end"] and e["end"] <= save["start"]
               for e, last, save in zip(evaluations, (steps[3], steps[7]), saves))
    assert train["start"] <= steps[0]["start"] and train["end"] >= saves[-1]["end"]


def test_run_passes_options_and_does_not_import_torch_eagerly(tmp_path: Path):
    probe = "import sys, otel_training; t = otel_training.get_telemetry(); " \
            "print('torch' in sys.modules, t.options['service_name'], t.options['stuck_threshold_s'])"
    result = _run([OTEL_TRAINING, "run", "--output-dir", str(tmp_path), "--service-name", "probe",
                   "-o", "stuck_threshold_s=600", "--", sys.executable, "-c", probe])
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "probe", "600.0"]


def test_run_rejects_a_bad_option_before_starting_the_program(tmp_path: Path):
    marker = tmp_path / "ran"
    result = _run([OTEL_TRAINING, "run", "-o", "stuck_treshold_s=1", "--", sys.executable, "-c",
                   f"open({str(marker)!r}, 'w')"])
    assert result.returncode == 2
    assert "stuck_threshold_s" in result.stderr  # the did-you-mean hint
    assert not marker.exists()


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "5000"),
        ("OTEL_RESOURCE_ATTRIBUTES", "training.rank=abc"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "bogus"),
        ("OTEL_TRAINING_OUTPUT_DIR", "{blocker}/traces"),
    ],
)
def test_run_refuses_what_would_leave_the_program_uninstrumented(tmp_path: Path, variable: str, value: str):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    value = value.format(blocker=blocker)
    marker = tmp_path / "ran"
    env = child_environ()
    result = _run([OTEL_TRAINING, "run", "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
                  env={**env, variable: value})
    assert result.returncode == 2, result.stderr
    assert "configuration error" in result.stderr and variable in result.stderr
    assert not marker.exists()


def test_child_processes_of_the_trainer_are_not_instrumented(tmp_path: Path):
    child = "import otel_training, sys; sys.exit(0 if otel_training.get_telemetry() is None else 3)"
    parent = f"import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', {child!r}]))"
    result = _run([OTEL_TRAINING, "run", "--output-dir", str(tmp_path), "--", sys.executable, "-c", parent])
    assert result.returncode == 0, result.stderr


def test_run_execs_so_signals_reach_the_program_unchanged(tmp_path: Path):
    script = "import os, sys, time; print(os.getpid(), flush=True); time.sleep(60)"
    process = subprocess.Popen([OTEL_TRAINING, "run", "--output-dir", str(tmp_path), "--",
                                sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        pid = int(process.stdout.readline())
        assert pid == process.pid  # exec'd: the launcher is the program
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == -signal.SIGTERM
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_torchrun_workers_each_trace_with_their_own_rank(tmp_path: Path):
    out = tmp_path / "traces"
    result = _run([OTEL_TRAINING, "run", "--output-dir", str(out), "--",
                   str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", str(_free_port()),
                   "examples/ddp_gloo.py", "--batches", "3", "--checkpoint-dir", str(tmp_path)], timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    # One file per worker, none for the torchrun agent.
    assert sorted(p.name for p in out.glob("traces-*.jsonl")) == ["traces-r0.jsonl", "traces-r1.jsonl"]
    for rank in (0, 1):
        spans = read_spans(out / f"traces-r{rank}.jsonl")
        assert {s["resource"][sc.TRAINING_RANK] for s in spans} == {rank}
        assert {s["resource"][sc.TRAINING_WORLD_SIZE] for s in spans} == {2}
        counts = Counter(s["name"] for s in spans)
        assert counts[sc.SPAN_STEP] == 3
        assert counts[sc.SPAN_DISTRIBUTED_BARRIER] == 2 and counts[sc.SPAN_DISTRIBUTED_DESTROY] == 1
        (init,) = [s for s in spans if s["name"] == sc.SPAN_DISTRIBUTED_INIT]
        assert init["attributes"][sc.DISTRIBUTED_BACKEND] == "gloo"
        assert init["attributes"][sc.DISTRIBUTED_RANK] == rank
        assert init["attributes"][sc.DISTRIBUTED_WORLD_SIZE] == 2
        assert counts[sc.SPAN_SAVE_CHECKPOINT] == (1 if rank == 0 else 0)


SPAWN_DDP = textwrap.dedent(
    """
    import os, sys
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import otel_training

    class Probe(torch.utils.data.Dataset):
        # Each item says which process produced it and whether that process has a pipeline.
        def __len__(self):
            return 3

        def __getitem__(self, index):
            return torch.randn(4), float(otel_training.get_telemetry() is not None), os.getpid()

    def worker(rank, steps, spawned_loader):
        # Instrumentation is lazy in a spawned process: nothing until it trains.
        assert otel_training.get_telemetry() is None, "configured before training"
        dist.init_process_group("gloo", rank=rank, world_size=2)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        extra = dict(num_workers=1, multiprocessing_context="spawn") if rank == spawned_loader else {}
        loader = torch.utils.data.DataLoader(Probe(), batch_size=1, **extra)
        for x, configured, pid in loader:
            assert pid.item() == os.getpid() or not configured.item(), f"DataLoader worker {pid.item()} configured"
            optimizer.zero_grad()
            model(x).pow(2).mean().backward()
            optimizer.step()
        dist.barrier()
        dist.destroy_process_group()

    if __name__ == "__main__":
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = sys.argv[1]
        mp.spawn(worker, args=(3, int(sys.argv[2])), nprocs=2)
    """
)


def test_ranks_started_with_multiprocessing_spawn_each_trace_with_their_own_rank(tmp_path: Path):
    script = tmp_path / "spawn_ddp.py"
    script.write_text(SPAWN_DDP)
    out = tmp_path / "traces"
    spawned_loader = 1  # this rank's DataLoader worker is a spawned process: it stays uninstrumented
    returncode, stderr = _run_in_own_session(
        [OTEL_TRAINING, "run", "--output-dir", str(out), "--", sys.executable, str(script),
         str(_free_port()), str(spawned_loader)], tmp_path, timeout=180)
    assert returncode == 0, stderr[-3000:]
    assert sorted(p.name for p in out.glob("traces-*.jsonl")) == ["traces-r0.jsonl", "traces-r1.jsonl"]
    pids, jobs = set(), set()
    for rank in (0, 1):
        spans = read_spans(out / f"traces-r{rank}.jsonl")
        assert {s["resource"][sc.TRAINING_RANK] for s in spans} == {rank}
        assert {s["resource"][sc.TRAINING_WORLD_SIZE] for s in spans} == {2}
        pids |= {s["resource"][sc.PROCESS_PID] for s in spans}
        jobs |= {s["resource"][sc.TRAINING_JOB_ID] for s in spans}
        counts = Counter(s["name"] for s in spans)
        assert counts[sc.SPAN_STEP] == 3, counts
        assert counts[sc.SPAN_DISTRIBUTED_INIT] == 1 and counts[sc.SPAN_DISTRIBUTED_DESTROY] == 1
        (init,) = [s for s in spans if s["name"] == sc.SPAN_DISTRIBUTED_INIT]
        assert init["attributes"][sc.DISTRIBUTED_RANK] == rank
    assert len(pids) == 2  # one process per rank: neither the parent nor a DataLoader worker
    assert len(jobs) == 1  # the ranks of one job share its id


def test_run_configures_a_script_without_the_torch_extra(tmp_path: Path):
    # opentelemetry-instrumentation comes with the [torch] extra only: shadow it
    # with a package that fails to import, as a missing one does.
    blocker = tmp_path / "blocker" / "opentelemetry" / "instrumentation"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'opentelemetry.instrumentation'\", "
        "name='opentelemetry.instrumentation')\n"
    )
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent(
        """
        import sys
        import otel_training
        from otel_training.events.predefined import TrainerProcess
        try:
            import opentelemetry.instrumentation  # noqa: F401
        except ImportError:
            pass
        else:
            sys.exit(3)  # the blocker did not work
        if otel_training.get_telemetry() is None:
            sys.exit(4)  # the launcher did not configure this process
        with TrainerProcess().init():
            pass
        """
    ))
    out = tmp_path / "traces"
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "blocker"))
    result = _run([OTEL_TRAINING, "run", "--output-dir", str(out), "--", sys.executable, str(script)], env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "unavailable" not in result.stderr and "failed" not in result.stderr, result.stderr
    assert [s["name"] for s in read_spans(out / "traces-r0.jsonl")] == [sc.SPAN_INIT]


def test_lightning_example_writes_nothing_into_the_current_directory(tmp_path: Path):
    require("lightning")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    out = tmp_path / "traces"
    result = _run([sys.executable, str(REPO / "examples" / "lightning_fit.py"), "--output-dir", str(out),
                   "--epochs", "1"], cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    assert list(cwd.iterdir()) == []  # Lightning's checkpoints went elsewhere
    assert Counter(s["name"] for s in read_spans(out / "traces-r0.jsonl"))[sc.SPAN_STEP] > 0


def test_opentelemetry_instrument_finds_the_entry_points(tmp_path: Path):
    # A throwaway distribution that only declares the entry points pyproject will declare.
    dist_info = tmp_path / "site" / "otel_training_entry_points-0.0.0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: otel-training-entry-points\nVersion: 0.0.0\n")
    (dist_info / "entry_points.txt").write_text(textwrap.dedent(
        """
        [opentelemetry_distro]
        otel_training = otel_training.integrations.auto:OtelTrainingDistro

        [opentelemetry_configurator]
        otel_training = otel_training.integrations.auto:OtelTrainingConfigurator

        [opentelemetry_instrumentor]
        torch = otel_training.integrations.torch:TorchInstrumentor
        """
    ))
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    out = tmp_path / "traces"
    env = dict(os.environ, PYTHONPATH=str(dist_info.parent), OTEL_TRAINING_OUTPUT_DIR=str(out),
               PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    started = time.monotonic()
    result = _run([str(BIN / "opentelemetry-instrument"), "python", str(script)], env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert time.monotonic() - started < 100
    counts = Counter(s["name"] for s in read_spans(out / "traces-r0.jsonl"))
    assert counts[sc.SPAN_STEP] == 5
    # Offloaded by default, as under otel-training run: the drain process wrote its own metrics file.
    assert (out / "metrics-r0.drain.jsonl").exists()


def test_the_distro_loads_the_instrumentor_dormant_in_descendants_and_not_in_launchers(monkeypatch):
    from otel_training.integrations import auto
    from otel_training.integrations.auto.distro import OtelTrainingDistro

    calls: list[dict] = []

    class Instrumentor:
        def instrument(self, **kwargs):
            calls.append(kwargs)

    class EntryPoint:
        name = auto.INSTRUMENTOR_NAME

        def load(self):
            return Instrumentor

    expected = {auto.OWNER: [{}], auto.DESCENDANT: [{"claim": auto.claim_training_process}], auto.LAUNCHER: []}
    for role, calls_expected in expected.items():
        calls.clear()
        monkeypatch.setattr(auto, "_decision", (os.getpid(), role))
        OtelTrainingDistro().load_instrumentor(EntryPoint())
        assert calls == calls_expected, role


def test_the_watchdog_is_on_by_default_under_the_launcher() -> None:
    from otel_training.cli.main import build_parser
    from otel_training.cli.run import build_environment

    parser = build_parser()
    default = build_environment(parser.parse_args(["run", "--", "python", "x.py"]), {})
    assert default["OTEL_TRAINING_WATCHDOG"] == "true"
    off = build_environment(parser.parse_args(["run", "-o", "watchdog=false", "--", "python", "x.py"]), {})
    assert off["OTEL_TRAINING_WATCHDOG"] == "false"
    kept = build_environment(parser.parse_args(["run", "--", "python", "x.py"]), {"OTEL_TRAINING_WATCHDOG": "0"})
    assert kept["OTEL_TRAINING_WATCHDOG"] == "0"
