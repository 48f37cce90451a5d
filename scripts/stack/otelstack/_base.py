"""Where the stack's files are, the address everything listens on, and its one error type."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
#: The shipped configurations (the same files docker-compose.yml mounts).
CONFIG_DIR = REPO / "collector-config"
#: Every process of the native stack listens here only (docs/security.md).
LOOPBACK = "127.0.0.1"


class StackError(RuntimeError):
    """The stack could not be built, started or checked."""


def cache_dir() -> Path:
    return Path(os.environ.get("OTEL_TRAINING_CACHE") or Path.home() / ".cache" / "otel-training")


def default_run_dir() -> Path:
    return cache_dir() / "stack"
