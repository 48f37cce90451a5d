"""The agent/gateway topology of docs/pipeline.md, run natively on loopback:

    ranks --OTLP--> agents (agent.yaml + agent-dns.yaml) --load balancing by trace id-->
        gateways (gateway.yaml: tail sampling) --> Jaeger (jaeger.yaml, Badger;
        or jaeger-opensearch.yaml on an :class:`~otelstack.opensearch.OpenSearchCluster`)

* Gateways listen on their own loopback addresses (127.0.0.2, 127.0.0.3, ...) and one
  shared OTLP port, as pods behind a headless service do.
* The agents find them by DNS: each agent runs in a private mount namespace
  (``unshare --mount``) whose ``/etc/hosts`` is a file of this run, listing the name
  ``otel-gateway.topology`` once per live gateway. A health checker here (standing in
  for Kubernetes' readiness probes and endpoints) polls every gateway's health check
  and rewrites that file with the healthy ones; the agents' DNS resolver reads it every
  ``dns_interval`` (Go also caches the hosts file up to 5 s).
* Each process has its own free ports, logs and data under ``run_dir``.

Every process is a component of one :class:`~otelstack.supervisor.Supervisor`, declared by
:mod:`otelstack.services` like the native stack's. Requires ``unshare --mount`` (root, or
user namespaces); :func:`unshare_argv` says so. Stdlib only.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from . import services
from ._base import LOOPBACK, StackError
from .binaries import Binaries
from .opensearch import OpenSearchCluster
from .ports import free_ports, shared_port
from .render import clean_env, collector_env, jaeger_env, jaeger_opensearch_env
from .supervisor import Component, Supervisor

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


@dataclass
class Member:
    """One collector of the topology: its process and the endpoints a test reads."""

    proc: Component
    otlp: str  # host:port
    telemetry_url: str
    address: str = LOOPBACK
    extra: dict[str, str] = field(default_factory=dict)


class Topology:
    """Jaeger, ``gateways`` gateway collectors and ``agents`` agent collectors. A context manager."""

    def __init__(self, run_dir: Path | str, binaries: Binaries, *, agents: int = 2, gateways: int = 2,
                 sample_percent: float = 10, decision_wait: str = "60s", slow_step_ns: int = 10_000_000_000,
                 dns_interval: str = "1s", startup_timeout: float = 60.0, log_level: str = "info",
                 gateway_args: tuple[str, ...] = (), opensearch: OpenSearchCluster | None = None,
                 index_prefix: str = "otel-training", span_shards: int = 3, span_replicas: int = 1,
                 jaeger_env_extra: dict[str, str] | None = None) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.binaries = binaries
        self.n_agents, self.n_gateways = agents, gateways
        self.sample_percent, self.decision_wait, self.slow_step_ns = sample_percent, decision_wait, slow_step_ns
        self.dns_interval, self.startup_timeout, self.log_level = dns_interval, startup_timeout, log_level
        self.gateway_args = gateway_args
        #: Jaeger's store: this cluster (jaeger-opensearch.yaml, daily span indices of ``span_shards`` primaries
        #: and ``span_replicas`` replicas named ``<index_prefix>-jaeger-span-<day>``), else Badger (jaeger.yaml).
        self.opensearch = opensearch
        self.index_prefix, self.span_shards, self.span_replicas = index_prefix, span_shards, span_replicas
        #: More of Jaeger's variables (JAEGER_BULK_WORKERS, JAEGER_BULK_MAX_ACTIONS, ...).
        self.jaeger_env_extra = dict(jaeger_env_extra or {})
        self.hosts_file = self.run_dir / "hosts"
        self.jaeger: Member | None = None
        self.jaeger_url = ""
        self.gateways: list[Member] = []
        self.agents: list[Member] = []
        self._live: list[str] = []
        self._stop = threading.Event()
        self._checker: threading.Thread | None = None
        self._hosts_lock = threading.Lock()
        self.supervisor = Supervisor(self.run_dir, startup_timeout=startup_timeout)

    # -- lifecycle ------------------------------------------------------------
    def __enter__(self) -> Topology:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Topology:
        unshare = unshare_argv()
        if unshare is None:
            raise StackError("unshare --mount is not available here (the agents need a private /etc/hosts)")
        try:
            self._start(unshare)
        except BaseException:
            self.stop()
            raise
        return self

    def _procs(self) -> list[Component]:
        return list(self.supervisor.components.values())

    def stop(self) -> None:
        self._stop.set()
        if self._checker is not None:
            self._checker.join(timeout=5)
        self.supervisor.stop()

    def _start(self, unshare: list[str]) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        base, logs, lo, run = clean_env(), self.run_dir / "logs", LOOPBACK, self.run_dir
        ports = iter(free_ports(6 + 4 * (self.n_gateways + self.n_agents)))
        grpc, http, query, qgrpc, health, metrics = (next(ports) for _ in range(6))
        listeners = dict(otlp_grpc=f"{lo}:{grpc}", otlp_http=f"{lo}:{http}", query_http=f"{lo}:{query}",
                         query_grpc=f"{lo}:{qgrpc}", health=f"{lo}:{health}", metrics_port=metrics,
                         log_level=self.log_level)
        if self.opensearch is None:
            proc = services.jaeger(self.binaries.jaeger, logs, jaeger_env(base, data_dir=run / "jaeger-data", **listeners))
        else:
            password = run / "jaeger" / "opensearch-password"  # sent, and ignored by a cluster without security
            proc = services.jaeger(self.binaries.jaeger, logs, jaeger_opensearch_env(
                base, urls=self.opensearch.urls, password_file=password, index_prefix=self.index_prefix,
                shards=self.span_shards, replicas=self.span_replicas, **listeners), config="jaeger-opensearch.yaml")
            proc.configs[password] = "not-checked-without-the-security-plugin\n"
        proc.env.update(self.jaeger_env_extra)
        self.jaeger_url = f"http://{lo}:{query}"
        self.jaeger = Member(proc, f"{lo}:{grpc}", f"http://{lo}:{metrics}/metrics")
        self.supervisor.add(proc)
        self.supervisor.start([proc.name])

        addresses = [f"127.0.0.{2 + i}" for i in range(self.n_gateways)]
        otlp_port, http_port = shared_port(addresses), shared_port(addresses)
        for i, address in enumerate(addresses):
            health, prom, telemetry, _ = (next(ports) for _ in range(4))
            proc = services.collector(self.binaries.otelcol, logs, collector_env(
                base, otlp_grpc=f"{address}:{otlp_port}", otlp_http=f"{address}:{http_port}", health=f"{lo}:{health}",
                prometheus=f"{lo}:{prom}", telemetry_port=telemetry, jaeger_otlp=self.jaeger.otlp,
                alerts_file=run / f"gateway-{i}" / "alerts.jsonl", queue_dir=run / f"gateway-{i}" / "queue",
                log_level=self.log_level, OTEL_TRAINING_SAMPLE_PERCENT=str(self.sample_percent),
                OTEL_TRAINING_DECISION_WAIT=self.decision_wait, OTEL_TRAINING_SLOW_STEP_NS=str(self.slow_step_ns),
                OTELCOL_SPANMETRICS_FLUSH_INTERVAL="1s",
            ), name=f"gateway-{i}", configs=["gateway.yaml"], args=self.gateway_args)
            self.gateways.append(Member(proc, f"{address}:{otlp_port}", f"http://{lo}:{telemetry}/metrics", address,
                                        {"prometheus": f"http://{lo}:{prom}/metrics"}))
            self.supervisor.add(proc)
        self.supervisor.start([g.proc.name for g in self.gateways])
        self._write_hosts([g.address for g in self.gateways])
        self._checker = threading.Thread(target=self._check_health, name="topology-health", daemon=True)
        self._checker.start()

        # In each agent's own mount namespace, this run's hosts file is /etc/hosts.
        wrapper = [*unshare, "/bin/sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(self.hosts_file)]
        for i in range(self.n_agents):
            grpc, http, health, telemetry = (next(ports) for _ in range(4))
            proc = services.collector(self.binaries.otelcol, logs, collector_env(
                base, otlp_grpc=f"{lo}:{grpc}", otlp_http=f"{lo}:{http}", health=f"{lo}:{health}",
                telemetry_port=telemetry, queue_dir=run / f"agent-{i}" / "queue", log_level=self.log_level,
                OTEL_GATEWAY_DNS_NAME=GATEWAY_NAME, OTEL_GATEWAY_PORT=str(otlp_port),
                OTEL_GATEWAY_DNS_INTERVAL=self.dns_interval,
            ), name=f"agent-{i}", configs=["agent.yaml", "agent-dns.yaml"], wrapper=wrapper)
            self.agents.append(Member(proc, f"{lo}:{grpc}", f"http://{lo}:{telemetry}/metrics"))
            self.supervisor.add(proc)
        self.supervisor.start([a.proc.name for a in self.agents])

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
            self._write_hosts([g.address for g in self.gateways if g.proc.healthy(timeout=0.5)])

    @property
    def live_gateways(self) -> list[str]:
        """The gateway addresses the hosts file lists now."""
        with self._hosts_lock:
            return list(self._live)

    # -- failures ------------------------------------------------------------
    def kill_gateway(self, index: int, sig: int = signal.SIGKILL) -> None:
        self.supervisor.kill(self.gateways[index].proc.name, sig)

    def restart_gateway(self, index: int) -> None:
        self.supervisor.restart(self.gateways[index].proc.name)

    def rank_env(self, rank: int, **extra: str) -> dict[str, str]:
        """Environment of simulated rank ``rank``, exporting to agent ``rank % agents``."""
        env = dict(clean_env(), OTEL_EXPORTER_OTLP_ENDPOINT=f"http://{self.agents[rank % len(self.agents)].otlp}",
                   OTEL_EXPORTER_OTLP_INSECURE="true", OTEL_TRAINING_EXPORTER="otlp", OTEL_TRAINING_RANK=str(rank))
        env.update(extra)
        return env
