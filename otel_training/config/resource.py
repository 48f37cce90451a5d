"""Who is emitting: the OpenTelemetry resource of a training process.

The identity of a rank lives in the launcher's environment (torchrun/torchelastic,
Slurm, Kubernetes, DLRover), so it is detected from there; explicit options win,
and ``OTEL_RESOURCE_ATTRIBUTES``/``OTEL_SERVICE_NAME`` are honoured by the SDK's
own ``Resource.create``.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from opentelemetry.sdk.resources import Resource

from otel_training import semconv as sc
from otel_training._text import text
from otel_training.analysis.records import iso_ns
from otel_training.config.options import OPTIONS_BY_NAME
from otel_training.config.parsers import MAX_INT64, ConfigError

DEFAULT_SERVICE_NAME = "training"

#: The integer identity attributes, and the option whose range each one shares.
INT_ATTRIBUTES: dict[str, str] = {
    sc.TRAINING_RANK: "rank",
    sc.TRAINING_LOCAL_RANK: "local_rank",
    sc.TRAINING_WORLD_SIZE: "world_size",
    sc.TRAINING_NODE_RANK: "node_rank",
    sc.TRAINING_RESTART_COUNT: "restart_count",
}


def _int(environ: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        value = environ.get(name)
        if value is not None and value.strip().lstrip("-").isdigit():
            number = int(value)
            if not -MAX_INT64 - 1 <= number <= MAX_INT64:  # it would vanish from every export
                raise ConfigError(f"environment variable {name}={value!r}: expected an integer within int64")
            return number
    return None


def _str(environ: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = environ.get(name)
        if value:
            return value
    return None


def from_otel_variables(environ: Mapping[str, str]) -> dict[str, Any]:
    """``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` as the spec defines them.

    The spec's values are strings, but ``training.rank`` and the other identity
    numbers are integers everywhere else (file names, reports, joins), so they
    are converted, and a value that is no such integer raises ``ConfigError``.
    """
    attributes: dict[str, Any] = {}
    raw = environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    for pair in raw.split(","):
        key, sep, value = pair.partition("=")
        if sep and key.strip():
            key, value = unquote(key.strip()), unquote(value.strip())
            option = INT_ATTRIBUTES.get(key)
            if option is not None:
                try:
                    number = OPTIONS_BY_NAME[option].parse(value)
                    if number is None:
                        raise ValueError("expected an integer")
                except ValueError as error:
                    raise ConfigError(f"environment variable OTEL_RESOURCE_ATTRIBUTES={raw!r}: "
                                      f"{key}={value!r}: {error}") from None
                value = number
            attributes[key] = value
    if environ.get("OTEL_SERVICE_NAME"):
        attributes[sc.SERVICE_NAME] = environ["OTEL_SERVICE_NAME"]
    return attributes


#: torchrun's ``--rdzv-id`` default: every launch without one says "none", so it names no job.
TORCHRUN_PLACEHOLDER_RUN_ID = "none"


def _launch_id(environ: Mapping[str, str]) -> str:
    """A job id for a torchrun launch that gave none: shared by its ranks, new for every launch.

    The ranks of one launch are children of one torchrun agent: its host, pid and start time name
    the launch (ranks on other nodes get their own: pass ``--rdzv-id`` or ``OTEL_TRAINING_JOB_ID``
    for a multi-node job, and to keep one job id across restarts).
    """
    agent = os.getppid()
    try:
        with open(f"/proc/{agent}/stat", "rb") as stat:
            started = stat.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        started = "0"
    return f"torchrun-{socket.gethostname()}-{agent}-{started}"


def detect_training_identity(environ: Mapping[str, str]) -> dict[str, Any]:
    """Training attributes from torchrun, Slurm, DLRover and Kubernetes variables."""
    identity: dict[str, Any] = {
        sc.TRAINING_RANK: _int(environ, "RANK", "SLURM_PROCID", "PMI_RANK", "OMPI_COMM_WORLD_RANK"),
        sc.TRAINING_LOCAL_RANK: _int(environ, "LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"),
        sc.TRAINING_WORLD_SIZE: _int(environ, "WORLD_SIZE", "SLURM_NTASKS", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE"),
        sc.TRAINING_NODE_RANK: _int(environ, "GROUP_RANK", "NODE_RANK", "SLURM_NODEID"),
        sc.TRAINING_RESTART_COUNT: _int(environ, "TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"),
        sc.TRAINING_JOB_ID: _str(environ, "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "ELASTIC_JOB_NAME", "DLROVER_JOB_NAME"),
    }
    if identity[sc.TRAINING_JOB_ID] == TORCHRUN_PLACEHOLDER_RUN_ID:
        identity[sc.TRAINING_JOB_ID] = _launch_id(environ)
    # Kubernetes sets HOSTNAME to the pod name; elsewhere HOSTNAME is just the host.
    pod = environ.get("POD_NAME") or (environ.get("HOSTNAME") if environ.get("KUBERNETES_SERVICE_HOST") else None)
    if pod:
        identity[sc.K8S_POD_NAME] = pod
    return {key: value for key, value in identity.items() if value is not None}


def build_resource(options: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> Resource:
    """The process resource: detection, then explicit options, then OTEL_* variables.

    ``training.run.id`` names one launch attempt: every rank of one torchrun
    attempt shares it (job id + restart count), so a report can tell restarts
    apart; a process with no launcher gets a random one.
    """
    environ = os.environ if environ is None else environ
    attributes = detect_training_identity(environ)
    explicit = {
        sc.TRAINING_JOB_ID: options.get("job_id"),
        sc.TRAINING_RUN_ID: options.get("run_id"),
        sc.TRAINING_RANK: options.get("rank"),
        sc.TRAINING_LOCAL_RANK: options.get("local_rank"),
        sc.TRAINING_WORLD_SIZE: options.get("world_size"),
        sc.TRAINING_NODE_RANK: options.get("node_rank"),
        sc.TRAINING_RESTART_COUNT: options.get("restart_count"),
    }
    attributes.update({key: value for key, value in explicit.items() if value is not None})
    attributes.setdefault(sc.TRAINING_RANK, 0)
    attributes.setdefault(sc.TRAINING_WORLD_SIZE, 1)
    attributes.setdefault(sc.TRAINING_RESTART_COUNT, 0)
    if sc.TRAINING_JOB_ID not in attributes:
        attributes[sc.TRAINING_JOB_ID] = f"local-{uuid.uuid4().hex[:12]}"
    if sc.TRAINING_RUN_ID not in attributes:
        if sc.TRAINING_JOB_ID in detect_training_identity(environ) or options.get("job_id"):
            attributes[sc.TRAINING_RUN_ID] = f"{attributes[sc.TRAINING_JOB_ID]}-{attributes[sc.TRAINING_RESTART_COUNT]}"
        else:
            attributes[sc.TRAINING_RUN_ID] = uuid.uuid4().hex[:16]
    attributes[sc.TRAINING_ROLE] = options.get("role") or sc.ROLE_TRAINER
    attributes[sc.SERVICE_INSTANCE_ID] = uuid.uuid4().hex
    attributes[sc.HOST_NAME] = socket.gethostname()
    attributes[sc.PROCESS_PID] = os.getpid()
    created = process_start_ns()
    if created is not None:
        attributes[sc.PROCESS_CREATION_TIME] = iso_ns(created)
    attributes[sc.SERVICE_NAME] = options.get("service_name") or DEFAULT_SERVICE_NAME
    # Precedence: detection < OTEL_RESOURCE_ATTRIBUTES < explicit options; and for
    # service.name: default < service_name option < OTEL_SERVICE_NAME.
    # (Resource.create alone would let detection override the variables.)
    from_env = Resource(from_otel_variables(environ))
    explicit_attributes = {key: value for key, value in explicit.items() if value is not None}
    explicit_attributes[sc.TRAINING_ROLE] = attributes[sc.TRAINING_ROLE]
    resource = Resource.create(attributes).merge(from_env).merge(Resource(explicit_attributes))
    # The environment decodes bytes that are not UTF-8 as lone surrogates, which
    # every export would drop (with a traceback): escape them once, here.
    return Resource({text(key): text(value) if isinstance(value, str) else value
                     for key, value in resource.attributes.items()}, resource.schema_url)


def process_start_ns() -> int | None:
    """Wall-clock ns at which this process was created, from the OS (Linux, 10 ms), or None.

    A life's start-up begins there, not at ``configure()``: imports, CUDA and NCCL set-up before
    it are start-up too, and are what a restart costs again.
    """
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        started_after_boot_ns = int(fields[19]) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")  # field 22
        since_boot_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        return time.time_ns() - (since_boot_ns - started_after_boot_ns)
    except (OSError, ValueError, IndexError, AttributeError):
        return None
