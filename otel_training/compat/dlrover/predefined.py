"""DLRover's predefined processes: the trainer's, the master's and the agent's events by name.

Thin methods over ``Process``, one per event DLRover's master or tools read,
with DLRover's content keys; kept apart from the emitter, which knows nothing
of any particular event.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

from otel_training.compat.dlrover.emitter import DurationSpan, Process
from otel_training.compat.dlrover.names import (
    CommonEventName,
    DLRoverAgentEventName,
    DLRoverCommonEventName,
    DLRoverMasterEventName,
    TrainerEventName,
)


class CommonPredefined(Process):
    def warning(self, warning_type: str, msg: str, **kwargs: Any) -> None:
        """A ``#warning`` instant, for the user to see."""
        self.instant(CommonEventName.WARNING, {"warning_type": warning_type, "msg": msg, **kwargs})


class TrainInitSpan(DurationSpan):
    """``#init``, with its two predefined stages (``#init##load_ckpt``, ``#init##load_dataset``)."""

    def load_ckpt(self) -> DurationSpan:
        return self.stage(TrainerEventName.TRAIN_LOAD_CKPT.value)

    def load_dataset(self) -> DurationSpan:
        return self.stage(TrainerEventName.TRAIN_LOAD_DATASET.value)


class TrainerProcess(CommonPredefined):
    """A training process's events (DLRover's master reads targets ``AtorchTrainerV2`` and ``AsyncSaver``)."""

    def __init__(self, target: str) -> None:
        super().__init__(target)

    def start(self, params: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.instant(TrainerEventName.TRAIN_START.value, {"params": params or {}, **kwargs})

    def init(self, **kwargs: Any) -> TrainInitSpan:
        return self.custom_duration(TrainInitSpan, TrainerEventName.TRAIN_INIT.value, kwargs)

    def init_end(self, **kwargs: Any) -> None:
        self.instant(TrainerEventName.TRAIN_INIT_END.value, kwargs)

    def train(self, **kwargs: Any) -> DurationSpan:
        return self.duration(TrainerEventName.TRAIN.value, kwargs)

    def epoch(self, **kwargs: Any) -> DurationSpan:
        return self.duration(TrainerEventName.EPOCH.value, kwargs)

    def step(self, global_step: int, **kwargs: Any) -> DurationSpan:
        return self.duration(TrainerEventName.TRAIN_STEP.value, {"global_step": global_step, **kwargs})

    def substep(self, global_step: int, **kwargs: Any) -> None:
        self.instant(TrainerEventName.TRAIN_SUBSTEP.value, {"global_step": global_step, **kwargs})

    def evaluate(self, global_step: int, **kwargs: Any) -> DurationSpan:
        return self.duration(TrainerEventName.EVALUATE.value, {"global_step": global_step, **kwargs})

    def predict(self, global_step: int, **kwargs: Any) -> DurationSpan:
        return self.duration(TrainerEventName.PREDICT.value, {"global_step": global_step, **kwargs})

    def predict_step(self, global_step: int, **kwargs: Any) -> None:
        self.instant(TrainerEventName.PREDICT_STEP.value, {"global_step": global_step, **kwargs})

    def save(self, global_step: int, **kwargs: Any) -> DurationSpan:
        return self.duration(TrainerEventName.SAVE.value, {"global_step": global_step, **kwargs})

    def persist_ckpt(self, global_step: int, path: str = "", size: int | None = None, **kwargs: Any
                     ) -> DurationSpan:
        """The asynchronous write of a checkpoint (often from another thread)."""
        return self.duration(TrainerEventName.TRAIN_PERSIST_CKPT.value,
                             {"global_step": global_step, "path": path, "size": size or 0, **kwargs})

    def log(self, global_step: int, logs: dict[str, Any], **kwargs: Any) -> None:
        self.instant(TrainerEventName.LOG.value, {"global_step": global_step, "logs": logs, **kwargs})

    def finish(self, **kwargs: Any) -> None:
        self.instant(TrainerEventName.TRAIN_FINISH.value, kwargs)


_singleton_lock = threading.Lock()


class DLRoverCommonEvent(CommonPredefined):
    """Events of DLRover's agent and master; one per process through ``singleton_instance()``."""

    #: Each subclass's own instance, set in its ``__dict__`` on first use (not inherited: read from ``__dict__``).
    _singleton: ClassVar[DLRoverCommonEvent]

    @classmethod
    def singleton_instance(cls) -> Any:
        with _singleton_lock:
            instance = cls.__dict__.get("_singleton")
            if instance is None:
                instance = cls()  # type: ignore[call-arg]  # called on the master's and agent's subclasses, whose __init__ names the target
                cls._singleton = instance
            return instance


class DLRoverMasterEvent(DLRoverCommonEvent):
    """The job master's events (target ``dlrover-master``)."""

    def __init__(self) -> None:
        super().__init__("dlrover-master")

    def start(self, args: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.instant(DLRoverMasterEventName.DLROVER_MASTER_START.value, {"params": args or {}, **kwargs})

    def exit(self, exit_code: int, **kwargs: Any) -> None:
        self.instant(DLRoverMasterEventName.DLROVER_MASTER_EXIT.value, {"exit_code": exit_code, **kwargs})

    def node_join(self, node_id: str, node_rank: str, node_ip: str, rdzv_round: str, **kwargs: Any) -> None:
        self.instant(DLRoverMasterEventName.DLROVER_NODE_JOIN.value,
                     {"node_id": node_id, "node_rank": node_rank, "node_ip": node_ip, "rdzv_round": rdzv_round,
                      **kwargs})

    def rendezvous(self, rendezvous_type: str, round_num: int, timeout_sec: int, max_nodes: int, min_nodes: int,
                   **kwargs: Any) -> DurationSpan:
        """From the first node joining to the last."""
        return self.duration(DLRoverCommonEventName.DLROVER_RENDEZVOUS.value,
                             {"rendezvous_type": rendezvous_type, "round_num": round_num,
                              "timeout_sec": timeout_sec, "max_nodes": max_nodes, "min_nodes": min_nodes, **kwargs})

    def network_check(self, round: int, **kwargs: Any) -> DurationSpan:  # noqa: A002 - DLRover's master API: callers pass round=
        return self.duration(DLRoverCommonEventName.DLROVER_NETWORK_CHECK.value, {"round": round, **kwargs})

    def worker_event(self, pod_name: str, from_state: str, to_state: str, reason: str, **kwargs: Any) -> None:
        self.instant(DLRoverMasterEventName.DLROVER_WORKER_EVENT.value,
                     {"pod_name": pod_name, "from_state": from_state, "to_state": to_state, "exit_reason": reason,
                      **kwargs})

    def worker_relaunch(self, pod_name: str, relaunch_pod_name: str, **kwargs: Any) -> None:
        self.instant(DLRoverMasterEventName.DLROVER_WORKER_RELAUNCH.value,
                     {"pod_name": pod_name, "relaunch_pod_name": relaunch_pod_name, **kwargs})

    def worker_create(self, pod_name: str, success: bool, **kwargs: Any) -> None:
        self.instant(DLRoverMasterEventName.DLROVER_WORKER_CREATE.value,
                     {"pod_name": pod_name, "ok": success, **kwargs})

    def worker_no_heartbeat(self, pod_name: str, timeout: int, **kwargs: Any) -> None:
        self.instant(DLRoverMasterEventName.DLROVER_WORKER_NO_HEARTBEAT.value,
                     {"pod_name": pod_name, "timeout": timeout, **kwargs})

    def fault_detect(self, reason: str, **kwargs: Any) -> None:
        self.instant(DLRoverCommonEventName.DLROVER_FAULT_DETECT.value, {"reason": reason, **kwargs})

    def train_job(self, job_name: str, args: dict[str, Any] | None = None, **kwargs: Any) -> DurationSpan:
        return self.duration(DLRoverMasterEventName.DLROVER_JOB_TRAIN.value,
                             {"job_name": job_name, "params": args, **kwargs})

    def process_restart(self, pod_name: str, **kwargs: Any) -> None:
        self.instant(DLRoverCommonEventName.DLROVER_PROCESS_RESTART.value, {"pod_name": pod_name, **kwargs})


class DLRoverAgentEvent(DLRoverCommonEvent):
    """The elastic agent's events (target ``dlrover-agent``)."""

    def __init__(self) -> None:
        super().__init__("dlrover-agent")

    def start(self, args: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.instant(DLRoverAgentEventName.DLROVER_AGENT_START.value, {"params": args or {}, **kwargs})

    def exit(self, success: bool, **kwargs: Any) -> None:
        self.instant(DLRoverAgentEventName.DLROVER_AGENT_EXIT.value, {"success": success, **kwargs})

    def rendezvous(self, rendezvous_type: str, node_name: str, node_rank: int, timeout: int, **kwargs: Any
                   ) -> DurationSpan:
        return self.duration(DLRoverCommonEventName.DLROVER_RENDEZVOUS.value,
                             {"rendezvous_type": rendezvous_type, "node_name": node_name, "node_rank": node_rank,
                              "timeout": timeout, **kwargs})

    def network_check(self, round: int, node_rank: int, **kwargs: Any) -> DurationSpan:  # noqa: A002 - DLRover's agent API: callers pass round=
        return self.duration(DLRoverCommonEventName.DLROVER_NETWORK_CHECK.value,
                             {"round": round, "node_rank": node_rank, **kwargs})

    def process_succeeded(self, node_rank: int, **kwargs: Any) -> None:
        self.instant(DLRoverCommonEventName.DLROVER_PROCESS_SUCCEEDED.value, {"node_rank": node_rank, **kwargs})

    def process_restart(self, node_rank: int, **kwargs: Any) -> None:
        self.instant(DLRoverCommonEventName.DLROVER_PROCESS_RESTART.value, {"node_rank": node_rank, **kwargs})

    def process_fail(self, node_rank: int, **kwargs: Any) -> None:
        self.instant(DLRoverCommonEventName.DLROVER_PROCESS_FAIL.value, {"node_rank": node_rank, **kwargs})

    def process_restart_membership(self, node_rank: int, **kwargs: Any) -> None:
        self.instant(DLRoverCommonEventName.DLROVER_PROCESS_RESTART_MEMBERSHIP.value,
                     {"node_rank": node_rank, **kwargs})

    def job_abortion(self, node_rank: int, reason: str, **kwargs: Any) -> None:
        self.instant(DLRoverCommonEventName.DLROVER_JOB_ABORTION.value,
                     {"caused_node_rank": node_rank, "reason": reason, **kwargs})

    def job_restart(self, node_rank: int, reason: str, **kwargs: Any) -> None:
        self.instant(DLRoverCommonEventName.DLROVER_JOB_RESTART.value,
                     {"caused_node_rank": node_rank, "reason": reason, **kwargs})
