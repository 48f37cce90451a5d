"""Semantic conventions of otel-training: every span name and attribute key.

These names are a contract. Collector configurations (``collector-config/``),
Prometheus rules, the report and the tests match on them, so they are defined
here once and nowhere else; ``docs/semantic-conventions.md`` documents each one
and a test keeps the two in step.

Naming follows the OpenTelemetry rules: domain first, lowercase, segments
separated by dots, ``snake_case`` within a segment. Existing OpenTelemetry keys
(``k8s.pod.name``, ``error.type``, ``exception.*``) are reused rather than
re-invented.
"""

from __future__ import annotations

from typing import Final

#: Version of these conventions; bumped on any rename. Set on the tracer.
SCHEMA_VERSION: Final = "0.1.0"
SCHEMA_URL: Final = f"https://github.com/otel-training/otel-training/tree/main/docs/schemas/{SCHEMA_VERSION}"
#: Instrumentation scope of every tracer and meter the library creates.
INSTRUMENTATION_SCOPE: Final = "otel_training"

# --------------------------------------------------------------------------
# Resource attributes: who emitted the telemetry.
# --------------------------------------------------------------------------
TRAINING_JOB_ID: Final = "training.job.id"
TRAINING_RUN_ID: Final = "training.run.id"
TRAINING_RANK: Final = "training.rank"
TRAINING_LOCAL_RANK: Final = "training.local_rank"
TRAINING_WORLD_SIZE: Final = "training.world_size"
TRAINING_NODE_RANK: Final = "training.node.rank"
TRAINING_RESTART_COUNT: Final = "training.restart.count"
TRAINING_ROLE: Final = "training.role"

ROLE_TRAINER: Final = "trainer"
ROLE_AGENT: Final = "agent"
ROLE_MASTER: Final = "master"

# Continual-training lineage (Modyn-style pipelines retrained on triggers).
# Set once per process and stamped on every span, not on the resource, because
# a long-lived process may move on to the next trigger.
TRAINING_PIPELINE_ID: Final = "training.pipeline.id"
TRAINING_TRIGGER_ID: Final = "training.trigger.id"
TRAINING_TRIGGER_TRAINING_ID: Final = "training.trigger.training_id"

# Existing OpenTelemetry resource keys we fill in.
SERVICE_NAME: Final = "service.name"
SERVICE_INSTANCE_ID: Final = "service.instance.id"
HOST_NAME: Final = "host.name"
PROCESS_PID: Final = "process.pid"
#: When the process was created (OpenTelemetry's key; ISO 8601, here to the nanosecond): a life's
#: time starts there, so a life killed without warning keeps its start-up in the report.
PROCESS_CREATION_TIME: Final = "process.creation.time"
K8S_POD_NAME: Final = "k8s.pod.name"

# --------------------------------------------------------------------------
# Trainer span names.
# --------------------------------------------------------------------------
SPAN_PROCESS: Final = "training.process"
SPAN_TRAIN: Final = "training.train"
SPAN_EPOCH: Final = "training.epoch"
SPAN_STEP: Final = "training.step"
SPAN_SUBSTEP: Final = "training.substep"
SPAN_INIT: Final = "training.init"
SPAN_LOAD_DATASET: Final = "training.load_dataset"
SPAN_DATA_WAIT: Final = "training.data_wait"
SPAN_LOAD_CHECKPOINT: Final = "training.load_checkpoint"
SPAN_SAVE_CHECKPOINT: Final = "training.save_checkpoint"
SPAN_PERSIST_CHECKPOINT: Final = "training.persist_checkpoint"
SPAN_EVALUATE: Final = "training.evaluate"
SPAN_PREDICT: Final = "training.predict"
SPAN_PREDICT_STEP: Final = "training.predict_step"

# Trainer attributes.
STEP: Final = "training.step"
EPOCH: Final = "training.epoch"
SUBSTEP: Final = "training.substep"
BATCH_SIZE: Final = "training.batch.size"
SAMPLES: Final = "training.samples"
TOKENS: Final = "training.tokens"
LOSS: Final = "training.loss"
LEARNING_RATE: Final = "training.learning_rate"
CHECKPOINT_PATH: Final = "training.checkpoint.path"
CHECKPOINT_STEP: Final = "training.checkpoint.step"
CHECKPOINT_BYTES: Final = "training.checkpoint.bytes"

# --------------------------------------------------------------------------
# Auto-instrumentation (issue 4): TorchInstrumentor, framework callbacks,
# the AReaL-style perf tracer. See docs/auto-instrumentation.md.
# --------------------------------------------------------------------------
#: Which integration emitted a span: "torch", "lightning", "transformers", "keras".
INSTRUMENTATION_SOURCE: Final = "training.instrumentation.source"
#: Backward passes (gradient-accumulation micro-batches) in one step.
STEP_SUBSTEPS: Final = "training.step.substeps"
#: Optimizer steps taken in one step (several optimizers step in one iteration).
STEP_OPTIMIZER_STEPS: Final = "training.step.optimizer_steps"
#: True when no optimizer stepped (AMP's GradScaler skipped it on inf/NaN gradients).
STEP_SKIPPED: Final = "training.step.skipped"
#: Seconds this step waited for batches (every fetch; only waits over 1 ms get a data_wait span).
STEP_DATA_WAIT_S: Final = "training.step.data_wait_s"
CHECKPOINT_FORMAT: Final = "training.checkpoint.format"

# --------------------------------------------------------------------------
# The device timeline (see docs/trace-layout.md#device-timeline). CUDA work is
# asynchronous: a host ``training.step`` span measures launch time, so where a
# step runs accelerator work its device execution is a child span of its own.
# --------------------------------------------------------------------------
#: The step's execution on the device: from the completion of a device event recorded at the
#: host step's begin to the completion of one recorded at its end. Child of the host step.
SPAN_DEVICE_STEP: Final = "training.device_step"
#: The host outside any step (after one step ended, before the next began) for longer than the
#: step's stuck threshold, with no device work pending. Only emitted when that happens.
SPAN_BETWEEN_STEPS: Final = "training.between_steps"
#: True on a host step whose device time is in a ``training.device_step`` child (statistics,
#: goodput and stuck detection then use the child).
STEP_DEVICE_TIMED: Final = "training.step.device_timed"
#: Values of this span (or, on an event, of this event) still being read when it ended: one-element device
#: tensors whose device work had not completed (``events/values.py``). The exporting pipeline holds the span
#: until they arrive and removes this attribute; it is exported only on a span whose values never came.
VALUES_PENDING: Final = "training.values.pending"
#: How many values were still being read when the pipeline stopped waiting for them (``values_hold_s``).
VALUES_UNRESOLVED: Final = "training.values.unresolved"
#: The device a device span ran on, as torch names it ("cuda:0").
DEVICE: Final = "training.device"
#: The device's model name ("NVIDIA H100 80GB HBM3").
DEVICE_NAME: Final = "training.device.name"
#: Seconds the device was idle between the previous device step's end and this one's start.
DEVICE_IDLE_BEFORE_S: Final = "training.device.idle_before_s"
#: The last step whose device work had completed when this device step began.
DEVICE_LAST_COMPLETED_STEP: Final = "training.device.last_completed_step"
#: True once the host has finished launching the step (its end is recorded on the device): a
#: stuck device step with this false is still held up on the host.
STEP_LAUNCHED: Final = "training.step.launched"
#: The OpenTelemetry ``thread.id`` of the host thread that ran the step (the stack to look at).
THREAD_ID: Final = "thread.id"

SPAN_DISTRIBUTED_INIT: Final = "training.distributed.init"
SPAN_DISTRIBUTED_BARRIER: Final = "training.distributed.barrier"
SPAN_DISTRIBUTED_DESTROY: Final = "training.distributed.destroy"
DISTRIBUTED_BACKEND: Final = "training.distributed.backend"
DISTRIBUTED_RANK: Final = "training.distributed.rank"
DISTRIBUTED_WORLD_SIZE: Final = "training.distributed.world_size"

# AReaL-style perf tracer: scopes, and the rollout task -> session -> phase tree.
PERF_CATEGORY: Final = "perf.category"
SPAN_ROLLOUT_TASK: Final = "rollout.task"
SPAN_ROLLOUT_SESSION: Final = "rollout.session"
SPAN_ROLLOUT_PHASE: Final = "rollout.phase"
ROLLOUT_TASK_ID: Final = "rollout.task.id"
ROLLOUT_SESSION_ID: Final = "rollout.session.id"
ROLLOUT_PHASE_NAME: Final = "rollout.phase.name"
#: accepted / rejected / failed / dropped.
ROLLOUT_SESSION_STATUS: Final = "rollout.session.status"
ROLLOUT_SESSION_REASON: Final = "rollout.session.reason"
ROLLOUT_SESSION_TOTAL_S: Final = "rollout.session.total_s"
#: Prefix of the derived per-phase totals on a session span: ``rollout.session.phase_s.generate``.
ROLLOUT_SESSION_PHASE_S_PREFIX: Final = "rollout.session.phase_s."
ROLLOUT_TASK_SESSIONS: Final = "rollout.task.sessions"
EVENT_ROLLOUT_SESSION: Final = "rollout.session.event"

# DLRover compatibility: every event span says which process emitted it and
# under which DLRover event name.
EVENT_TARGET: Final = "training.event.target"
EVENT_NAME: Final = "training.event.name"
TARGET_TRAINER: Final = "TrainerProcess"
TARGET_AGENT: Final = "DLRoverAgentEvent"
TARGET_MASTER: Final = "DLRoverMasterEvent"
EVENT_LOG_INFO: Final = "training.log.info"
EVENT_LOG_ERROR: Final = "training.log.error"
LOG_MESSAGE: Final = "training.log.message"

# Trace-size bounding: see docs/trace-layout.md.
TRACE_SEGMENT: Final = "training.trace.segment"
LINK_TYPE: Final = "training.link.type"
LINK_CONTINUES: Final = "continues"
LINK_PREVIOUS: Final = "previous"

# --------------------------------------------------------------------------
# Elastic agent and master events.
# --------------------------------------------------------------------------
SPAN_AGENT_START: Final = "elastic.start"
SPAN_NODE_JOIN: Final = "elastic.node_join"
SPAN_RENDEZVOUS: Final = "elastic.rendezvous"
SPAN_NETWORK_CHECK: Final = "elastic.network_check"
SPAN_ELASTIC_TRAIN: Final = "elastic.train"
SPAN_PROCESS_RESTART: Final = "elastic.process_restart"
SPAN_AGENT_EXIT: Final = "elastic.exit"
SPAN_POD_CREATE: Final = "elastic.pod_create"
SPAN_POD_CHANGE: Final = "elastic.pod_change"
SPAN_POD_RELAUNCH: Final = "elastic.pod_relaunch"
SPAN_FAULT_DETECT: Final = "elastic.fault_detect"
SPAN_REPAIR: Final = "elastic.repair"

ELASTIC_RENDEZVOUS_ROUND: Final = "elastic.rendezvous.round"
ELASTIC_NODE_ID: Final = "elastic.node.id"
ELASTIC_NODE_RANK: Final = "elastic.node.rank"
ELASTIC_NODE_COUNT: Final = "elastic.node.count"
ELASTIC_RESTART_REASON: Final = "elastic.restart.reason"
ELASTIC_FAULT_REASON: Final = "elastic.fault.reason"
ELASTIC_EXIT_CODE: Final = "elastic.exit_code"
ELASTIC_NETWORK_CHECK_RESULT: Final = "elastic.network_check.result"

# Existing OpenTelemetry keys for errors.
ERROR_TYPE: Final = "error.type"
EXCEPTION_TYPE: Final = "exception.type"
EXCEPTION_MESSAGE: Final = "exception.message"
EXCEPTION_STACKTRACE: Final = "exception.stacktrace"
EVENT_EXCEPTION: Final = "exception"

# Process termination (signal hook).
EVENT_SIGNAL: Final = "training.signal"
SIGNAL_NAME: Final = "training.signal.name"
SIGNAL_NUMBER: Final = "training.signal.number"

# --------------------------------------------------------------------------
# Alerts (stuck-step detection).
# --------------------------------------------------------------------------
SPAN_ALERT: Final = "training.alert"
EVENT_ALERT: Final = "training.alert"
ALERT_KIND: Final = "training.alert.kind"
ALERT_KIND_STUCK: Final = "stuck"
ALERT_KIND_RECOVERED: Final = "recovered"
ALERT_KIND_DIED: Final = "died"
ALERT_ELAPSED_S: Final = "training.alert.elapsed_s"
ALERT_THRESHOLD_S: Final = "training.alert.threshold_s"
ALERT_THRESHOLD_SOURCE: Final = "training.alert.threshold_source"
ALERT_SPAN_NAME: Final = "training.alert.span.name"
ALERT_SPAN_ID: Final = "training.alert.span.id"
ALERT_COUNT: Final = "training.alert.count"
#: True on a repeat of a stuck alert for a span still open (count >= 2): pages count episodes, not repeats.
ALERT_REPEAT: Final = "training.alert.repeat"
ALERT_STACKS: Final = "training.alert.stacks"
ALERT_SOURCE: Final = "training.alert.source"
# Stuck-step detection details (issue 3, docs/stuck-detection.md).
#: How the threshold was computed, in words (the rule and its inputs).
ALERT_THRESHOLD_RULE: Final = "training.alert.threshold_rule"
#: What the detector did besides reporting: "exit" or "signal".
ALERT_ACTION: Final = "training.alert.action"
#: Why ALERT_STACKS is missing or partial (e.g. py-spy not installed, no ptrace permission).
ALERT_STACKS_ERROR: Final = "training.alert.stacks.error"
#: Who captured ALERT_STACKS: "python" (in-process) or "py-spy" (the watchdog).
ALERT_STACKS_SOURCE: Final = "training.alert.stacks.source"
#: PID of the process the alert is about (the watchdog reports another process).
ALERT_PID: Final = "training.alert.pid"
ALERT_SOURCE_PROCESSOR: Final = "processor"
ALERT_SOURCE_WATCHDOG: Final = "watchdog"
#: LINK_TYPE of an alert's link to the span it is about.
LINK_ALERTED: Final = "alerted"

# --------------------------------------------------------------------------
# Metrics.
# --------------------------------------------------------------------------
METRIC_ALERTS: Final = "training.alerts"
METRIC_SPANS_DROPPED: Final = "training.telemetry.spans.dropped"
#: Spans the collector could not take, written to the local spool (``spool_dir``) instead.
METRIC_SPANS_SPOOLED: Final = "training.telemetry.spans.spooled"
#: Seconds the threads ending spans waited for room in a full span queue (``span_queue_policy`` "wait").
METRIC_SPAN_QUEUE_WAIT: Final = "training.telemetry.span_queue.wait"
#: Spans the live goodput processor left out of the goodput and step-time metrics.
METRIC_GOODPUT_SPANS_DROPPED: Final = "training.telemetry.goodput.spans.dropped"
METRIC_STEP_DURATION: Final = "training.step.duration"
METRIC_GOODPUT: Final = "training.goodput"
METRIC_BADPUT: Final = "training.badput"
BADPUT_BUCKET: Final = "training.badput.bucket"

# --------------------------------------------------------------------------
# Goodput, badput and step time (issue 6, see docs/goodput.md).
# Badput buckets follow ml-goodput-measurement's taxonomy where it applies.
# --------------------------------------------------------------------------
BADPUT_INITIALIZATION: Final = "initialization"
BADPUT_TRAINING_PREP: Final = "training_prep"
BADPUT_PROGRAM_STARTUP: Final = "program_startup"
#: The first step's excess over the ideal step time (compilation, warm-up, autotuning), per life.
BADPUT_COMPILATION: Final = "compilation"
BADPUT_DATA_LOADING: Final = "data_loading"
BADPUT_CHECKPOINT_SAVE: Final = "checkpoint_save"
BADPUT_CHECKPOINT_RESTORE: Final = "checkpoint_restore"
BADPUT_EVALUATION: Final = "evaluation"
BADPUT_STUCK: Final = "stuck"
BADPUT_WASTED_PROGRESS: Final = "wasted_progress"
BADPUT_RECOVERY: Final = "recovery"
BADPUT_DOWNTIME: Final = "downtime"
BADPUT_OTHER: Final = "other"
#: Time after the first step, covered by no step or other labelled span, while the device (if any)
#: is idle: the host's own work between steps (an ``.item()`` sync, logging, an unhooked eval).
BADPUT_HOST_OUTSIDE_STEPS: Final = "host_outside_steps"
METRIC_GOODPUT_TIME: Final = "training.goodput.time"
METRIC_STEP_IDEAL_DURATION: Final = "training.step.ideal_duration"
METRIC_STEP_DEVIATION: Final = "training.step.deviation"
METRIC_STEP_TOKENS_RATE: Final = "training.step.tokens_per_second"
METRIC_STEP_SAMPLES_RATE: Final = "training.step.samples_per_second"
#: This rank's individual straggler score now: its best window's median step time over its current
#: window's (1.0: as fast as it has been; below 0.75: a straggler by NVRx's default).
METRIC_STEP_STRAGGLER_INDIVIDUAL: Final = "training.step.straggler.individual"

# --------------------------------------------------------------------------
# Collectives and the job-level hang verdict (issue 17, docs/hang-diagnosis.md).
# One rank's view of its process groups: the last collective it entered and the
# last it knows completed. Sequence numbers are torch's per-group collective
# counters (the flight recorder's ``collective_seq_id``), so ranks compare.
# --------------------------------------------------------------------------
#: The process group (torch's ``group_name``: "0" is the default group).
COLLECTIVE_GROUP: Final = "training.collective.group"
#: The collective's operation as the backend dispatches it ("allreduce", "allgather_base", "barrier").
COLLECTIVE_OP: Final = "training.collective.op"
#: Sequence number of the last collective this rank entered on the group.
COLLECTIVE_SEQ: Final = "training.collective.seq"
#: Sequence number of the last collective this rank knows completed on the group (on the device for NCCL).
COLLECTIVE_COMPLETED_SEQ: Final = "training.collective.completed_seq"
#: Input bytes of the last collective entered.
COLLECTIVE_BYTES: Final = "training.collective.bytes"
#: True while the last collective entered is not known to have completed.
COLLECTIVE_PENDING: Final = "training.collective.pending"
#: Seconds since this rank entered its pending collective (0 when none is pending).
COLLECTIVE_WAIT_S: Final = "training.collective.wait_s"
#: The step (``training.step``) in which the last collective was entered.
COLLECTIVE_STEP: Final = "training.collective.step"
#: Collectives this rank entered during a step (on a step span).
STEP_COLLECTIVES: Final = "training.step.collectives"
#: On a stuck alert: the flight recorder's entries still in flight (JSON, bounded).
COLLECTIVE_FLIGHT_RECORDER: Final = "training.collective.flight_recorder"
#: On a stuck alert: why the flight recorder's entries are missing (off, unsupported).
COLLECTIVE_FLIGHT_RECORDER_ERROR: Final = "training.collective.flight_recorder.error"

#: Gauge: the last collective entered, per group, labelled with its op.
METRIC_COLLECTIVE_ENTERED: Final = "training.collective.entered"
#: Gauge: the last collective known completed, per group.
METRIC_COLLECTIVE_COMPLETED: Final = "training.collective.completed"
#: Gauge: seconds inside the pending collective, per group (0: none pending).
METRIC_COLLECTIVE_WAIT: Final = "training.collective.wait"
#: Gauge: the step in which the last collective was entered, per group.
METRIC_COLLECTIVE_STEP: Final = "training.collective.step"
#: Gauge: Unix time of the observation, taken by the metric reader's thread: it keeps moving
#: while the training thread is blocked in a collective, and stops when the process is dead or frozen.
METRIC_HEARTBEAT: Final = "training.heartbeat"

#: Why the verdict names a rank: it has not entered the collective the others wait in, it entered a
#: different one at the same sequence number, or it stopped sending heartbeats (dead or frozen).
HANG_REASON_NOT_ENTERED: Final = "not_entered"
HANG_REASON_MISMATCH: Final = "mismatch"
HANG_REASON_NO_HEARTBEAT: Final = "no_heartbeat"

# --- The GPU's own state (issue 31, docs/gpu-state.md): NVML, sampled in the drain; semconv's hw.* where it has names.
#: The device's id (semconv ``hw.id``): the GPU's UUID.
HW_ID: Final = "hw.id"
HW_TYPE: Final = "hw.type"
HW_TYPE_GPU: Final = "gpu"
HW_NAME: Final = "hw.name"
HW_DRIVER_VERSION: Final = "hw.driver_version"
HW_ERROR_TYPE: Final = "hw.error.type"
GPU_ERROR_XID: Final = "xid"
GPU_ERROR_ECC_CORRECTED: Final = "ecc_corrected"
GPU_ERROR_ECC_UNCORRECTED: Final = "ecc_uncorrected"
GPU_PCI_BUS_ID: Final = "training.gpu.pci_bus_id"
GPU_INDEX: Final = "training.gpu.index"
GPU_CUDA_DRIVER_VERSION: Final = "training.gpu.cuda_driver_version"

METRIC_HW_GPU_UTILIZATION: Final = "hw.gpu.utilization"
METRIC_HW_GPU_MEMORY_USAGE: Final = "hw.gpu.memory.usage"
METRIC_HW_GPU_MEMORY_LIMIT: Final = "hw.gpu.memory.limit"
METRIC_HW_GPU_MEMORY_UTILIZATION: Final = "hw.gpu.memory.utilization"
METRIC_HW_ERRORS: Final = "hw.errors"
METRIC_GPU_SM_CLOCK: Final = "training.gpu.sm_clock"
METRIC_GPU_SM_CLOCK_MAX: Final = "training.gpu.sm_clock.max"
METRIC_GPU_MEMORY_CLOCK: Final = "training.gpu.memory_clock"
METRIC_GPU_MEMORY_CLOCK_MAX: Final = "training.gpu.memory_clock.max"
METRIC_GPU_POWER: Final = "training.gpu.power.draw"
METRIC_GPU_POWER_LIMIT: Final = "training.gpu.power.limit"
METRIC_GPU_TEMPERATURE: Final = "training.gpu.temperature"
#: Gauge, 1 while a throttle reason (``training.gpu.throttle_reason``) holds the clocks down, else 0.
METRIC_GPU_THROTTLE: Final = "training.gpu.throttle.active"
METRIC_GPU_PCIE_REPLAYS: Final = "training.gpu.pcie.replays"
METRIC_GPU_SAMPLE_TIME: Final = "training.gpu.sample.time"
#: Gauge 1 once NVML said the GPU is lost (fell off the bus); also an attribute of stuck alerts.
METRIC_GPU_LOST: Final = "training.gpu.lost"
GPU_LOST: Final = "training.gpu.lost"
GPU_THROTTLE_REASON: Final = "training.gpu.throttle_reason"
GPU_THROTTLE_POWER_CAP: Final = "power_cap"
GPU_THROTTLE_HW_SLOWDOWN: Final = "hw_slowdown"
GPU_THROTTLE_SYNC_BOOST: Final = "sync_boost"
GPU_THROTTLE_SW_THERMAL: Final = "sw_thermal"
GPU_THROTTLE_HW_THERMAL: Final = "hw_thermal"
GPU_THROTTLE_HW_POWER_BRAKE: Final = "hw_power_brake"
GPU_XID: Final = "training.gpu.xid"
#: On a training.step span: the device state during the step (the samples between its start and end, and the
#: one in effect at its start).
GPU_SM_CLOCK_MIN_MHZ: Final = "training.gpu.sm_clock.min_mhz"
GPU_THROTTLED: Final = "training.gpu.throttled"
GPU_THROTTLE_REASONS: Final = "training.gpu.throttle_reasons"
EVENT_GPU_THROTTLE_BEGAN: Final = "training.gpu.throttle_began"
EVENT_GPU_ERROR: Final = "training.gpu.error"
#: On a stuck alert: the device state at alert time (the latest sample, and its age).
GPU_SM_CLOCK_MHZ: Final = "training.gpu.sm_clock_mhz"
GPU_POWER_W: Final = "training.gpu.power_w"
GPU_TEMPERATURE_C: Final = "training.gpu.temperature_c"
GPU_SAMPLE_AGE_S: Final = "training.gpu.sample_age_s"
#: On a stuck alert: seconds since the latest GPU error the sampler saw (with ``hw.error.type``, ``training.gpu.xid``).
GPU_ERROR_AGE_S: Final = "training.gpu.error_age_s"
