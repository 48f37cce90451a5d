#!/usr/bin/env python3
"""The agent/gateway topology of docs/pipeline.md, run natively on loopback:

    ranks --OTLP--> agents (agent.yaml + agent-dns.yaml) --load balancing by trace id-->
        gateways (gateway.yaml: tail sampling) --> Jaeger (jaeger.yaml, Badger)

* Gateways listen on their own loopback addresses (127.0.0.2, 127.0.0.3, ...) and one
  shared OTLP port, as pods behind a headless service do.
* The agents find them by DNS: each agent runs in a private mount namespace
  (``unshare --mount``) whose ``/etc/hosts`` is a file of this run, listing the name
  ``otel-gateway.topology`` once per live gateway. A health checker here (standing in
  for Kubernetes' readiness probes and endpoints) polls every gateway's health check
  and rewrites that file with the healthy ones; the agents' DNS resolver reads it every
  ``dns_interval`` (Go also caches the hosts file up to 5 s).
* Each process has its own free ports, logs and data under ``run_dir``.

Requires ``unshare --mount`` (root, or user namespaces); :func:`unshare_argv` says so.
Stdlib only, like stack.py.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

import stack as stack_mod
from stack import CONFIG_DIR, LOOPBACK, Binaries, Proc, StackError, free_ports, http_get

GATEWAY_NAME = "otel-gateway.topology"


def unshare_argv() -> list[str] | None:
    """``unshare`` arguments for a private mount namespace, or None where that is not allowed here."""
    if shutil.which("unshare") is None:
        return None
    for argv in (["unshare", "--mount", "--propagation", "private"],
                 ["unshare", "--map-root-user", "--mount", "--propagation", "private"]):
        try:
            if subprocess.run([*argv, "true"], capture_output=True, timeout=30).returncode == 0:
                return argv
        except (OSError, subprocess.TimeoutExpired):
            return None
    return None


def _shared_port(hosts: list[str]) -> int:
    """A port free on every one of ``hosts`` (the gateways' common OTLP port)."""
    for _ in range(50):
        socks = []
        try:
            first = socket.socket()
            first.bind((hosts[0], 0))
            socks.append(first)
            port = first.getsockname()[1]
            for host in hosts[1:]:
                sock = socket.socket()
                socks.append(sock)
                sock.bind((host, port))
            return port
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise StackError(f"no port free on all of {hosts}")


@dataclass
class Member:
    """One collector of the topology: its process and the endpoints a test reads."""

    proc: Proc
    otlp: str  # host:port
    telemetry_url: str
    health_url: str
    address: str = LOOPBACK
    extra: dict[str, str] = field(default_factory=dict)


class Topology:
    """Jaeger, ``gateways`` gateway collectors and ``agents`` agent collectors. A context manager."""

    def __init__(self, run_dir: Path | str, binaries: Binaries, *, agents: int = 2, gateways: int = 2,
                 sample_percent: float = 10, decision_wait: str = "60s", slow_step_ns: int = 10_000_000_000,
                 dns_interval: str = "1s", startup_timeout: float = 60.0, log_level: str = "info",
                 gateway_args: tuple[str, ...] = ()) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.binaries = binaries
        self.n_agents, self.n_gateways = agents, gateways
        self.sample_percent, self.decision_wait, self.slow_step_ns = sample_percent, decision_wait, slow_step_ns
        self.dns_interval, self.startup_timeout, self.log_level = dns_interval, startup_timeout, log_level
        self.gateway_args = gateway_args
        self.hosts_file = self.run_dir / "hosts"
        self.jaeger: Member | None = None
        self.jaeger_url = ""
        self.gateways: list[Member] = []
        self.agents: list[Member] = []
        self._live: list[str] = []
        self._stop = threading.Event()
        self._checker: threading.Thread | None = None
        self._hosts_lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------
    def __enter__(self) -> "Topology":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> "Topology":
        unshare = unshare_argv()
        if unshare is None:
            raise StackError("unshare --mount is not available here (the agents need a private /etc/hosts)")
        try:
            self._start(unshare)
        except BaseException:
            self.stop()
            raise
        return self

    def _procs(self) -> list[Proc]:
        return [m.proc for m in [*self.agents, *self.gateways, *([self.jaeger] if self.jaeger else [])]]

    def stop(self) -> None:
        self._stop.set()
        if self._checker is not None:
            self._checker.join(timeout=5)
        stack_mod.stop_procs(self._procs())

    def _dir(self, name: str) -> Path:
        path = self.run_dir / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _start(self, unshare: list[str]) -> None:
        base = stack_mod.clean_env()
        logs = self._dir("logs")
        lo = LOOPBACK
        ports = iter(free_ports(6 + 4 * (self.n_gateways + self.n_agents)))
        grpc, http, query, qgrpc, health, metrics = (next(ports) for _ in range(6))
        env = stack_mod.jaeger_env(base, otlp_grpc=f"{lo}:{grpc}", otlp_http=f"{lo}:{http}", query_http=f"{lo}:{query}",
                                   query_grpc=f"{lo}:{qgrpc}", health=f"{lo}:{health}", metrics_port=metrics,
                                   data_dir=self._dir("jaeger-data"), log_level=self.log_level)
        self.jaeger_url = f"http://{lo}:{query}"
        proc = Proc("jaeger", [str(self.binaries.jaeger), "--config", str(CONFIG_DIR / "jaeger.yaml")], env,
                    logs / "jaeger.log", f"{self.jaeger_url}/api/services")
        self.jaeger = Member(proc, f"{lo}:{grpc}", f"http://{lo}:{metrics}/metrics", proc.health_url)
        stack_mod.spawn(proc, self.run_dir)
        stack_mod.wait_healthy(proc, self.startup_timeout)

        addresses = [f"127.0.0.{2 + i}" for i in range(self.n_gateways)]
        otlp_port, http_port = _shared_port(addresses), _shared_port(addresses)
        for i, address in enumerate(addresses):
            health, prom, telemetry, _ = (next(ports) for _ in range(4))
            env = stack_mod.collector_env(
                base, otlp_grpc=f"{address}:{otlp_port}", otlp_http=f"{address}:{http_port}", health=f"{lo}:{health}",
                prometheus=f"{lo}:{prom}", telemetry_port=telemetry, jaeger_otlp=self.jaeger.otlp,
                alerts_file=self._dir(f"gateway-{i}") / "alerts.jsonl", queue_dir=self._dir(f"gateway-{i}/queue"),
                log_level=self.log_level, OTEL_TRAINING_SAMPLE_PERCENT=str(self.sample_percent),
                OTEL_TRAINING_DECISION_WAIT=self.decision_wait, OTEL_TRAINING_SLOW_STEP_NS=str(self.slow_step_ns),
                OTELCOL_SPANMETRICS_FLUSH_INTERVAL="1s",
            )
            proc = Proc(f"gateway-{i}", [str(self.binaries.otelcol), "--config", str(CONFIG_DIR / "gateway.yaml"),
                                         *self.gateway_args], env, logs / f"gateway-{i}.log", f"http://{lo}:{health}/")
            self.gateways.append(Member(proc, f"{address}:{otlp_port}", f"http://{lo}:{telemetry}/metrics",
                                        proc.health_url, address, {"prometheus": f"http://{lo}:{prom}/metrics"}))
            stack_mod.spawn(proc, self.run_dir)
        for gateway in self.gateways:
            stack_mod.wait_healthy(gateway.proc, self.startup_timeout)
        self._write_hosts([g.address for g in self.gateways])
        self._checker = threading.Thread(target=self._check_health, name="topology-health", daemon=True)
        self._checker.start()

        for i in range(self.n_agents):
            grpc, http, health, telemetry = (next(ports) for _ in range(4))
            env = stack_mod.collector_env(
                base, otlp_grpc=f"{lo}:{grpc}", otlp_http=f"{lo}:{http}", health=f"{lo}:{health}",
                telemetry_port=telemetry, queue_dir=self._dir(f"agent-{i}/queue"), log_level=self.log_level,
                OTEL_GATEWAY_DNS_NAME=GATEWAY_NAME, OTEL_GATEWAY_PORT=str(otlp_port),
                OTEL_GATEWAY_DNS_INTERVAL=self.dns_interval,
            )
            # In the agent's own mount namespace, this run's hosts file is /etc/hosts.
            argv = [*unshare, "/bin/sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(self.hosts_file),
                    str(self.binaries.otelcol), "--config", str(CONFIG_DIR / "agent.yaml"),
                    "--config", str(CONFIG_DIR / "agent-dns.yaml")]
            proc = Proc(f"agent-{i}", argv, env, logs / f"agent-{i}.log", f"http://{lo}:{health}/")
            self.agents.append(Member(proc, f"{lo}:{grpc}", f"http://{lo}:{telemetry}/metrics", proc.health_url))
            stack_mod.spawn(proc, self.run_dir)
        for agent in self.agents:
            stack_mod.wait_healthy(agent.proc, self.startup_timeout)

    # -- the stand-in for readiness probes and DNS ---------------------------
    def _write_hosts(self, live: list[str]) -> None:
        with self._hosts_lock:
            if live == self._live and self.hosts_file.exists():
                return
            # Rewritten in place: the agents' bind mounts hold this inode.
            with open(self.hosts_file, "w") as fh:
                fh.write("127.0.0.1 localhost\n" + "".join(f"{address} {GATEWAY_NAME}\n" for address in live))
            self._live = live

    def _check_health(self) -> None:
        while not self._stop.wait(0.2):
            live = []
            for gateway in self.gateways:
                try:
                    if gateway.proc.running() and http_get(gateway.health_url, timeout=0.5)[0] == 200:
                        live.append(gateway.address)
                except OSError:
                    pass
            self._write_hosts(live)

    @property
    def live_gateways(self) -> list[str]:
        """The gateway addresses the hosts file lists now."""
        with self._hosts_lock:
            return list(self._live)

    # -- failures ------------------------------------------------------------
    def kill_gateway(self, index: int, sig: int = signal.SIGKILL) -> None:
        stack_mod.kill_proc(self.gateways[index].proc, sig)

    def restart_gateway(self, index: int) -> None:
        gateway = self.gateways[index]
        stack_mod.spawn(gateway.proc, self.run_dir)
        stack_mod.wait_healthy(gateway.proc, self.startup_timeout)

    def rank_env(self, rank: int, **extra: str) -> dict[str, str]:
        """Environment of simulated rank ``rank``, exporting to agent ``rank % agents``."""
        env = dict(stack_mod.clean_env(), OTEL_EXPORTER_OTLP_ENDPOINT=f"http://{self.agents[rank % len(self.agents)].otlp}",
                   OTEL_EXPORTER_OTLP_INSECURE="true", OTEL_TRAINING_EXPORTER="otlp", OTEL_TRAINING_RANK=str(rank))
        env.update(extra)
        return env
