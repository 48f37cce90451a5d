"""Shared fixtures: a fresh otel_training pipeline per test, torn down after."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import otel_training
from otel_training.lifecycle import hooks

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never see the developer's OTEL_* / OTEL_TRAINING_* / launcher variables.

    Except ``OTEL_TRAINING_NATIVE``: it picks the implementation under test (CI runs the suite once with the
    C extension and once with ``OTEL_TRAINING_NATIVE=off``, the pure-Python fallback)."""
    for key in list(os.environ):
        if key == "OTEL_TRAINING_NATIVE":
            continue
        if key.startswith(("OTEL_", "TORCHELASTIC_", "SLURM_")) or key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK"):
            monkeypatch.delenv(key, raising=False)


@pytest.fixture
def configure(tmp_path: Path) -> Iterator:
    """``configure(**options)`` writing to a temporary directory; shut down after the test."""
    handles = []

    def make(**options):
        options.setdefault("output_dir", str(tmp_path / "traces"))
        options.setdefault("signal_hooks", False)
        options.setdefault("exception_hooks", False)
        telemetry = otel_training.configure(reconfigure=True, **options)
        handles.append(telemetry)
        return telemetry

    yield make
    for telemetry in handles:
        telemetry.shutdown(timeout_s=2)
    hooks.uninstall()


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """A fake asynchronous device (tests/fake_device.py) that the device timeline uses instead of CUDA."""
    from fake_device import FakeDevice

    from otel_training.events import device_probe as device_module

    device = FakeDevice()
    monkeypatch.setattr(device_module, "_factory", lambda: device)
    yield device
    device.stop()
