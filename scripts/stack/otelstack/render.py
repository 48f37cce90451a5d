"""The shipped configurations, rendered for one native run: only addresses, paths and
intervals change, each by an exact text replacement that fails loudly when the shipped
file no longer has it. The collector and Jaeger read theirs from the environment."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ._base import CONFIG_DIR, LOOPBACK, StackError
from .ports import Ports

#: The webhook URL written in collector-config/alertmanager.yml, replaced on render.
DEFAULT_WEBHOOK_URL = "http://host.docker.internal:5001/otel-training/alerts"


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


def jaeger_opensearch_env(base_env: dict[str, str], *, otlp_grpc: str, otlp_http: str, query_http: str,
                          query_grpc: str, health: str, metrics_port: int, urls: list[str], password_file: Path,
                          index_prefix: str, shards: int, replicas: int, log_level: str,
                          ca_file: str = "") -> dict[str, str]:
    """Jaeger's environment for collector-config/jaeger-opensearch.yaml: the listeners of :func:`jaeger_env`
    and the cluster's node URLs, credentials, index prefix, shards and replicas of each daily span index.
    ``ca_file`` "": the system's CAs (unused by ``http://`` URLs: a cluster on loopback without TLS)."""
    env = jaeger_env(base_env, otlp_grpc=otlp_grpc, otlp_http=otlp_http, query_http=query_http, query_grpc=query_grpc,
                     health=health, metrics_port=metrics_port, data_dir=Path("/nonexistent"), log_level=log_level)
    del env["JAEGER_BADGER_DIRECTORY"]
    env.update(JAEGER_OPENSEARCH_URLS="[" + ",".join(urls) + "]", JAEGER_OPENSEARCH_USER="jaeger",
               JAEGER_OPENSEARCH_PASSWORD_FILE=str(password_file), JAEGER_OPENSEARCH_CA_FILE=ca_file,
               JAEGER_INDEX_PREFIX=index_prefix, JAEGER_SPAN_SHARDS=str(shards), JAEGER_SPAN_REPLICAS=str(replicas))
    return env


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
