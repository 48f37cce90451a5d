"""The native stack: the collector, Jaeger, Prometheus and Alertmanager on loopback, from
the same configuration files as docker-compose.yml, under one :class:`~otelstack.supervisor.Supervisor`.

Every port is a free loopback port, so parallel runs do not collide; each process keeps its
log in ``<run_dir>/logs/``, and the collector's sending queue (``collector-queue/``) and
Jaeger's Badger store (``jaeger-data/``) survive restarts on the same run dir.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import asdict
from pathlib import Path

from . import services
from ._base import LOOPBACK, StackError, default_run_dir
from .binaries import Binaries, ensure_binaries
from .polling import http_get, wait_until
from .ports import Ports
from .render import clean_env, collector_env, jaeger_env
from .supervisor import Component, Supervisor

#: Start order (stopped in reverse): the collector exports to Jaeger, Prometheus alerts through Alertmanager.
COMPONENTS = ("jaeger", "collector", "alertmanager", "prometheus")


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
        jaeger_binary: Path | None = None,
    ) -> None:
        self.run_dir = Path(run_dir or default_run_dir()).resolve()
        self.binaries = binaries
        #: The user's Jaeger (checked: otelstack.jaeger_binary), run instead of build.sh's; None: the
        #: variable's, else build.sh's.
        self.jaeger_binary = jaeger_binary
        #: Where Alertmanager sends pages; None: the stack's own receiver, writing them to ``notifications_file``
        #: (the shipped configuration's default, a webhook on the Docker host, resolves only in docker-compose).
        self.webhook_url = webhook_url or os.environ.get("OTEL_TRAINING_WEBHOOK_URL") or None
        self.fast = fast
        self.scrape_interval = scrape_interval or ("1s" if fast else "15s")
        self.evaluation_interval = evaluation_interval or ("1s" if fast else "15s")
        self.spanmetrics_flush_interval = spanmetrics_flush_interval or ("1s" if fast else "15s")
        self.rule_for_override = rule_for_override
        self.rule_replacements = rule_replacements
        self.startup_timeout = startup_timeout
        self.log_level = log_level
        self.ports: Ports | None = None
        self.supervisor = self._new_supervisor()

    def _new_supervisor(self) -> Supervisor:
        return Supervisor(self.run_dir, startup_timeout=self.startup_timeout, state_file=self.run_dir / "stack.json")

    @property
    def procs(self) -> dict[str, Component]:
        """The components by name, in start order."""
        return self.supervisor.components

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
    def notifications_file(self) -> Path | None:
        """Alertmanager's notifications, one JSON object a line, when the stack's own receiver takes them."""
        return self.run_dir / "webhook" / "notifications.jsonl" if self.webhook_url is None else None

    @property
    def alertmanager_webhook(self) -> str:
        """The URL Alertmanager sends pages to."""
        return self.webhook_url or f"http://{LOOPBACK}:{self._p().webhook}/otel-training/alerts"

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
            "alertmanager_webhook": self.alertmanager_webhook,
            **({"notifications_file": str(self.notifications_file)} if self.notifications_file else {}),
        }

    # -- lifecycle ------------------------------------------------------------
    def __enter__(self) -> Stack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _prepare(self) -> None:
        """Fresh ports and the four components declared on them (rendered, not started)."""
        if self.binaries is None:
            raise StackError("binaries not resolved (start() finds them)")
        b, p, lo = self.binaries, Ports.allocate(), LOOPBACK
        self.ports = p
        base_env = clean_env()
        jaeger = services.jaeger(b.jaeger, self.log_dir, jaeger_env(
            base_env, otlp_grpc=f"{lo}:{p.jaeger_otlp_grpc}", otlp_http=f"{lo}:{p.jaeger_otlp_http}",
            query_http=f"{lo}:{p.jaeger_query_http}", query_grpc=f"{lo}:{p.jaeger_query_grpc}",
            health=f"{lo}:{p.jaeger_health}", metrics_port=p.jaeger_metrics, data_dir=self.jaeger_data_dir,
            log_level=self.log_level,
        ))
        collector = services.collector(b.otelcol, self.log_dir, collector_env(
            base_env, otlp_grpc=f"{lo}:{p.otlp_grpc}", otlp_http=f"{lo}:{p.otlp_http}",
            health=f"{lo}:{p.collector_health}", prometheus=f"{lo}:{p.collector_prometheus}",
            telemetry_port=p.collector_telemetry, jaeger_otlp=f"{lo}:{p.jaeger_otlp_grpc}",
            alerts_file=self.alerts_file, queue_dir=self.collector_queue_dir, log_level=self.log_level,
            OTELCOL_SPANMETRICS_FLUSH_INTERVAL=self.spanmetrics_flush_interval,
        ))
        receiver = [services.webhook(self.run_dir, p, base_env)] if self.webhook_url is None else []
        alertmanager = services.alertmanager(b.alertmanager, self.run_dir, p, base_env,
                                             webhook_url=self.alertmanager_webhook, fast=self.fast)
        prometheus = services.prometheus(
            b.prometheus, self.run_dir, p, base_env, scrape_interval=self.scrape_interval,
            evaluation_interval=self.evaluation_interval, rule_for_override=self.rule_for_override,
            rule_replacements=self.rule_replacements,
        )
        self.supervisor = self._new_supervisor()
        self.supervisor.add(jaeger, collector, *receiver, alertmanager, prometheus)
        assert tuple(name for name in self.supervisor.components if name != "webhook") == COMPONENTS

    def start(self, attempts: int = 3) -> Stack:
        """Start all four processes and wait until each is healthy.

        A port taken between choosing it and binding it (another run) makes a
        process exit; the whole start is then retried on fresh ports.
        """
        if self.binaries is None:
            self.binaries = ensure_binaries(self.log_dir / "build.log", jaeger=self.jaeger_binary)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir.chmod(0o700)  # traces, alerts with stacks, pages: the owner's alone, as the trace files are
        for attempt in range(1, attempts + 1):
            self._prepare()
            try:
                self.supervisor.start()
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
            prom = self.supervisor["prometheus"]
            raise StackError(f"{exc}; log {prom.log}:\n{prom.log_tail()}") from None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM every process group we started, SIGKILL what is left after ``timeout``."""
        self.supervisor.stop(timeout)

    # -- single components (for failure tests) ------------------------------
    def kill(self, name: str, sig: int = signal.SIGKILL, timeout: float = 10.0) -> None:
        """Send ``sig`` to one component's process group and wait for it to exit."""
        self.supervisor.kill(name, sig, timeout)

    def restart(self, name: str) -> None:
        """(Re)start one component on its same ports and wait until it is healthy."""
        self.supervisor.restart(name)

    # -- state for the CLI ---------------------------------------------------
    def save_state(self) -> None:
        self.supervisor.save_state(run_dir=str(self.run_dir), ports=asdict(self._p()), endpoints=self.endpoints())

    def status(self) -> dict[str, dict[str, object]]:
        return self.supervisor.status()

    @classmethod
    def from_state(cls, run_dir: Path | str) -> Stack:
        """The stack recorded in ``run_dir`` by another process (its pids, never a reused one)."""
        s = cls(run_dir)
        s.supervisor = Supervisor.from_state(s.run_dir / "stack.json", s.run_dir)
        s.ports = Ports(**s.supervisor.meta["ports"])  # type: ignore[arg-type]
        return s
