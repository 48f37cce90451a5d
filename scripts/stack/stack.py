#!/usr/bin/env python3
"""Run the otel-training observability stack natively, on loopback, without Docker.

Four processes, each from the same configuration files as docker-compose.yml
(``collector-config/``), with only addresses, paths and intervals overridden:

* the OpenTelemetry Collector built by ``scripts/stack/build.sh`` (``otel-collector.yaml``),
  with its persistent sending queue in ``<run_dir>/collector-queue``,
* Jaeger v2 built by ``scripts/stack/build.sh`` (``jaeger.yaml``), storing traces
  in Badger under ``<run_dir>/jaeger-data``,
* Prometheus from Debian's package (``prometheus.yml``, ``alert-rules.yml``),
* Alertmanager from Debian's package (``alertmanager.yml``).

Every port is a free loopback port found by binding port 0, so parallel runs do
not collide. Each process runs in its own process group with its log in
``<run_dir>/logs/``; :meth:`Stack.stop` sends SIGTERM to every group, then
SIGKILL after a deadline. Startup waits on health endpoints with deadlines.

Stdlib only: importable by the tests (``tests/e2e/conftest.py``) and runnable::

    python scripts/stack/stack.py up [--run-dir DIR] [--fast] [--webhook-url URL]
    python scripts/stack/stack.py status [--run-dir DIR]
    python scripts/stack/stack.py down [--run-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO / "collector-config"
BUILD_SH = REPO / "scripts" / "stack" / "build.sh"
LOOPBACK = "127.0.0.1"

#: The webhook URL written in collector-config/alertmanager.yml, replaced on render.
DEFAULT_WEBHOOK_URL = "http://host.docker.internal:5001/otel-training/alerts"

COMPONENTS = ("jaeger", "collector", "alertmanager", "prometheus")


class StackError(RuntimeError):
    """The stack could not be built, started or checked."""


def cache_dir() -> Path:
    return Path(os.environ.get("OTEL_TRAINING_CACHE") or Path.home() / ".cache" / "otel-training")


def default_run_dir() -> Path:
    return cache_dir() / "stack"


# --------------------------------------------------------------------------
# Binaries
# --------------------------------------------------------------------------
@dataclass
class Binaries:
    otelcol: Path
    jaeger: Path
    prometheus: Path
    alertmanager: Path


def cached_binary_paths() -> dict[str, str]:
    """Paths build.sh uses for the collector and Jaeger (they may not exist yet)."""
    out = subprocess.run(["bash", str(BUILD_SH), "paths"], check=True, capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _which_alertmanager() -> str | None:
    return shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


def missing_prerequisites() -> list[str]:
    """What is missing to build and run the stack, as human-readable reasons."""
    missing = []
    paths = cached_binary_paths()
    otelcol = os.environ.get("OTEL_TRAINING_OTELCOL_BIN") or paths["OTELCOL_BIN"]
    jaeger = os.environ.get("OTEL_TRAINING_JAEGER_BIN") or paths["JAEGER_BIN"]
    if not (Path(otelcol).is_file() and Path(jaeger).is_file()) and shutil.which("go") is None:
        missing.append("Go toolchain (needed once to build the collector and Jaeger: scripts/stack/build.sh)")
    if shutil.which("prometheus") is None:
        missing.append("prometheus (Debian package 'prometheus': scripts/stack/install-deps.sh)")
    if _which_alertmanager() is None:
        missing.append("alertmanager (Debian package 'prometheus-alertmanager': scripts/stack/install-deps.sh)")
    return missing


def ensure_binaries(log: Path | None = None) -> Binaries:
    """Build (or reuse from the cache) the collector and Jaeger; find Prometheus and Alertmanager."""
    paths = cached_binary_paths()
    otelcol = Path(os.environ.get("OTEL_TRAINING_OTELCOL_BIN") or paths["OTELCOL_BIN"])
    jaeger = Path(os.environ.get("OTEL_TRAINING_JAEGER_BIN") or paths["JAEGER_BIN"])
    if not (otelcol.is_file() and jaeger.is_file()):
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "ab") as fh:
                proc = subprocess.run(["bash", str(BUILD_SH), "all"], stdout=fh, stderr=subprocess.STDOUT)
        else:
            proc = subprocess.run(["bash", str(BUILD_SH), "all"])
        if proc.returncode != 0:
            where = f"; see {log}" if log else ""
            raise StackError(f"scripts/stack/build.sh failed with exit code {proc.returncode}{where}")
    for p in (otelcol, jaeger):
        if not p.is_file():
            raise StackError(f"{p} is missing after scripts/stack/build.sh")
    prometheus = shutil.which("prometheus")
    alertmanager = _which_alertmanager()
    if prometheus is None or alertmanager is None:
        raise StackError("prometheus/alertmanager not installed: run scripts/stack/install-deps.sh")
    return Binaries(otelcol, jaeger, Path(prometheus), Path(alertmanager))


# --------------------------------------------------------------------------
# Ports and rendering
# --------------------------------------------------------------------------
def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (all bound at once, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Ports:
    otlp_grpc: int
    otlp_http: int
    collector_health: int
    collector_prometheus: int
    collector_telemetry: int
    jaeger_otlp_grpc: int
    jaeger_otlp_http: int
    jaeger_query_http: int
    jaeger_query_grpc: int
    jaeger_health: int
    jaeger_metrics: int
    prometheus: int
    alertmanager: int

    @classmethod
    def allocate(cls) -> "Ports":
        names = [f for f in cls.__dataclass_fields__]
        return cls(**dict(zip(names, free_ports(len(names)))))


def _replace_exactly(text: str, old: str, new: str, what: str) -> str:
    if old not in text:
        raise StackError(f"cannot render {what}: {old!r} not found (did the shipped config change?)")
    return text.replace(old, new)


def render_prometheus(ports: Ports, rules_path: Path, *, scrape_interval: str, evaluation_interval: str) -> str:
    text = (CONFIG_DIR / "prometheus.yml").read_text()
    for old, new in [
        ('"otel-collector:8889"', f'"{LOOPBACK}:{ports.collector_prometheus}"'),
        ('"otel-collector:8888"', f'"{LOOPBACK}:{ports.collector_telemetry}"'),
        ('"jaeger:8888"', f'"{LOOPBACK}:{ports.jaeger_metrics}"'),
        ('"alertmanager:9093"', f'"{LOOPBACK}:{ports.alertmanager}"'),
        ('"localhost:9090"', f'"{LOOPBACK}:{ports.prometheus}"'),
        ("  - alert-rules.yml", f"  - {rules_path}"),
        ("scrape_interval: 15s", f"scrape_interval: {scrape_interval}"),
        ("evaluation_interval: 15s", f"evaluation_interval: {evaluation_interval}"),
    ]:
        text = _replace_exactly(text, old, new, "prometheus.yml")
    return text


def render_rules(*, for_override: str | None, replacements: dict[str, str] | None = None) -> str:
    """alert-rules.yml, optionally with every ``for:`` set to ``for_override`` and
    exact-text ``replacements`` (e.g. ``{"[10m]": "[20s]"}`` to shorten windows
    in tests); each replaced text must occur in the file."""
    text = (CONFIG_DIR / "alert-rules.yml").read_text()
    for old, new in (replacements or {}).items():
        text = _replace_exactly(text, old, new, "alert-rules.yml")
    if for_override is not None:
        text, n = re.subn(r"(?m)^(\s+for: )\S+$", rf"\g<1>{for_override}", text)
        if n == 0:
            raise StackError("cannot render alert-rules.yml: no 'for:' found")
    return text


def render_alertmanager(webhook_url: str, *, fast: bool) -> str:
    text = (CONFIG_DIR / "alertmanager.yml").read_text()
    text = _replace_exactly(text, f"url: {DEFAULT_WEBHOOK_URL}", f"url: {webhook_url}", "alertmanager.yml")
    if fast:
        for old, new in [
            ("group_wait: 30s", "group_wait: 1s"),
            ("group_wait: 5s", "group_wait: 1s"),
            ("group_interval: 5m", "group_interval: 1s"),
        ]:
            text = _replace_exactly(text, old, new, "alertmanager.yml")
    return text


# --------------------------------------------------------------------------
# HTTP helpers
# --------------------------------------------------------------------------
def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_until(check: Callable[[], object], *, timeout: float, interval: float = 0.2, what: str = "condition"):
    """Poll ``check`` until it returns a truthy value or the deadline passes.

    Exceptions from ``check`` count as "not yet"; the last one is reported.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - reported on timeout
            last_exc = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_exc!r})" if last_exc else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(interval)


def _http_ok(url: str) -> bool:
    status, _ = http_get(url, timeout=1.0)
    return status == 200


# --------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------
@dataclass
class Proc:
    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    health_url: str
    pid: int | None = None
    popen: subprocess.Popen | None = field(default=None, repr=False, compare=False)

    def running(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return self.pid is not None and _pid_alive(self.pid)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) is not running.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def spawn(proc: Proc, cwd: Path) -> None:
    """Start ``proc`` in its own process group (so stopping it stops its children), output to its log."""
    with open(proc.log, "ab") as log:
        log.write(f"\n--- {time.strftime('%Y-%m-%dT%H:%M:%S')} starting: {' '.join(proc.argv)}\n".encode())
        log.flush()
        proc.popen = subprocess.Popen(
            proc.argv,
            env=proc.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,  # own process group: stop() signals the group
        )
    proc.pid = proc.popen.pid


def wait_healthy(proc: Proc, timeout: float) -> None:
    """Wait until ``proc`` answers 200 on its health URL; a StackError with its log's tail if it exits or times out."""
    def check() -> bool:
        if not proc.running():
            raise StackError(f"{proc.name} exited with code {proc.popen.poll() if proc.popen else '?'}")
        return _http_ok(proc.health_url)

    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except StackError as exc:
            raise StackError(f"{exc}; log {proc.log}:\n{_tail(proc.log)}") from None
        except OSError:
            pass
        if time.monotonic() >= deadline:
            raise StackError(
                f"{proc.name} not healthy at {proc.health_url} after {timeout:.0f}s; log {proc.log}:\n{_tail(proc.log)}"
            )
        time.sleep(0.1)


def stop_procs(procs: Iterable[Proc], timeout: float = 10.0) -> None:
    """SIGTERM every process group, SIGKILL what is left after ``timeout``, reap."""
    procs = list(procs)
    for p in procs:
        _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs:
        while p.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        if p.running():
            _signal_group(p, signal.SIGKILL)
    for p in procs:
        if p.popen is not None:
            try:
                p.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


def kill_proc(p: Proc, sig: int = signal.SIGKILL, timeout: float = 10.0) -> None:
    """Send ``sig`` to one process group and wait for it to exit."""
    _signal_group(p, sig)
    wait_until(lambda: not p.running(), timeout=timeout, what=f"{p.name} to exit")
    if p.popen is not None:
        p.popen.wait(timeout=5)


def jaeger_env(base_env: dict[str, str], *, otlp_grpc: str, otlp_http: str, query_http: str, query_grpc: str,
               health: str, metrics_port: int, data_dir: Path, log_level: str) -> dict[str, str]:
    """Jaeger's environment for collector-config/jaeger.yaml (addresses are host:port)."""
    return dict(
        base_env,
        JAEGER_OTLP_GRPC_ENDPOINT=otlp_grpc,
        JAEGER_OTLP_HTTP_ENDPOINT=otlp_http,
        JAEGER_QUERY_HTTP_ENDPOINT=query_http,
        JAEGER_QUERY_GRPC_ENDPOINT=query_grpc,
        JAEGER_HEALTH_ENDPOINT=health,
        JAEGER_METRICS_HOST=LOOPBACK,
        JAEGER_METRICS_PORT=str(metrics_port),
        JAEGER_BADGER_DIRECTORY=str(data_dir),
        JAEGER_LOG_LEVEL=log_level,
    )


def collector_env(base_env: dict[str, str], *, otlp_grpc: str, otlp_http: str, health: str, telemetry_port: int,
                  queue_dir: Path, log_level: str, prometheus: str | None = None, jaeger_otlp: str | None = None,
                  alerts_file: Path | None = None, telemetry_host: str = LOOPBACK, **extra: str) -> dict[str, str]:
    """A collector's environment for otel-collector.yaml, gateway.yaml or agent.yaml (addresses are host:port)."""
    env = dict(
        base_env,
        OTELCOL_OTLP_GRPC_ENDPOINT=otlp_grpc,
        OTELCOL_OTLP_HTTP_ENDPOINT=otlp_http,
        OTELCOL_HEALTH_ENDPOINT=health,
        OTELCOL_TELEMETRY_HOST=telemetry_host,
        OTELCOL_TELEMETRY_PORT=str(telemetry_port),
        OTELCOL_FILE_STORAGE_DIR=str(queue_dir),
        OTELCOL_LOG_LEVEL=log_level,
        **extra,
    )
    optional = {"OTELCOL_PROMETHEUS_ENDPOINT": prometheus, "JAEGER_OTLP_ENDPOINT": jaeger_otlp,
                "OTELCOL_ALERTS_FILE": None if alerts_file is None else str(alerts_file)}
    env.update({key: value for key, value in optional.items() if value is not None})
    return env


def clean_env() -> dict[str, str]:
    """This process's environment without any collector, Jaeger or OpenTelemetry setting."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("OTELCOL_", "JAEGER_", "OTEL_"))}


class Stack:
    """The native stack. Use as a context manager, or call start()/stop()."""

    def __init__(
        self,
        run_dir: Path | str | None = None,
        *,
        binaries: Binaries | None = None,
        webhook_url: str | None = None,
        fast: bool = False,
        scrape_interval: str | None = None,
        evaluation_interval: str | None = None,
        spanmetrics_flush_interval: str | None = None,
        rule_for_override: str | None = None,
        rule_replacements: dict[str, str] | None = None,
        startup_timeout: float = 60.0,
        log_level: str = "info",
    ) -> None:
        self.run_dir = Path(run_dir or default_run_dir()).resolve()
        self.binaries = binaries
        self.webhook_url = webhook_url or os.environ.get("OTEL_TRAINING_WEBHOOK_URL") or DEFAULT_WEBHOOK_URL
        self.fast = fast
        self.scrape_interval = scrape_interval or ("1s" if fast else "15s")
        self.evaluation_interval = evaluation_interval or ("1s" if fast else "15s")
        self.spanmetrics_flush_interval = spanmetrics_flush_interval or ("1s" if fast else "15s")
        self.rule_for_override = rule_for_override
        self.rule_replacements = rule_replacements
        self.startup_timeout = startup_timeout
        self.log_level = log_level
        self.ports: Ports | None = None
        self.procs: dict[str, Proc] = {}

    # -- endpoints ----------------------------------------------------------
    def _p(self) -> Ports:
        if self.ports is None:
            raise StackError("stack not started")
        return self.ports

    @property
    def otlp_grpc_endpoint(self) -> str:
        """For OTLPSpanExporter(endpoint=..., insecure=True) and OTEL_EXPORTER_OTLP_ENDPOINT."""
        return f"http://{LOOPBACK}:{self._p().otlp_grpc}"

    @property
    def otlp_http_endpoint(self) -> str:
        return f"http://{LOOPBACK}:{self._p().otlp_http}"

    @property
    def collector_health_url(self) -> str:
        return f"http://{LOOPBACK}:{self._p().collector_health}/"

    @property
    def collector_metrics_url(self) -> str:
        """The collector's prometheus exporter (span metrics, SDK metrics)."""
        return f"http://{LOOPBACK}:{self._p().collector_prometheus}/metrics"

    @property
    def collector_telemetry_url(self) -> str:
        """The collector's own metrics (otelcol_*)."""
        return f"http://{LOOPBACK}:{self._p().collector_telemetry}/metrics"

    @property
    def jaeger_url(self) -> str:
        return f"http://{LOOPBACK}:{self._p().jaeger_query_http}"

    @property
    def prometheus_url(self) -> str:
        return f"http://{LOOPBACK}:{self._p().prometheus}"

    @property
    def alertmanager_url(self) -> str:
        return f"http://{LOOPBACK}:{self._p().alertmanager}"

    @property
    def alerts_file(self) -> Path:
        return self.run_dir / "alerts" / "alerts.jsonl"

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "logs"

    @property
    def jaeger_data_dir(self) -> Path:
        """Jaeger's Badger store: kept across Jaeger restarts (and stack restarts on the same run dir)."""
        return self.run_dir / "jaeger-data"

    @property
    def collector_queue_dir(self) -> Path:
        """The collector's persistent sending queue (file_storage extension)."""
        return self.run_dir / "collector-queue"

    def client_env(self) -> dict[str, str]:
        """Environment for a training process exporting to this stack."""
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.otlp_grpc_endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
        }

    # -- lifecycle ------------------------------------------------------------
    def __enter__(self) -> "Stack":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _prepare(self) -> None:
        assert self.binaries is not None
        p = self.ports = Ports.allocate()
        cfg = self.run_dir / "config"
        for d in (cfg, self.log_dir, self.alerts_file.parent, self.run_dir / "prometheus-data", self.run_dir / "alertmanager-data",
                  self.collector_queue_dir, self.jaeger_data_dir):
            d.mkdir(parents=True, exist_ok=True)
        rules = cfg / "alert-rules.yml"
        rules.write_text(render_rules(for_override=self.rule_for_override, replacements=self.rule_replacements))
        (cfg / "prometheus.yml").write_text(
            render_prometheus(p, rules, scrape_interval=self.scrape_interval, evaluation_interval=self.evaluation_interval)
        )
        (cfg / "alertmanager.yml").write_text(render_alertmanager(self.webhook_url, fast=self.fast))

        base_env = clean_env()
        lo = LOOPBACK
        collector = collector_env(
            base_env, otlp_grpc=f"{lo}:{p.otlp_grpc}", otlp_http=f"{lo}:{p.otlp_http}",
            health=f"{lo}:{p.collector_health}", prometheus=f"{lo}:{p.collector_prometheus}",
            telemetry_port=p.collector_telemetry, jaeger_otlp=f"{lo}:{p.jaeger_otlp_grpc}",
            alerts_file=self.alerts_file, queue_dir=self.collector_queue_dir, log_level=self.log_level,
            OTELCOL_SPANMETRICS_FLUSH_INTERVAL=self.spanmetrics_flush_interval,
        )
        jaeger = jaeger_env(
            base_env, otlp_grpc=f"{lo}:{p.jaeger_otlp_grpc}", otlp_http=f"{lo}:{p.jaeger_otlp_http}",
            query_http=f"{lo}:{p.jaeger_query_http}", query_grpc=f"{lo}:{p.jaeger_query_grpc}",
            health=f"{lo}:{p.jaeger_health}", metrics_port=p.jaeger_metrics, data_dir=self.jaeger_data_dir,
            log_level=self.log_level,
        )
        b = self.binaries
        self.procs = {
            "jaeger": Proc(
                "jaeger",
                [str(b.jaeger), "--config", str(CONFIG_DIR / "jaeger.yaml")],
                jaeger,
                self.log_dir / "jaeger.log",
                f"{self.jaeger_url}/api/services",
            ),
            "collector": Proc(
                "collector",
                [str(b.otelcol), "--config", str(CONFIG_DIR / "otel-collector.yaml")],
                collector,
                self.log_dir / "collector.log",
                self.collector_health_url,
            ),
            "alertmanager": Proc(
                "alertmanager",
                [
                    str(b.alertmanager),
                    f"--config.file={cfg / 'alertmanager.yml'}",
                    f"--storage.path={self.run_dir / 'alertmanager-data'}",
                    f"--web.listen-address={lo}:{p.alertmanager}",
                    "--cluster.listen-address=",  # no gossip port: single instance
                ],
                base_env,
                self.log_dir / "alertmanager.log",
                f"{self.alertmanager_url}/-/ready",
            ),
            "prometheus": Proc(
                "prometheus",
                [
                    str(b.prometheus),
                    f"--config.file={cfg / 'prometheus.yml'}",
                    f"--storage.tsdb.path={self.run_dir / 'prometheus-data'}",
                    f"--web.listen-address={lo}:{p.prometheus}",
                    "--storage.tsdb.retention.time=1d",
                ],
                base_env,
                self.log_dir / "prometheus.log",
                f"{self.prometheus_url}/-/ready",
            ),
        }

    def _spawn(self, proc: Proc) -> None:
        spawn(proc, self.run_dir)

    def _wait_healthy(self, proc: Proc, timeout: float) -> None:
        wait_healthy(proc, timeout)

    def start(self, attempts: int = 3) -> "Stack":
        """Start all four processes and wait until each is healthy.

        A port taken between choosing it and binding it (another run) makes a
        process exit; the whole start is then retried on fresh ports.
        """
        if self.binaries is None:
            self.binaries = ensure_binaries(self.log_dir / "build.log")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, attempts + 1):
            self._prepare()
            try:
                for name in COMPONENTS:
                    self._spawn(self.procs[name])
                for name in COMPONENTS:
                    self._wait_healthy(self.procs[name], self.startup_timeout)
                self._wait_prometheus_targets()
            except StackError as exc:
                self.stop()
                if attempt < attempts and "address already in use" in str(exc):
                    continue
                raise
            self.save_state()
            return self
        raise AssertionError("unreachable")

    def _wait_prometheus_targets(self) -> None:
        """Prometheus has scraped the collector at least once (so rules have data soon)."""

        def scraped() -> bool:
            status, body = http_get(f"{self.prometheus_url}/api/v1/targets")
            if status != 200:
                return False
            targets = json.loads(body)["data"]["activeTargets"]
            by_job = {t["labels"]["job"]: t["health"] for t in targets}
            return by_job.get("otel-training-metrics") == "up" and by_job.get("otel-collector") == "up"

        try:
            wait_until(scraped, timeout=self.startup_timeout, what="Prometheus to scrape the collector")
        except TimeoutError as exc:
            raise StackError(f"{exc}; log {self.procs['prometheus'].log}:\n{_tail(self.procs['prometheus'].log)}") from None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM every process group we started, SIGKILL what is left after ``timeout``."""
        stop_procs(reversed([self.procs[n] for n in COMPONENTS if n in self.procs]), timeout)
        state = self.run_dir / "stack.json"
        if state.exists():
            state.unlink()

    # -- single components (for failure tests) ------------------------------
    def kill(self, name: str, sig: int = signal.SIGKILL, timeout: float = 10.0) -> None:
        """Send ``sig`` to one component's process group and wait for it to exit."""
        kill_proc(self.procs[name], sig, timeout)

    def restart(self, name: str) -> None:
        """(Re)start one component on its same ports and wait until it is healthy."""
        p = self.procs[name]
        if p.running():
            self.kill(name, signal.SIGTERM)
        self._spawn(p)
        self._wait_healthy(p, self.startup_timeout)
        self.save_state()

    # -- state for the CLI ---------------------------------------------------
    def save_state(self) -> None:
        state = {
            "run_dir": str(self.run_dir),
            "ports": asdict(self._p()),
            "procs": {n: {"pid": p.pid, "argv": p.argv, "log": str(p.log), "health_url": p.health_url} for n, p in self.procs.items()},
            "endpoints": self.endpoints(),
        }
        (self.run_dir / "stack.json").write_text(json.dumps(state, indent=2))

    def endpoints(self) -> dict[str, str]:
        return {
            "otlp_grpc": self.otlp_grpc_endpoint,
            "otlp_http": self.otlp_http_endpoint,
            "collector_health": self.collector_health_url,
            "collector_metrics": self.collector_metrics_url,
            "collector_telemetry": self.collector_telemetry_url,
            "jaeger": self.jaeger_url,
            "prometheus": self.prometheus_url,
            "alertmanager": self.alertmanager_url,
            "alerts_file": str(self.alerts_file),
        }

    def status(self) -> dict[str, dict[str, object]]:
        out = {}
        for n, p in self.procs.items():
            alive = p.running()
            healthy = False
            if alive:
                try:
                    healthy = _http_ok(p.health_url)
                except OSError:
                    healthy = False
            out[n] = {"pid": p.pid, "running": alive, "healthy": healthy, "log": str(p.log)}
        return out

    @classmethod
    def from_state(cls, run_dir: Path | str) -> "Stack":
        run_dir = Path(run_dir)
        state_file = run_dir / "stack.json"
        if not state_file.exists():
            raise StackError(f"no running stack recorded in {state_file}")
        state = json.loads(state_file.read_text())
        s = cls(run_dir)
        s.ports = Ports(**state["ports"])
        for n, d in state["procs"].items():
            proc = Proc(n, d["argv"], {}, Path(d["log"]), d["health_url"], pid=d["pid"])
            # Only signal a pid that still runs what we started (pids get reused).
            if proc.pid and not _cmdline_matches(proc.pid, proc.argv[0]):
                proc.pid = None
            s.procs[n] = proc
        return s


def _cmdline_matches(pid: int, exe: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv0 = fh.read().split(b"\0", 1)[0].decode(errors="replace")
    except OSError:
        return False
    return argv0 == exe


def _signal_group(p: Proc, sig: int) -> None:
    if p.pid is None:
        return
    try:
        os.killpg(p.pid, sig)  # start_new_session: pgid == pid
    except ProcessLookupError:
        pass
    except PermissionError:
        os.kill(p.pid, sig)


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------
def _print_endpoints(s: Stack) -> None:
    print(json.dumps(s.endpoints(), indent=2))
    print("\n# export to this stack from a training process:")
    for k, v in s.client_env().items():
        print(f"export {k}={v}")


def main(argv: Iterable[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["up", "down", "status", "build"])
    ap.add_argument("--run-dir", type=Path, default=default_run_dir(), help="state, rendered configs, logs, data (default: %(default)s)")
    ap.add_argument("--webhook-url", default=None, help="Alertmanager webhook receiver URL")
    ap.add_argument("--fast", action="store_true", help="1s scrape/evaluation/flush intervals and short Alertmanager waits (demos, tests)")
    ap.add_argument("--timeout", type=float, default=60.0, help="per-component startup deadline in seconds")
    args = ap.parse_args(list(argv) if argv is not None else None)

    if args.command == "build":
        ensure_binaries()
        print(json.dumps(cached_binary_paths(), indent=2))
        return 0
    if args.command == "up":
        if (args.run_dir / "stack.json").exists():
            existing = Stack.from_state(args.run_dir)
            if any(p.running() for p in existing.procs.values()):
                print(f"a stack is already running from {args.run_dir} (use 'down' first):", file=sys.stderr)
                _print_endpoints(existing)
                return 1
        missing = missing_prerequisites()
        if missing:
            print("cannot start the stack, missing:\n  " + "\n  ".join(missing), file=sys.stderr)
            return 2
        s = Stack(args.run_dir, webhook_url=args.webhook_url, fast=args.fast, startup_timeout=args.timeout)
        try:
            s.start()
        except StackError as exc:
            print(f"stack failed to start: {exc}", file=sys.stderr)
            return 1
        print(f"stack is up; logs in {s.log_dir}; stop with: python {Path(__file__).relative_to(REPO)} down --run-dir {s.run_dir}")
        _print_endpoints(s)
        return 0
    try:
        s = Stack.from_state(args.run_dir)
    except StackError as exc:
        print(str(exc), file=sys.stderr)
        return 0 if args.command == "down" else 1
    if args.command == "status":
        st = s.status()
        print(json.dumps({"components": st, "endpoints": s.endpoints()}, indent=2))
        return 0 if all(c["healthy"] for c in st.values()) else 1
    s.stop()
    print(f"stopped the stack recorded in {args.run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
