"""Auto-instrumentation at interpreter start, for ``otel-training run`` and ``opentelemetry-instrument``.

Both put a ``sitecustomize`` first on ``PYTHONPATH`` and exec the program, so
every Python process of the job starts with it: the program, the workers a
launcher or ``multiprocessing`` spawns, and the helpers nobody wants traced
(``torchrun``'s elastic agent, DataLoader workers started with ``spawn``,
compile workers, sidecars). Each process takes one of three roles:

- a *launcher* (``torchrun``, ``accelerate``...) is left alone;
- the *owner*, the first other process of the tree, is configured at start
  and marks the environment with its pid (and its ``training.job.id``);
- a *descendant* (its environment carries another pid) is instrumented but
  dormant: nothing is configured or recorded until it does training work
  (``init_process_group``, a backward pass, an optimizer step). Then it
  configures with its own rank (from ``init_process_group``'s arguments, the
  process group or the environment) and the owner's job id. Ranks started with
  ``torch.multiprocessing.spawn`` are traced that way; DataLoader workers,
  compile workers and sidecars never train, so they never configure.

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
import threading
from collections.abc import Mapping, Sequence
from typing import Any

#: Pid of the process of this tree that auto-instrumentation configured at start.
ENV_OWNER = "OTEL_TRAINING__AUTO_OWNER"
#: The owner's ``training.job.id``: descendants that train belong to its job.
ENV_JOB_ID = "OTEL_TRAINING__AUTO_JOB_ID"
#: Scripts and modules that launch trainers rather than train.
LAUNCHER_SCRIPTS = frozenset({"torchrun", "accelerate", "deepspeed"})
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")
#: Entry-point name of the TorchInstrumentor (``opentelemetry_instrumentor`` group).
INSTRUMENTOR_NAME = "torch"

#: The roles of a process (see the module docstring).
OWNER, DESCENDANT, LAUNCHER = "owner", "descendant", "launcher"

logger = logging.getLogger("otel_training")

_decision: tuple[int, str] | None = None
_claim_lock = threading.Lock()


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


def decide(environ: Mapping[str, str], argv: Sequence[str], pid: int) -> str:
    """The role of process ``pid``: ``OWNER``, ``DESCENDANT`` or ``LAUNCHER``."""
    if is_launcher(argv):
        return LAUNCHER
    owner = environ.get(ENV_OWNER)
    return DESCENDANT if owner and owner != str(pid) else OWNER


def role() -> str:
    """This process's role, decided once (a forked child decides again), and the tree marked by its owner."""
    global _decision
    pid = os.getpid()
    if _decision is None or _decision[0] != pid:
        decided = decide(os.environ, getattr(sys, "orig_argv", sys.argv), pid)
        if decided == OWNER:
            os.environ[ENV_OWNER] = str(pid)
        _decision = (pid, decided)
    return _decision[1]


def configure_owner() -> Any:
    """``configure()`` from the environment, and hand the job id down to descendants."""
    from otel_training import semconv as sc
    from otel_training.assembly.configure import configure

    telemetry = configure()
    job_id = telemetry.resource.attributes.get(sc.TRAINING_JOB_ID)
    if job_id:
        os.environ[ENV_JOB_ID] = str(job_id)
    return telemetry


def claim_training_process(rank: int | None = None, world_size: int | None = None) -> bool:
    """Configure a descendant that began training; the torch instrumentor calls it once.

    ``rank``/``world_size`` come from ``init_process_group``'s arguments; when
    unknown, from the initialized process group, else the environment (RANK...)
    as ``configure()`` reads it. A process configured meanwhile (by its own
    code) keeps its pipeline. Returns True when the process is to be traced.
    """
    from otel_training import semconv as sc
    from otel_training.assembly.configure import configure, get_telemetry
    from otel_training.config.resource import detect_training_identity

    with _claim_lock:
        if get_telemetry() is not None:
            return True
        if rank is None:
            rank, world_size = _process_group_rank()
        options: dict[str, Any] = {}
        if rank is not None and rank >= 0:
            options["rank"] = rank
        if world_size is not None and world_size > 0:
            options["world_size"] = world_size
        job_id = os.environ.get(ENV_JOB_ID)
        if job_id and sc.TRAINING_JOB_ID not in detect_training_identity(os.environ):
            options["job_id"] = job_id
        configure(**options)
        return True


def _process_group_rank() -> tuple[int | None, int | None]:
    torch = sys.modules.get("torch")
    try:
        dist = torch.distributed if torch is not None else None
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # noqa: BLE001 - a torch.distributed that cannot say: the environment gives the rank
        pass
    return None, None


def instrument_torch(deferred: bool) -> None:
    """Instrument torch when the program imports it (not before: programs without torch pay nothing).

    ``deferred``: the process is a descendant, instrumented dormant until it trains.
    Without torch, or without the ``[torch]`` extra (wrapt, opentelemetry-instrumentation),
    this does nothing.
    """
    if importlib.util.find_spec("torch") is None:
        return
    try:
        import wrapt
    except ImportError:
        _extra_missing(deferred, "wrapt")
        return
    wrapt.register_post_import_hook(lambda module: _instrument_imported_torch(deferred), "torch")


def _instrument_imported_torch(deferred: bool) -> None:
    try:
        from otel_training.integrations.torch import TorchInstrumentor
    except ImportError as error:
        _extra_missing(deferred, error.name or str(error))
        return
    try:
        TorchInstrumentor().instrument(claim=claim_training_process if deferred else None)
    except Exception as error:  # noqa: BLE001 - never break `import torch`
        logger.error("otel_training: torch is not instrumented: %s", error)


def _extra_missing(deferred: bool, name: str) -> None:
    log = logger.debug if deferred else logger.warning
    log("otel_training: torch is not instrumented (%s is missing; pip install 'otel-training[torch]')", name)


def auto_instrument() -> Any:
    """Configure from the environment and instrument torch (when it is imported), by role; never raises.

    Returns the ``Telemetry`` handle of an owner, or None.
    """
    try:
        decided = role()
        if decided == LAUNCHER:
            return None
        telemetry = configure_owner() if decided == OWNER else None
    except Exception as error:  # noqa: BLE001 - never break the program being launched
        logger.error("otel_training: auto-instrumentation failed, the program runs uninstrumented: %s", error)
        return None
    try:
        instrument_torch(deferred=decided == DESCENDANT)
    except Exception as error:  # noqa: BLE001 - the program runs uninstrumented rather than not at all
        logger.error("otel_training: torch is not instrumented: %s", error)
    return telemetry


def __getattr__(name: str) -> Any:
    # The entry points name these here; they need opentelemetry-instrumentation.
    if name in ("OtelTrainingDistro", "OtelTrainingConfigurator"):
        from otel_training.integrations.auto import distro

        return getattr(distro, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DESCENDANT",
    "ENV_JOB_ID",
    "ENV_OWNER",
    "LAUNCHER",
    "OWNER",
    "OtelTrainingConfigurator",
    "OtelTrainingDistro",
    "auto_instrument",
    "claim_training_process",
    "decide",
    "is_launcher",
    "role",
]
