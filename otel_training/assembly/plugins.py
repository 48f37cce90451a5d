"""The processors and helpers that options turn on, added to a pipeline being built.

Each lives in its own module and is imported only when its option asks for it,
so a pipeline without a stuck detector or a DLRover log never loads them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from otel_training import semconv as sc
from otel_training._contain import call_contained
from otel_training.pipeline.telemetry import Telemetry
from otel_training.processors.stuck_actions import RemoteProcess

if TYPE_CHECKING:
    from otel_training.hardware.gpu_state import SpanEndHook

logger = logging.getLogger("otel_training")


def install_plugins(telemetry: Telemetry, remote: RemoteProcess | None = None, *,
                    spans_of_this_process: bool = True, device_uuids: dict[int, str] | None = None,
                    ask_device_uuid: Callable[[int], str | None] | None = None) -> SpanEndHook | None:
    """Processors and helpers that options turn on, each in its own module.

    ``spans_of_this_process`` False: the spans are another process's (the offload drain's training process),
    so this process's stacks say nothing of them; ``remote`` is then that process, when it can be asked
    (``pipeline/responder.py``): the stuck detector takes its stacks from it and acts on it. Returns what the
    drain calls before it ends a replayed span (the GPU state's step join), or None. ``device_uuids``: the
    training process's CUDA devices' UUIDs it knew when it started the drain (its hello), for the sampler;
    ``ask_device_uuid``: asks it for one later (``Requests.device_uuid``).
    """
    # The GPU's own state (issue 31, docs/gpu-state.md): sampled in the drain only, never in training.
    on_end: SpanEndHook | None = None
    if telemetry.options.get("gpu_state_interval_s") and not telemetry.disabled:
        if spans_of_this_process:
            logger.info("otel_training: GPU state is not sampled: it needs the offloaded pipeline (offload=true), "
                        "never the training process")
        else:
            from otel_training.hardware.gpu_state import RemoteWithGpuState
            from otel_training.hardware.setup import start_gpu_state

            gpu = call_contained(start_gpu_state, telemetry.options, telemetry.resource.attributes,
                                 telemetry.meter_provider, telemetry.on_shutdown, os.environ,
                                 uuids=device_uuids, ask_uuid=ask_device_uuid)
            if gpu is not None:
                on_end = gpu.on_span_end
                remote = RemoteWithGpuState(remote, gpu) if remote is not None else None
    # The DLRover-format event log (issue 2).
    if telemetry.options["dlrover_log"]:
        from otel_training.processors.dlrover_log import DLRoverLogProcessor

        telemetry.add_span_processor(
            DLRoverLogProcessor(
                telemetry.options["dlrover_log"],
                json_lines=telemetry.options["dlrover_log_format"] == "json",
                max_queue_size=telemetry.options["dlrover_log_queue_size"],
            )
        )
    # Stuck-step detection (issue 3): in-process watcher, and the sidecar watchdog when asked.
    options = telemetry.options
    if options["stuck_threshold_s"] is not None or options["stuck_adaptive"] or options["watchdog"]:
        from otel_training.processors.stuck import StuckSpanProcessor

        slot = None
        if options["watchdog"] and not telemetry.disabled:
            from otel_training import watchdog

            slot = call_contained(watchdog.start, telemetry)
        telemetry.add_stuck_detector(StuckSpanProcessor.from_options(
            options, tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider,
            flush=telemetry.force_flush, before_exit=lambda: end_spans_before_stuck_exit(telemetry),
            exit_flush_timeout_s=options["exit_timeout_s"], slot=slot, stacks=spans_of_this_process,
            remote=remote))
    # Live goodput, badput and step-time metrics (issue 6, docs/goodput.md).
    # Only with a metric reader: nothing would ever collect what it queues.
    if telemetry.options["goodput"] and telemetry.metrics_exported:
        from otel_training.processors.goodput import GoodputSpanProcessor

        telemetry.add_span_processor(
            GoodputSpanProcessor(
                telemetry.meter_provider,
                evaluation_is_productive=telemetry.options["evaluation_is_productive"],
                ideal_step_time_s=telemetry.options["ideal_step_time_s"],
                after_restart=int(telemetry.resource.attributes.get(sc.TRAINING_RESTART_COUNT, 0) or 0) > 0,  # type: ignore[arg-type]  # an int, or a str from OTEL_RESOURCE_ATTRIBUTES
                origin_ns=telemetry.process_start_ns,
            )
        )
    return on_end


def end_spans_before_stuck_exit(telemetry: Telemetry) -> None:
    """The stuck detector's exit action would lose the open spans, the stuck step first of all."""
    from otel_training.lifecycle.hooks import end_open_spans

    end_open_spans(telemetry, sc.EVENT_ALERT, {sc.ALERT_KIND: sc.ALERT_KIND_STUCK, sc.ALERT_ACTION: "exit"},
                   f"exited with code {telemetry.options['stuck_exit_code']}: a watched span was stuck")
