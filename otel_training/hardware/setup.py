"""Whether and how the GPU state sampler starts, in the drain process: the one place that decides.

Why apart from the sampler: the decision reads options, the rank's environment and NVML's presence, and
each "no" must be one log line, not an error: a CPU machine, a job without the ``gpu`` extra and a GPU
whose NVML fails all train as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.metrics import MeterProvider

from otel_training import semconv as sc
from otel_training.hardware.gpu_state import GpuState
from otel_training.hardware.metrics import register_metrics
from otel_training.hardware.nvml import load_nvml
from otel_training.processors import alert_context

logger = logging.getLogger("otel_training")


def device_ordinal(local_rank: Any, environ: Mapping[str, str]) -> int:
    """The CUDA ordinal of this rank's device: its local rank, or 0 where the launcher left it one device
    (``CUDA_VISIBLE_DEVICES`` with a single entry, as Slurm's GPU binding does)."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and len([entry for entry in visible.split(",") if entry.strip()]) == 1:
        return 0
    try:
        return max(0, int(local_rank if local_rank is not None else environ.get("LOCAL_RANK", 0)))
    except (TypeError, ValueError):
        return 0


def start_gpu_state(options: Mapping[str, Any], resource: Mapping[str, Any], meter_provider: MeterProvider | None,
                    on_shutdown: Callable[[Callable[[], None]], None], environ: Mapping[str, str], *,
                    nvml_loader: Callable[[], tuple[Any, str]] = load_nvml, uuids: Mapping[int, str] | None = None,
                    ask_uuid: Callable[[int], str | None] | None = None) -> GpuState | None:
    """The sampler of this rank's device, started; None, said once in the log, where there is none to run.
    ``uuids`` and ``ask_uuid``: the training process's CUDA devices' UUIDs, known and to ask (``GpuState``)."""
    interval = float(options.get("gpu_state_interval_s") or 0.0)
    if interval <= 0:
        return None
    nvml, why = nvml_loader()
    if nvml is None:
        logger.info("otel_training: GPU state is not sampled: %s", why)
        return None
    try:
        if nvml.nvmlDeviceGetCount() == 0:
            logger.info("otel_training: GPU state is not sampled: NVML sees no GPU")
            return None
    except Exception as error:  # noqa: BLE001 - an NVML that fails here fails training nothing
        logger.info("otel_training: GPU state is not sampled: NVML failed (%s)", error)
        return None
    state = GpuState(nvml, device_ordinal(resource.get(sc.TRAINING_LOCAL_RANK), environ), interval, environ,
                     uuids=uuids, ask_uuid=ask_uuid)
    if meter_provider is not None:
        register_metrics(meter_provider.get_meter(sc.INSTRUMENTATION_SCOPE, schema_url=sc.SCHEMA_URL), state)
    alert_context.add(state.alert_context)

    def stop() -> None:
        alert_context.remove(state.alert_context)
        state.stop()

    on_shutdown(stop)
    state.start()
    return state
