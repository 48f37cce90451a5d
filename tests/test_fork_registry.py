"""The one fork-safety registry (``otel_training/_fork.py``) that every module with per-process state uses."""

from __future__ import annotations

import gc
import os

import pytest

from otel_training import _fork


class Owner:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def reset(self) -> None:
        self.log.append(self.name)


def _child_resets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the child's handlers on a registry of this test's own (the process's real one stays untouched)."""
    monkeypatch.setattr(_fork, "_resets", {})
    monkeypatch.setattr(_fork, "_before", [])
    monkeypatch.setattr(_fork, "_after_in_parent", [])
    monkeypatch.setattr(_fork, "_after_in_child", [])


def test_resets_run_in_registration_order_and_one_failing_leaves_the_others_done(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    _child_resets(monkeypatch)
    log: list[str] = []
    first, second, third = Owner(log, "first"), Owner(log, "second"), Owner(log, "third")
    _fork.at_fork(after_in_child=lambda: log.append("module"))
    for owner in (first, second, third):
        _fork.reset_in_child(owner, Owner.reset)

    def broken(owner: Owner) -> None:
        raise KeyboardInterrupt  # even an interrupted reset leaves the later ones to run

    _fork.reset_in_child(second, broken)  # registered again: its reset replaced, where it stood
    _fork._after_fork_in_child()
    assert log == ["module", "first", "third"]
    assert "a fork handler failed" in caplog.text


def test_instances_are_held_weakly_and_forgotten_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    _child_resets(monkeypatch)
    log: list[str] = []
    kept, dropped, shut = Owner(log, "kept"), Owner(log, "dropped"), Owner(log, "shut")
    for owner in (kept, dropped, shut):
        _fork.reset_in_child(owner, Owner.reset)
    del dropped
    gc.collect()
    _fork.forget(shut)
    assert len(_fork._resets) == 1
    _fork._after_fork_in_child()
    assert log == ["kept"]


def test_before_handlers_run_in_reverse_and_after_ones_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    _child_resets(monkeypatch)
    log: list[str] = []
    for name in ("a", "b"):
        _fork.at_fork(before=lambda name=name: log.append(f"before {name}"),
                      after_in_parent=lambda name=name: log.append(f"parent {name}"))
    _fork._before_fork()
    _fork._after_fork_in_parent()
    assert log == ["before b", "before a", "parent a", "parent b"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")
def test_a_real_fork_runs_the_resets_in_the_child_only() -> None:
    log: list[str] = []
    owner = Owner(log, "reset")
    _fork.reset_in_child(owner, Owner.reset)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: say what ran, then leave without pytest's exit handlers
        try:
            os.write(write, ",".join(log).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert said == "reset" and log == []  # the child reset its copy; the parent's is as it was
    _fork.forget(owner)


def test_every_module_with_per_process_state_uses_the_registry() -> None:
    """One registry: no module of ours registers its own fork handler or keeps a weak set for one."""
    package = os.path.dirname(_fork.__file__)
    own = []
    for root, _, files in os.walk(package):
        for name in files:
            path = os.path.join(root, name)
            if name.endswith(".py") and path != _fork.__file__:
                with open(path, encoding="utf-8") as source:
                    if "register_at_fork" in source.read():
                        own.append(os.path.relpath(path, package))
    assert own == []
