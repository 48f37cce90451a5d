"""``otel-training``: the command line. Each subcommand lives in its own module
under ``otel_training.cli`` and exposes ``register(subparsers)``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: Subcommand modules, in the order ``--help`` lists them.
COMMANDS = ("demo", "report", "run", "spool", "version")


def build_parser() -> argparse.ArgumentParser:
    from otel_training._version import __version__

    parser = argparse.ArgumentParser(
        prog="otel-training",
        description="OpenTelemetry-native observability for ML training jobs.",
    )
    parser.add_argument("--version", action="version", version=f"otel-training {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"otel_training.cli.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # bare `otel-training`: what it can do, not an error
        parser.print_help()
        return 0
    from otel_training.config.options import ConfigError

    try:
        return int(args.handler(args) or 0)
    except ConfigError as error:
        print(f"otel-training: configuration error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
