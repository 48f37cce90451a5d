"""Helpers for the end-to-end tests: a webhook receiver and query clients for
Jaeger, Prometheus, the collector's metrics endpoint and the alerts file sink.

Everything waits on conditions with deadlines; nothing sleeps and hopes.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from otelstack import http_get, wait_until  # scripts/stack/otelstack/

__all__ = [
    "WebhookReceiver",
    "jaeger_traces",
    "prometheus_alerts",
    "read_alert_sink",
    "scrape_samples",
    "wait_until",
]


class WebhookReceiver:
    """A tiny HTTP server on loopback that records every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.payloads: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                try:
                    payload = json.loads(body)
                except ValueError:
                    payload = {"_unparsable": body.decode(errors="replace")}
                payload["_path"] = self.path
                with receiver._cond:
                    receiver.payloads.append(payload)
                    receiver._cond.notify_all()
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="alert-webhook", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/otel-training/alerts"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def wait_for_alert(self, predicate: Callable[[dict[str, Any], dict[str, Any]], bool], timeout: float) -> tuple[dict, dict]:
        """Wait until an alert in a received payload satisfies ``predicate(payload, alert)``."""
        with self._cond:
            def find():
                for payload in self.payloads:
                    for alert in payload.get("alerts", []):
                        if predicate(payload, alert):
                            return payload, alert
                return None

            found = self._cond.wait_for(find, timeout=timeout)
            if not found:
                raise TimeoutError(f"no matching alert reached the webhook within {timeout:.0f}s; received: {json.dumps(self.payloads)[:2000]}")
            return found


def jaeger_traces(jaeger_url: str, service: str, tags: dict[str, str] | None = None, lookback: str = "1h") -> list[dict]:
    """GET /api/traces (Jaeger's query API); raises on a non-200 answer."""
    params = {"service": service, "lookback": lookback, "limit": "100"}
    if tags:
        params["tags"] = json.dumps(tags)
    status, body = http_get(f"{jaeger_url}/api/traces?{urllib.parse.urlencode(params)}")
    if status != 200:
        raise RuntimeError(f"Jaeger /api/traces answered {status}: {body[:300]!r}")
    return json.loads(body).get("data") or []


def span_tags(span_or_process: dict) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in span_or_process.get("tags", [])}


def prometheus_alerts(prometheus_url: str) -> list[dict]:
    status, body = http_get(f"{prometheus_url}/api/v1/alerts")
    if status != 200:
        raise RuntimeError(f"Prometheus /api/v1/alerts answered {status}")
    return json.loads(body)["data"]["alerts"]


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape_samples(metrics_url: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Samples of metric ``name`` in a Prometheus text exposition."""
    status, body = http_get(metrics_url)
    if status != 200:
        raise RuntimeError(f"{metrics_url} answered {status}")
    out = []
    for line in body.decode().splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) == name:
            labels = dict(_LABEL.findall(m.group(2) or ""))
            out.append((labels, float(m.group(3))))
    return out


def read_alert_sink(path: Path) -> list[dict[str, Any]]:
    """Spans in the collector's file exporter output (OTLP/JSON, one request per line).

    Each span is returned flattened: name, attributes and resource attributes
    as plain dicts.
    """
    if not path.exists():
        return []
    spans = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        req = json.loads(line)
        for rs in req.get("resourceSpans", []):
            res = _attrs(rs.get("resource", {}).get("attributes", []))
            for ss in rs.get("scopeSpans", []):
                for sp in ss.get("spans", []):
                    spans.append({
                        "name": sp["name"],
                        "traceId": sp.get("traceId"),
                        "spanId": sp.get("spanId"),
                        "attributes": _attrs(sp.get("attributes", [])),
                        "resource": res,
                    })
    return spans


def _attrs(kvs: list[dict]) -> dict[str, Any]:
    out = {}
    for kv in kvs:
        v = kv.get("value", {})
        (typ, val), = v.items() if v else (("", None),)
        if typ == "intValue":
            val = int(val)
        out[kv["key"]] = val
    return out
