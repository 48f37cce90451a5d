"""The generic supervisor (scripts/stack/otelstack/supervisor.py) on trivial components:
small Python HTTP servers whose health URL serves the config file the supervisor wrote
for them. Real processes and process groups; every wait is on a condition with a deadline."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
from otelstack import Component, StackError, Supervisor, free_ports, http_get, wait_until
from otelstack.supervisor import _pid_alive

#: The test programs (config_server.py: serves its config file, refuses to start without its data dir).
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
STARTUP_S = 60.0  # generous: a loaded 2-core machine


def _server(tmp_path: Path, name: str, port: int) -> Component:
    config, data = tmp_path / "config" / f"{name}.txt", tmp_path / "data" / name
    return Component(name, [sys.executable, str(SCRIPTS / "config_server.py"), str(port), str(config), str(data)],
                     dict(os.environ),
                     tmp_path / "logs" / f"{name}.log", f"http://127.0.0.1:{port}/",
                     configs={config: f"I am {name}"}, data_dirs=(data,))


@pytest.fixture
def sup(tmp_path: Path):
    s = Supervisor(tmp_path, startup_timeout=STARTUP_S, state_file=tmp_path / "state.json")
    a, b = free_ports(2)
    s.add(_server(tmp_path, "a", a), _server(tmp_path, "b", b))
    yield s
    s.stop(timeout=5)
    assert not [n for n, c in s.components.items() if c.running()], "components survived stop()"


def test_start_renders_configs_and_data_dirs_then_waits_until_every_component_is_healthy(sup: Supervisor):
    sup.start()
    for name in ("a", "b"):
        c = sup[name]
        assert c.healthy()
        assert http_get(c.health_url) == (200, f"I am {name}".encode())  # served what the supervisor wrote
    assert sup["a"].pid != sup["b"].pid
    assert all(os.getpgid(c.pid) == c.pid for c in sup.components.values())  # each in its own group


def test_start_of_a_group_starts_only_that_group(sup: Supervisor):
    sup.start(["b"])
    assert sup["b"].healthy()
    assert not sup["a"].running() and sup["a"].pid is None


def test_kill_and_restart_one_component_by_name(sup: Supervisor):
    sup.start()
    sup.save_state(purpose="test")
    old_pid = sup["a"].pid
    sup.kill("a")
    assert not sup["a"].running()
    assert sup["a"].popen.returncode == -signal.SIGKILL
    assert sup["b"].healthy()  # the others are untouched
    sup.restart("a")
    assert sup["a"].healthy() and sup["a"].pid != old_pid
    assert http_get(sup["a"].health_url)[1] == b"I am a"  # same port, same config
    state = json.loads(sup.state_file.read_text())
    assert state["procs"]["a"]["pid"] == sup["a"].pid  # the restart was recorded
    assert state["purpose"] == "test"  # with what the owner saved before


def test_restart_of_a_running_component_stops_it_first(sup: Supervisor):
    sup.start(["a"])
    first = sup["a"].popen
    sup.restart("a")
    assert first.returncode == 0  # exited on SIGTERM, not killed
    assert sup["a"].healthy()


def test_a_component_that_exits_fails_start_with_its_code_and_log(tmp_path: Path):
    s = Supervisor(tmp_path, startup_timeout=STARTUP_S)
    s.add(Component("crash", [sys.executable, "-c", "print('bad config line 7'); raise SystemExit(3)"],
                    dict(os.environ), tmp_path / "crash.log", "http://127.0.0.1:1/"))
    with pytest.raises(StackError, match=r"(?s)crash exited with code 3.*bad config line 7"):
        s.start()


def test_a_component_that_never_gets_healthy_fails_after_its_deadline(tmp_path: Path):
    (port,) = free_ports(1)
    s = Supervisor(tmp_path, startup_timeout=1.0)
    s.add(Component("mute", [sys.executable, "-c", "import time; print('starting', flush=True); time.sleep(600)"],
                    dict(os.environ), tmp_path / "mute.log", f"http://127.0.0.1:{port}/"))
    try:
        with pytest.raises(StackError, match=r"(?s)mute not healthy at http://127.0.0.1:\d+/ after 1s.*mute.log"):
            s.start()
        assert s["mute"].running()  # a slow component is reported, not killed behind the owner's back
    finally:
        s.stop(timeout=5)
    assert not s["mute"].running()


def test_state_lets_another_process_stop_what_this_one_started(sup: Supervisor, tmp_path: Path):
    sup.start()
    sup.save_state(ports={"a": 1})
    pids = {n: c.pid for n, c in sup.components.items()}
    other = Supervisor.from_state(sup.state_file, tmp_path)  # as the CLI's `down` does: no Popen, only pids
    assert {n: c.pid for n, c in other.components.items()} == pids
    assert other.meta == {"ports": {"a": 1}}
    assert all(c.healthy() for c in other.components.values())
    other.stop(timeout=10)
    wait_until(lambda: not any(_pid_alive(p) for p in pids.values()), timeout=10, what="the components to exit")
    assert not sup.state_file.exists()


def test_state_forgets_a_pid_that_runs_something_else_now(sup: Supervisor, tmp_path: Path):
    sup.start(["a"])
    sup.save_state()
    data = sup.state_file.read_text().replace(json.dumps(sys.executable), json.dumps("/nonexistent/server"))
    sup.state_file.write_text(data)
    other = Supervisor.from_state(sup.state_file, tmp_path)
    assert other["a"].pid is None and not other["a"].running()
    other.stop(timeout=1)
    assert sup["a"].healthy()  # never signalled


def test_names_are_unique_and_unknown_names_are_named(tmp_path: Path):
    s = Supervisor(tmp_path)
    s.add(_server(tmp_path, "a", 1))
    with pytest.raises(StackError, match="two components named 'a'"):
        s.add(_server(tmp_path, "a", 2))
    with pytest.raises(StackError, match=r"no component named 'b' \(have: a\)"):
        s.kill("b")
    with pytest.raises(StackError, match="no running stack recorded"):
        Supervisor.from_state(tmp_path / "missing.json", tmp_path)
