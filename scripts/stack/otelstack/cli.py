"""Run the otel-training observability stack natively, on loopback, without Docker:
the collector and Jaeger built by ``scripts/stack/build.sh``, Prometheus and Alertmanager
from Debian's packages, each from the same configuration files as docker-compose.yml
(``collector-config/``), on free loopback ports, with its log in ``<run_dir>/logs/``::

    python scripts/stack/stack.py up [--run-dir DIR] [--fast] [--webhook-url URL] [--jaeger-binary PATH]
    python scripts/stack/stack.py status [--run-dir DIR]
    python scripts/stack/stack.py down [--run-dir DIR]
    python scripts/stack/stack.py build
    python scripts/stack/stack.py build-opensearch   (OpenSearch's home from Maven, for jaeger-opensearch.yaml)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path

from . import opensearch_home
from ._base import StackError, default_run_dir
from .binaries import cached_binary_paths, ensure_binaries, missing_prerequisites
from .jaeger_binary import JAEGER_BINARY_ENV, BadJaegerBinary, JaegerBinary, resolve, serves_ui
from .native import Stack

#: The command that runs this CLI, as the docs spell it.
SCRIPT = "scripts/stack/stack.py"


def _print_jaeger(s: Stack, users: JaegerBinary | None) -> None:
    """Where Jaeger's page is: the UI when the running binary has it (a release binary), else the query API
    only (build.sh's, built from Go modules, has no UI assets) and how to get a page."""
    binary = s.procs["jaeger"].argv[0] if "jaeger" in s.procs else "?"
    if serves_ui(s.jaeger_url):
        print(f"\n# jaeger ({binary}) serves its UI at {s.jaeger_url} (and its query API)")
        return
    print(f"\n# jaeger serves its query API at {s.jaeger_url}, not the UI (a build from Go modules has no UI "
          f"assets); for a page: otel-training report --jaeger {s.jaeger_url} --service NAME (HTML), or "
          "--chrome FILE for Perfetto; the Docker compose stack runs the official image, UI included")
    if users is not None:
        print(f"# {users.describe()}, the Jaeger you named, has no UI assets either (a build from source?)")
    else:
        print(f"# for the UI here, run a Jaeger v2 release binary you have: up --jaeger-binary PATH "
              f"(or {JAEGER_BINARY_ENV}=PATH in front of the command)")


def _print_endpoints(s: Stack, users: JaegerBinary | None = None) -> None:
    print(json.dumps(s.endpoints(), indent=2))
    _print_jaeger(s, users)
    if s.notifications_file is not None:
        print(f"\n# pages: Alertmanager sends them to the stack's own receiver, which writes them to "
              f"{s.notifications_file} (one JSON notification a line); --webhook-url URL sends them to your "
              "pager or chat bridge instead")
    else:
        print(f"\n# pages: Alertmanager sends them to {s.alertmanager_webhook}")
    print("\n# export to this stack from a training process:")
    for k, v in s.client_env().items():
        print(f"export {k}={v}")


def _build_opensearch() -> int:
    """The cached OpenSearch home (built when missing): its path; exit code 2 when java or mvn is missing."""
    home = opensearch_home.home_path()
    missing = opensearch_home.missing_prerequisites()
    if missing:
        print(f"{SCRIPT} build-opensearch: missing " + "; ".join(missing), file=sys.stderr)
        return 2
    try:
        print(opensearch_home.ensure_home())
    except StackError as exc:
        print(f"{SCRIPT} build-opensearch: {exc}", file=sys.stderr)
        return 1
    return 0 if home.is_dir() else 1


def main(argv: Iterable[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["up", "down", "status", "build", "build-opensearch"])
    ap.add_argument("--run-dir", type=Path, default=default_run_dir(), help="state, rendered configs, logs, data (default: %(default)s)")
    ap.add_argument("--webhook-url", default=None, help="Alertmanager webhook receiver URL")
    ap.add_argument("--fast", action="store_true", help="1s scrape/evaluation/flush intervals and short Alertmanager waits (demos, tests)")
    ap.add_argument("--timeout", type=float, default=60.0, help="per-component startup deadline in seconds")
    ap.add_argument("--jaeger-binary", default=None, metavar="PATH",
                    help=f"up: run this Jaeger v2 binary (a release download, UI included) instead of the one built "
                         f"from Go modules (no UI); checked before anything starts (default: ${JAEGER_BINARY_ENV})")
    args = ap.parse_args(list(argv) if argv is not None else None)

    if args.command == "build-opensearch":
        return _build_opensearch()
    users: JaegerBinary | None = None
    if args.command in ("up", "build"):
        try:  # before anything runs: a wrong path is one line naming the option or variable, exit code 2
            users = resolve(args.jaeger_binary)
        except BadJaegerBinary as exc:
            print(f"{SCRIPT} {args.command}: {exc}", file=sys.stderr)
            return 2
    jaeger = users.path if users is not None else None

    if args.command == "build":
        ensure_binaries(jaeger=jaeger)
        print(json.dumps(cached_binary_paths(), indent=2))
        return 0
    if args.command == "up":
        if (args.run_dir / "stack.json").exists():
            existing = Stack.from_state(args.run_dir)
            if any(p.running() for p in existing.procs.values()):
                print(f"a stack is already running from {args.run_dir} (use 'down' first):", file=sys.stderr)
                _print_endpoints(existing)
                return 1
        missing = missing_prerequisites(jaeger)
        if missing:
            print("cannot start the stack, missing:\n  " + "\n  ".join(missing), file=sys.stderr)
            return 2
        s = Stack(args.run_dir, webhook_url=args.webhook_url, fast=args.fast, startup_timeout=args.timeout,
                  jaeger_binary=jaeger)
        try:
            s.start()
        except StackError as exc:
            print(f"stack failed to start: {exc}", file=sys.stderr)
            return 1
        print(f"stack is up; logs in {s.log_dir}; stop with: {sys.executable} {SCRIPT} down --run-dir {s.run_dir}")
        _print_endpoints(s, users)
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
