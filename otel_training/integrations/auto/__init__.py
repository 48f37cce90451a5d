"""Auto-instrumentation at interpreter start, for ``otel-training run`` and ``opentelemetry-instrument``.

Both put a ``sitecustomize`` first on ``PYTHONPATH`` and exec the program, so
every Python process of the job starts instrumented, including the workers a
launcher spawns. That is also the trap: the launcher itself (``torchrun``'s
elastic agent) and the helpers a trainer spawns (DataLoader workers started with
``spawn``, compile workers, sidecars) would each configure a pipeline with the
trainer's rank and write to its trace file. So a process is instrumented only
when it is not a known launcher and no ancestor was instrumented: the first
instrumented process of a tree marks the environment with its pid, and its
descendants see a mark that is not theirs.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.instrumentation.distro import BaseDistro
from opentelemetry.sdk._configuration import _BaseConfigurator

#: Pid of the process of this tree that auto-instrumentation instrumented.
ENV_OWNER = "OTEL_TRAINING__AUTO_OWNER"
#: Scripts and modules that launch trainers rather than train.
LAUNCHER_SCRIPTS = frozenset({"torchrun", "accelerate", "deepspeed"})
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")
#: Entry-point name of the TorchInstrumentor (``opentelemetry_instrumentor`` group).
INSTRUMENTOR_NAME = "torch"

logger = logging.getLogger("otel_training")

_decision: tuple[int, bool] | None = None


def is_launcher(argv: Sequence[str]) -> bool:
    """True for ``torchrun ...``, ``python -m torch.distributed.run ...`` and the like.

    ``argv`` is the interpreter's original command line (``sys.orig_argv``):
    at start-up ``sys.argv`` does not yet name the script.
    """
    args = list(argv[1:])
    for index, arg in enumerate(args):
        if arg == "-m":
            return index + 1 < len(args) and args[index + 1] in LAUNCHER_MODULES
        if arg == "-c":
            return False
        if not arg.startswith("-"):
            return os.path.basename(arg) in LAUNCHER_SCRIPTS
    return False


def should_instrument(environ: Mapping[str, str], argv: Sequence[str], pid: int) -> bool:
    owner = environ.get(ENV_OWNER)
    if owner and owner != str(pid):
        return False
    return not is_launcher(argv)


def claim() -> bool:
    """Decide once per process whether to instrument it, and mark the tree if so."""
    global _decision
    pid = os.getpid()
    if _decision is None or _decision[0] != pid:
        decided = should_instrument(os.environ, getattr(sys, "orig_argv", sys.argv), pid)
        if decided:
            os.environ[ENV_OWNER] = str(pid)
        _decision = (pid, decided)
    return _decision[1]


def auto_instrument() -> Any:
    """Configure from the environment and instrument torch (when it is imported); never raises.

    Returns the ``Telemetry`` handle, or None when this process is not instrumented.
    """
    try:
        if not claim():
            return None
        from otel_training.config.telemetry import configure
        from otel_training.integrations.torch import TorchInstrumentor

        telemetry = configure()
        TorchInstrumentor().instrument()
        return telemetry
    except Exception as error:  # noqa: BLE001 - never break the program being launched
        logger.error("otel_training: auto-instrumentation failed, the program runs uninstrumented: %s", error)
        return None


class OtelTrainingDistro(BaseDistro):  # type: ignore[misc]
    """The ``opentelemetry_distro`` entry point: selects our configurator, skips launchers."""

    def _configure(self, **kwargs: Any) -> None:
        os.environ.setdefault("OTEL_PYTHON_CONFIGURATOR", "otel_training")

    def load_instrumentor(self, entry_point: Any, **kwargs: Any) -> None:
        if entry_point.name == INSTRUMENTOR_NAME and not claim():
            return
        super().load_instrumentor(entry_point, **kwargs)


class OtelTrainingConfigurator(_BaseConfigurator):  # type: ignore[misc]
    """The ``opentelemetry_configurator`` entry point: ``configure()`` from the environment."""

    def _configure(self, **kwargs: Any) -> None:
        if claim():
            from otel_training.config.telemetry import configure

            configure()


__all__ = [
    "ENV_OWNER",
    "OtelTrainingConfigurator",
    "OtelTrainingDistro",
    "auto_instrument",
    "is_launcher",
    "should_instrument",
]
