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

This module needs only the core package: the ``opentelemetry-instrumentation``
distro and configurator live in ``.distro`` (the ``[torch]`` extra), reached
through this module's attributes for the entry points, and torch is
instrumented only when it is imported and the extra is installed.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

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


def instrument_torch() -> None:
    """Instrument torch when the program imports it (not before: programs without torch pay nothing).

    Without torch, or without the ``[torch]`` extra (wrapt, opentelemetry-instrumentation),
    this does nothing.
    """
    if importlib.util.find_spec("torch") is None:
        return
    try:
        import wrapt
    except ImportError:
        _extra_missing("wrapt")
        return
    wrapt.register_post_import_hook(lambda module: _instrument_imported_torch(), "torch")


def _instrument_imported_torch() -> None:
    try:
        from otel_training.integrations.torch import TorchInstrumentor
    except ImportError as error:
        _extra_missing(error.name or str(error))
        return
    try:
        TorchInstrumentor().instrument()
    except Exception as error:  # noqa: BLE001 - never break `import torch`
        logger.error("otel_training: torch is not instrumented: %s", error)


def _extra_missing(name: str) -> None:
    logger.warning("otel_training: torch is not instrumented (%s is missing; pip install 'otel-training[torch]')",
                   name)


def auto_instrument() -> Any:
    """Configure from the environment and instrument torch (when it is imported); never raises.

    Returns the ``Telemetry`` handle, or None when this process is not instrumented.
    """
    try:
        if not claim():
            return None
        from otel_training.config.telemetry import configure

        telemetry = configure()
    except Exception as error:  # noqa: BLE001 - never break the program being launched
        logger.error("otel_training: auto-instrumentation failed, the program runs uninstrumented: %s", error)
        return None
    try:
        instrument_torch()
    except Exception as error:  # noqa: BLE001
        logger.error("otel_training: torch is not instrumented: %s", error)
    return telemetry


def __getattr__(name: str) -> Any:
    # The entry points name these here; they need opentelemetry-instrumentation.
    if name in ("OtelTrainingDistro", "OtelTrainingConfigurator"):
        from otel_training.integrations.auto import distro

        return getattr(distro, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ENV_OWNER",
    "OtelTrainingConfigurator",
    "OtelTrainingDistro",
    "auto_instrument",
    "is_launcher",
    "should_instrument",
]
