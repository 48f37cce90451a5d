"""The native stack (scripts/stack/otelstack/) without the real binaries: rendering, ports, and
process-group shutdown (SIGTERM, then SIGKILL after the deadline)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import otelstack as stack_mod  # scripts/stack/otelstack/ (pythonpath in pyproject.toml)
import pytest
import yaml
from otelstack import render, supervisor


def _ports() -> stack_mod.Ports:
    return stack_mod.Ports.allocate()


def test_free_ports_are_distinct_and_bindable():
    ports = stack_mod.free_ports(13)
    assert len(set(ports)) == 13
    assert all(1024 < p < 65536 for p in ports)


def test_render_prometheus_points_everything_at_loopback(tmp_path: Path):
    p = _ports()
    text = stack_mod.render_prometheus(p, tmp_path / "rules.yml", scrape_interval="1s", evaluation_interval="2s")
    cfg = yaml.safe_load(text)
    assert cfg["global"]["scrape_interval"] == "1s"
    assert cfg["global"]["evaluation_interval"] == "2s"
    assert cfg["rule_files"] == [str(tmp_path / "rules.yml")]
    targets = {sc["job_name"]: sc["static_configs"][0]["targets"] for sc in cfg["scrape_configs"]}
    assert targets == {
        "otel-training-metrics": [f"127.0.0.1:{p.collector_prometheus}"],
        "otel-collector": [f"127.0.0.1:{p.collector_telemetry}"],
        "jaeger": [f"127.0.0.1:{p.jaeger_metrics}"],
        "prometheus": [f"127.0.0.1:{p.prometheus}"],
    }
    assert cfg["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [f"127.0.0.1:{p.alertmanager}"]
    # Only addresses and intervals changed: the rest is the shipped file.
    shipped = yaml.safe_load((stack_mod.CONFIG_DIR / "prometheus.yml").read_text())
    assert [sc["job_name"] for sc in shipped["scrape_configs"]] == [sc["job_name"] for sc in cfg["scrape_configs"]]
    assert cfg["scrape_configs"][0]["honor_labels"] is True


def test_render_alertmanager_webhook_and_fast_timings():
    text = stack_mod.render_alertmanager("http://127.0.0.1:1234/hook", fast=True)
    cfg = yaml.safe_load(text)
    assert cfg["receivers"][0]["webhook_configs"][0]["url"] == "http://127.0.0.1:1234/hook"
    assert cfg["route"]["group_wait"] == "1s"
    assert cfg["route"]["group_interval"] == "1s"
    slow = yaml.safe_load(stack_mod.render_alertmanager("http://x/", fast=False))
    assert slow["route"]["group_wait"] == "30s"


def test_render_rules_for_override():
    cfg = yaml.safe_load(stack_mod.render_rules(for_override="1s"))
    fors = [r["for"] for g in cfg["groups"] for r in g["rules"] if "alert" in r]
    assert fors and set(fors) == {"1s"}
    shipped = yaml.safe_load(stack_mod.render_rules(for_override=None))
    assert {r["for"] for g in shipped["groups"] for r in g["rules"] if "alert" in r} != {"1s"}


def test_render_rules_replacements_must_match():
    text = stack_mod.render_rules(for_override=None, replacements={"[10m]": "[20s]"})
    assert "[10m]" not in text and "[20s]" in text
    with pytest.raises(stack_mod.StackError, match="not found"):
        stack_mod.render_rules(for_override=None, replacements={"[99h]": "[1s]"})


def test_render_refuses_a_config_it_does_not_recognise(monkeypatch, tmp_path: Path):
    (tmp_path / "prometheus.yml").write_text("global: {}\n")
    monkeypatch.setattr(render, "CONFIG_DIR", tmp_path)
    with pytest.raises(stack_mod.StackError, match="otel-collector:8889"):
        stack_mod.render_prometheus(_ports(), tmp_path / "r.yml", scrape_interval="1s", evaluation_interval="1s")


SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _start(tmp_path: Path, name: str, script: str) -> tuple[stack_mod.Stack, stack_mod.Component, Path]:
    s = stack_mod.Stack(tmp_path)
    marker = tmp_path / f"{name}.started"
    proc = stack_mod.Component("collector", [sys.executable, str(SCRIPTS / script), str(marker)], dict(os.environ),
                               tmp_path / f"{name}.log", "http://127.0.0.1:1/")
    s.supervisor.add(proc)
    s.supervisor.spawn(proc.name)
    stack_mod.wait_until(marker.exists, timeout=20, what=f"{name} to start")
    return s, proc, marker


@pytest.mark.realtime
def test_stop_sigkills_a_process_group_that_ignores_sigterm(tmp_path: Path):
    s, proc, marker = _start(tmp_path, "stubborn", "service_stubborn.py")
    child = int(stack_mod.wait_until(lambda: marker.read_text().strip(), timeout=10, what="child pid"))
    t0 = time.monotonic()
    s.stop(timeout=1.0)
    elapsed = time.monotonic() - t0
    assert not proc.running()
    assert proc.popen.returncode == -signal.SIGKILL
    # The grandchild was in the same process group: it is gone too.
    stack_mod.wait_until(lambda: not supervisor._pid_alive(child), timeout=5, what="grandchild to die")
    assert 1.0 <= elapsed < 8.0


@pytest.mark.realtime
def test_stop_uses_sigterm_first(tmp_path: Path):
    s, proc, _ = _start(tmp_path, "polite", "service_polite.py")
    t0 = time.monotonic()
    s.stop(timeout=10.0)
    assert proc.popen.returncode == 0  # exited on SIGTERM, never killed
    assert time.monotonic() - t0 < 5.0


def test_from_state_never_signals_a_reused_pid(tmp_path: Path):
    s, proc, _ = _start(tmp_path, "polite", "service_polite.py")
    try:
        s.ports = _ports()
        s.save_state()
        state = stack_mod.Stack.from_state(tmp_path)
        assert state.procs["collector"].pid == proc.pid
        # Pretend the recorded binary was something else: the pid is not ours.
        data = (tmp_path / "stack.json").read_text().replace(sys.executable, "/nonexistent/otelcol")
        (tmp_path / "stack.json").write_text(data)
        assert stack_mod.Stack.from_state(tmp_path).procs["collector"].pid is None
    finally:
        s.stop()
