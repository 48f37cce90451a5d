"""The native stack's own Alertmanager webhook receiver: where pages go when no --webhook-url is given.

Why: Alertmanager needs a receiver, and the shipped configuration's default (a webhook on the Docker host)
does not resolve outside docker-compose, so pages were dropped with only a line in Alertmanager's log. This
receiver keeps every notification Alertmanager sends, one JSON object a line, in a file only its owner reads
(the alerts carry job names and hosts), and says one line per notification in its log. Standard library
only: it runs on the interpreter that runs the stack.

    python webhook.py --port PORT --out FILE
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

PATH = "/otel-training/alerts"
#: Bodies larger than this are refused (Alertmanager's notifications are a few KiB).
MAX_BODY = 4 * 2**20


def summary(notification: dict) -> str:
    """One line for the log: status, and each alert's name with its job, rank and state."""
    alerts = notification.get("alerts") or []
    parts = []
    for alert in alerts[:10]:
        labels = alert.get("labels") or {}
        where = ", ".join(f"{key}={labels[key]}" for key in ("training_job_id", "training_rank") if key in labels)
        parts.append(f"{labels.get('alertname', '?')} [{alert.get('status', '?')}]" + (f" ({where})" if where else ""))
    more = f" and {len(alerts) - 10} more" if len(alerts) > 10 else ""
    return f"{notification.get('status', '?')}: " + "; ".join(parts) + more


def make_handler(out: Path, lock: threading.Lock) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._answer(200 if self.path == "/-/ready" else 404)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if self.path != PATH or not 0 < length <= MAX_BODY:
                self._answer(404 if self.path != PATH else 413)
                return
            try:
                notification = json.loads(self.rfile.read(length))
                if not isinstance(notification, dict):
                    raise ValueError("not a JSON object")
            except ValueError as error:
                print(f"webhook: refused a body that is not an Alertmanager notification: {error}", flush=True)
                self._answer(400)
                return
            line = json.dumps(notification, separators=(",", ":")) + "\n"
            with lock:
                descriptor = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(descriptor, line.encode())
                finally:
                    os.close(descriptor)
            print(f"webhook: {summary(notification)}", flush=True)
            self._answer(200)

        def _answer(self, status: int) -> None:
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
            pass  # one line per notification is enough

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Alertmanager webhook receiver writing notifications to a file")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(args.out, threading.Lock()))
    print(f"webhook: listening on http://{args.host}:{args.port}{PATH}, writing to {args.out}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
