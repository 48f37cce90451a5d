"""``otel-training spool send``: deliver what a collector outage left in the spool.

Run it once the collector is back, after the job (or for the files of
processes that have ended): a file still being written by a live process on
this host is left alone, since renaming it away would lose what it writes next.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

_FILE = re.compile(r"^spool-r\d+-(\d+)\.jsonl$")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("spool", help="send spooled spans (spool_dir) to a collector")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    send = actions.add_parser("send", help="post each spool file to a collector's OTLP/HTTP endpoint")
    send.add_argument("spool_dir", type=Path, help="the spool_dir the job used")
    send.add_argument("--endpoint", required=True,
                      help="the collector's OTLP/HTTP base URL, e.g. http://collector:4318 (/v1/traces is added)")
    send.add_argument("--timeout", type=float, default=10.0, help="seconds per request (default 10)")
    send.set_defaults(handler=run_send)


def _alive_here(pid: int) -> bool:
    from otel_training._pids import pid_running

    return pid != os.getpid() and pid_running(pid)


def run_send(args: argparse.Namespace) -> int:
    from otel_training.exporters.spool import send

    if not args.spool_dir.is_dir():
        print(f"otel-training spool send: {args.spool_dir}: not a directory", file=sys.stderr)
        return 2
    endpoint = args.endpoint.rstrip("/")
    if not endpoint.startswith(("http://", "https://")):
        print(f"otel-training spool send: --endpoint {args.endpoint!r}: expected an http:// or https:// URL",
              file=sys.stderr)
        return 2
    url = endpoint if endpoint.endswith("/v1/traces") else endpoint + "/v1/traces"
    failed = False
    for path in sorted(args.spool_dir.iterdir()):
        match = _FILE.match(path.name)
        if match is None:
            continue
        if _alive_here(int(match.group(1))):
            print(f"{path}: skipped, its process ({match.group(1)}) is still running")
            continue
        result = send(path, url, timeout_s=args.timeout)
        line = f"{path}: sent {result.lines_sent} of {result.lines_total} batch(es)"
        if result.refused:
            line += f"; refused as malformed (skipped): line(s) {', '.join(map(str, result.refused))}"
        print(line)
        if result.error:
            print(f"otel-training spool send: {result.error} (run again to resume)", file=sys.stderr)
            failed = True
    return 1 if failed else 0
