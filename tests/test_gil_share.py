"""bench/gil_share.py's reading of a py-spy GIL profile: what counts as our cost, per thread and step."""

from __future__ import annotations

from pathlib import Path

import pytest
from gil_share import _CALLS_THROUGH, summarise


def test_our_gil_time_per_step_excludes_user_code_calls_through_and_start_up(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = tmp_path / "gil.txt"
    raw.write_text("\n".join([
        # the training thread in its own code: not ours
        "thread (1): MainThread;main (loop.py:10);forward (module.py:5) 500",
        # in our fetch wrapper, but inside the DataLoader it calls: not ours
        "thread (1): MainThread;main (loop.py:9);wrapper (otel_training/integrations/torch/instrumentor.py:163);"
        "__next__ (dataloader.py:700) 300",
        # our step bookkeeping after the fetch: ours
        "thread (1): MainThread;main (loop.py:9);wrapper (otel_training/integrations/torch/instrumentor.py:167);"
        "start_span (opentelemetry/sdk/trace/__init__.py:1138) 40",
        # configuration at start-up: paid once, not per step
        "thread (1): MainThread;<module> (sitecustomize.py:3);auto_instrument (otel_training/integrations/auto/__init__.py:187);"
        "_find_and_load (<frozen importlib._bootstrap>:1176) 900",
        # the device resolver: ours
        "thread (2): otel-training-device;_bootstrap (threading.py:1002);_run (otel_training/events/device.py:169) 20",
        "",
    ]))
    summarise(raw, steps=10, rate_hz=1000)
    out = capsys.readouterr().out
    ours = out.split("by thread (start-up excluded):")[1].split("where")[0]
    assert "MainThread" in ours and "4000.0 µs/step" in ours  # 40 samples / 1000 Hz / 10 steps
    assert "otel-training-device" in ours and "2000.0 µs/step" in ours
    assert "6000.0 µs/step" in ours  # the total: 60 samples, nothing else
    every = out.split("GIL held, by thread (all code):")[1].split("GIL held by")[0]
    assert "174000.0 µs/step" in every  # the training thread's 1,740 samples, all code


def test_the_wrappers_calls_into_user_code_are_found_in_the_instrumentor() -> None:
    from otel_training.integrations.torch import instrumentor

    source = Path(instrumentor.__file__).read_text().splitlines()
    lines = [frame for frame in _CALLS_THROUGH if frame.startswith("instrumentor.py:")]
    assert len(lines) >= 2  # the fetch and the backward wrappers, at least
    for frame in lines:
        assert "wrapped(" in source[int(frame.rpartition(":")[2]) - 1]
