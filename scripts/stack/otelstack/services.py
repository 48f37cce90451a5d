"""The stack's four services as declared components: which binary with which arguments,
the environment or rendered files that configure it, its data directories, and the URL
that says it is up. The native stack and the agent/gateway topology both build from these."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from ._base import CONFIG_DIR, LOOPBACK
from .ports import Ports
from .render import render_alertmanager, render_prometheus, render_rules
from .supervisor import Component


def jaeger(binary: Path, log_dir: Path, env: dict[str, str], *, name: str = "jaeger",
           config: str = "jaeger.yaml") -> Component:
    """Jaeger v2 on collector-config/jaeger.yaml (Badger), configured by ``env`` (from
    :func:`~otelstack.render.jaeger_env`), or on ``config`` jaeger-opensearch.yaml (from
    :func:`~otelstack.render.jaeger_opensearch_env`): stateless, no directory of its own."""
    badger = env.get("JAEGER_BADGER_DIRECTORY")
    return Component(
        name,
        [str(binary), "--config", str(CONFIG_DIR / config)],
        env,
        log_dir / f"{name}.log",
        f"http://{env['JAEGER_QUERY_HTTP_ENDPOINT']}/api/services",
        data_dirs=(Path(badger),) if badger else (),
    )


def collector(binary: Path, log_dir: Path, env: dict[str, str], *, name: str = "collector",
              configs: Sequence[str] = ("otel-collector.yaml",), args: Sequence[str] = (),
              wrapper: Sequence[str] = ()) -> Component:
    """The collector on ``configs`` (files of collector-config/, merged in order), configured by ``env``
    (from :func:`~otelstack.render.collector_env`); ``wrapper`` runs it inside another command."""
    flags = [arg for config in configs for arg in ("--config", str(CONFIG_DIR / config))]
    alerts = env.get("OTELCOL_ALERTS_FILE")
    return Component(
        name,
        [*wrapper, str(binary), *flags, *args],
        env,
        log_dir / f"{name}.log",
        f"http://{env['OTELCOL_HEALTH_ENDPOINT']}/",
        data_dirs=(Path(env["OTELCOL_FILE_STORAGE_DIR"]), *([Path(alerts).parent] if alerts else [])),
    )


def prometheus(binary: Path, run_dir: Path, ports: Ports, base_env: dict[str, str], *, scrape_interval: str,
               evaluation_interval: str, rule_for_override: str | None = None,
               rule_replacements: dict[str, str] | None = None) -> Component:
    """Prometheus on collector-config/prometheus.yml and alert-rules.yml, rendered into ``run_dir/config``."""
    cfg, data = run_dir / "config", run_dir / "prometheus-data"
    rules = cfg / "alert-rules.yml"
    return Component(
        "prometheus",
        [
            str(binary),
            f"--config.file={cfg / 'prometheus.yml'}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address={LOOPBACK}:{ports.prometheus}",
            "--storage.tsdb.retention.time=1d",
        ],
        base_env,
        run_dir / "logs" / "prometheus.log",
        f"http://{LOOPBACK}:{ports.prometheus}/-/ready",
        configs={
            rules: render_rules(for_override=rule_for_override, replacements=rule_replacements),
            cfg / "prometheus.yml": render_prometheus(ports, rules, scrape_interval=scrape_interval,
                                                      evaluation_interval=evaluation_interval),
        },
        data_dirs=(data,),
    )


def webhook(run_dir: Path, ports: Ports, base_env: dict[str, str]) -> Component:
    """The stack's own Alertmanager webhook receiver (``webhook.py``): notifications to a file, one a line."""
    out = run_dir / "webhook" / "notifications.jsonl"
    return Component(
        "webhook",
        [sys.executable, str(Path(__file__).with_name("webhook.py")), "--host", LOOPBACK, "--port",
         str(ports.webhook), "--out", str(out)],
        base_env,
        run_dir / "logs" / "webhook.log",
        f"http://{LOOPBACK}:{ports.webhook}/-/ready",
        data_dirs=(out.parent,),
    )


def alertmanager(binary: Path, run_dir: Path, ports: Ports, base_env: dict[str, str], *, webhook_url: str,
                 fast: bool) -> Component:
    """Alertmanager on collector-config/alertmanager.yml, sending to ``webhook_url``; single instance."""
    cfg, data = run_dir / "config", run_dir / "alertmanager-data"
    return Component(
        "alertmanager",
        [
            str(binary),
            f"--config.file={cfg / 'alertmanager.yml'}",
            f"--storage.path={data}",
            f"--web.listen-address={LOOPBACK}:{ports.alertmanager}",
            "--cluster.listen-address=",  # no gossip port: single instance
        ],
        base_env,
        run_dir / "logs" / "alertmanager.log",
        f"http://{LOOPBACK}:{ports.alertmanager}/-/ready",
        configs={cfg / "alertmanager.yml": render_alertmanager(webhook_url, fast=fast)},
        data_dirs=(data,),
    )
