"""Where a pipeline's output goes: the default exporter, and a trace or spool directory checked before training."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from otel_training._files import DIR_MODE
from otel_training.config.parsers import ConfigError


def check_output_dir(output_dir: str, option: str = "output_dir", what: str = "trace") -> None:
    """Fail before training, not at the first export, when the trace (or spool) directory is unusable."""
    path = Path(output_dir)
    named = f"option {option}={output_dir!r} (OTEL_TRAINING_{option.upper()})"
    try:
        path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"{named}: cannot create the {what} directory: {error.strerror or error}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{named}: the {what} directory is not writable")



def default_exporter(environ: Mapping[str, str]) -> str:
    """``otlp`` when a collector endpoint is configured, else the embedded ``file``."""
    if environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return "otlp"
    return "file"
