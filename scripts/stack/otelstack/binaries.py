"""The four binaries: the collector and Jaeger built once by build.sh into the cache
(``~/.cache/otel-training/bin``, or ``OTEL_TRAINING_OTELCOL_BIN``/``OTEL_TRAINING_JAEGER_BIN``),
Prometheus and Alertmanager from Debian's packages."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ._base import REPO, StackError

BUILD_SH = REPO / "scripts" / "stack" / "build.sh"


@dataclass
class Binaries:
    otelcol: Path
    jaeger: Path
    prometheus: Path
    alertmanager: Path


def cached_binary_paths() -> dict[str, str]:
    """Paths build.sh uses for the collector and Jaeger (they may not exist yet)."""
    out = subprocess.run(["bash", str(BUILD_SH), "paths"], check=True, capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _built_paths() -> tuple[Path, Path]:
    """The collector and Jaeger to run: the environment's override, else build.sh's cache."""
    paths = cached_binary_paths()
    return (Path(os.environ.get("OTEL_TRAINING_OTELCOL_BIN") or paths["OTELCOL_BIN"]),
            Path(os.environ.get("OTEL_TRAINING_JAEGER_BIN") or paths["JAEGER_BIN"]))


def _which_alertmanager() -> str | None:
    return shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


def missing_prerequisites() -> list[str]:
    """What is missing to build and run the stack, as human-readable reasons."""
    missing = []
    otelcol, jaeger = _built_paths()
    if not (otelcol.is_file() and jaeger.is_file()) and shutil.which("go") is None:
        missing.append("Go toolchain (needed once to build the collector and Jaeger: scripts/stack/build.sh)")
    if shutil.which("prometheus") is None:
        missing.append("prometheus (Debian package 'prometheus': scripts/stack/install-deps.sh)")
    if _which_alertmanager() is None:
        missing.append("alertmanager (Debian package 'prometheus-alertmanager': scripts/stack/install-deps.sh)")
    return missing


def ensure_binaries(log: Path | None = None) -> Binaries:
    """Build (or reuse from the cache) the collector and Jaeger; find Prometheus and Alertmanager."""
    otelcol, jaeger = _built_paths()
    if not (otelcol.is_file() and jaeger.is_file()):
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "ab") as fh:
                proc = subprocess.run(["bash", str(BUILD_SH), "all"], stdout=fh, stderr=subprocess.STDOUT)
        else:
            proc = subprocess.run(["bash", str(BUILD_SH), "all"])
        if proc.returncode != 0:
            where = f"; see {log}" if log else ""
            raise StackError(f"scripts/stack/build.sh failed with exit code {proc.returncode}{where}")
    for p in (otelcol, jaeger):
        if not p.is_file():
            raise StackError(f"{p} is missing after scripts/stack/build.sh")
    prometheus = shutil.which("prometheus")
    alertmanager = _which_alertmanager()
    if prometheus is None or alertmanager is None:
        raise StackError("prometheus/alertmanager not installed: run scripts/stack/install-deps.sh")
    return Binaries(otelcol, jaeger, Path(prometheus), Path(alertmanager))
