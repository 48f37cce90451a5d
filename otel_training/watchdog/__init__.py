"""The sidecar watchdog: stuck and dead training processes reported from outside.

``start(telemetry)`` creates the shared-memory slot the stuck detector writes
and starts ``python -m otel_training.watchdog`` in its own session (so it
outlives the training process it reports on), passing its settings in the
reserved ``OTEL_TRAINING__WATCHDOG_*`` variables.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from otel_training.watchdog import monitor
from otel_training.watchdog.slot import SlotWriter

if TYPE_CHECKING:
    from otel_training.pipeline.telemetry import Telemetry

__all__ = ["SlotWriter", "start"]


def _slot_dir() -> str:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else tempfile.gettempdir()


def start(telemetry: Telemetry, grace_s: float = 1.0, poll_s: float = 0.1) -> SlotWriter:
    """Create the slot and start the watchdog process; the slot is closed at shutdown."""
    fd, path = tempfile.mkstemp(prefix=f"otel-training-watchdog-{os.getpid()}-", suffix=".slot", dir=_slot_dir())
    os.close(fd)
    writer = SlotWriter(path)
    env = dict(os.environ)
    env.update({
        monitor.ENV_SLOT: path,
        monitor.ENV_PID: str(os.getpid()),
        monitor.ENV_RESOURCE: json.dumps(
            {key: list(value) if isinstance(value, tuple) else value
             for key, value in telemetry.resource.attributes.items()}),
        monitor.ENV_EXPORTER: telemetry.exporter_name,
        monitor.ENV_GRACE_S: str(grace_s),
        monitor.ENV_POLL_S: str(poll_s),
    })
    if telemetry.trace_path is not None:
        env[monitor.ENV_TRACE_PATH] = str(telemetry.trace_path.resolve())
    if telemetry.options.get("stuck_escalation_s"):
        env[monitor.ENV_ESCALATION_S] = str(telemetry.options["stuck_escalation_s"])
    writer.process = subprocess.Popen(
        [sys.executable, "-m", "otel_training.watchdog"], env=env, stdin=subprocess.DEVNULL,
        start_new_session=True, close_fds=True,
    )
    telemetry.on_shutdown(writer.close)
    return writer
