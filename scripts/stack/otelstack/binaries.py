"""The four binaries: the collector and Jaeger built once by build.sh into the cache
(``~/.cache/otel-training/bin``, or ``OTEL_TRAINING_OTELCOL_BIN`` for the collector),
Prometheus and Alertmanager from Debian's packages. A Jaeger of the user's own
(``--jaeger-binary``/``OTEL_TRAINING_JAEGER_BIN``, :mod:`~otelstack.jaeger_binary`) replaces the
built one, checked first; build.sh then builds the collector only."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import jaeger_binary
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


def _built_paths(jaeger: Path | None = None) -> tuple[Path, Path]:
    """The collector and Jaeger to run: the environment's collector, else build.sh's; ``jaeger`` (the
    user's, checked) or the variable's (checked here: :class:`~otelstack.jaeger_binary.BadJaegerBinary`),
    else build.sh's."""
    paths = cached_binary_paths()
    if jaeger is None:
        users = jaeger_binary.resolve()
        jaeger = users.path if users is not None else Path(paths["JAEGER_BIN"])
    return Path(os.environ.get("OTEL_TRAINING_OTELCOL_BIN") or paths["OTELCOL_BIN"]), jaeger


def _which_alertmanager() -> str | None:
    return shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


def missing_prerequisites(jaeger: Path | None = None) -> list[str]:
    """What is missing to build and run the stack, as human-readable reasons (``jaeger``: the user's)."""
    missing = []
    otelcol, jaeger = _built_paths(jaeger)
    if not (otelcol.is_file() and jaeger.is_file()) and shutil.which("go") is None:
        missing.append("Go toolchain (needed once to build the collector and Jaeger: scripts/stack/build.sh)")
    if shutil.which("prometheus") is None:
        missing.append("prometheus (Debian package 'prometheus': scripts/stack/install-deps.sh)")
    if _which_alertmanager() is None:
        missing.append("alertmanager (Debian package 'prometheus-alertmanager': scripts/stack/install-deps.sh)")
    return missing


def ensure_binaries(log: Path | None = None, *, jaeger: Path | None = None) -> Binaries:
    """Build (or reuse from the cache) the collector and Jaeger; find Prometheus and Alertmanager.

    ``jaeger``: the user's Jaeger (checked by :func:`~otelstack.jaeger_binary.check`), run instead of
    build.sh's; without it ``OTEL_TRAINING_JAEGER_BIN`` is checked and used when set."""
    users_jaeger = jaeger is not None or jaeger_binary.requested(None) is not None
    otelcol, jaeger = _built_paths(jaeger)
    if not (otelcol.is_file() and jaeger.is_file()):
        target = "collector" if users_jaeger else "all"
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "ab") as fh:
                proc = subprocess.run(["bash", str(BUILD_SH), target], stdout=fh, stderr=subprocess.STDOUT)
        else:
            proc = subprocess.run(["bash", str(BUILD_SH), target])
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
