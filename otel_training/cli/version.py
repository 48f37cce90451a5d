"""``otel-training version``."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("version", help="print the versions of otel-training and OpenTelemetry")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from importlib.metadata import PackageNotFoundError, version

    from otel_training import __version__

    print(f"otel-training {__version__}")
    for package in ("opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-grpc"):
        try:
            print(f"{package} {version(package)}")
        except PackageNotFoundError:
            print(f"{package} (not installed)")
    return 0
