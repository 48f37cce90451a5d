"""DLRover's event, target and warning names, exactly as DLRover spells them.

They are what DLRover's master and tools match on, so they live apart from the
code that writes them: the emitter, the predefined processes and the error
handler all read them, and none of those may change them.
"""

from __future__ import annotations

import enum


class EventTargetName:
    """The targets whose ``#step``, ``#save`` and ``#evaluate`` events DLRover's master collects."""

    TRAINER = "AtorchTrainerV2"
    SAVER = "AsyncSaver"


class EventTypeName:
    BEGIN = "BEGIN"
    END = "END"
    INSTANT = "INSTANT"


class EventType(enum.Enum):
    """A BEGIN and its END share an event id; an INSTANT stands alone."""

    BEGIN = enum.auto()
    END = enum.auto()
    INSTANT = enum.auto()


class TrainerEventName(enum.Enum):
    TRAIN_START = "#start"
    TRAIN_INIT = "#init"
    TRAIN_LOAD_DATASET = "#load_dataset"
    TRAIN_LOAD_CKPT = "#load_ckpt"
    TRAIN_PERSIST_CKPT = "#persist_ckpt"
    TRAIN_FINISH = "#finish"
    TRAIN_INIT_END = "#init_end"
    TRAIN = "#train"
    EPOCH = "#epoch"
    TRAIN_STEP = "#step"
    TRAIN_SUBSTEP = "#substep"
    EVALUATE = "#evaluate"
    PREDICT = "#predict"
    PREDICT_STEP = "#predict_step"
    SAVE = "#save"
    LOG = "#log"


class DLRoverCommonEventName(enum.Enum):
    DLROVER_RENDEZVOUS = "#rendezvous"
    DLROVER_PROCESS_RESTART = "#process_restart"
    DLROVER_PROCESS_RESTART_MEMBERSHIP = "#process_restart_membership"
    DLROVER_PROCESS_SUCCEEDED = "#process_succeeded"
    DLROVER_PROCESS_FAIL = "#process_fail"
    DLROVER_FAULT_DETECT = "#fault_detect"
    DLROVER_FAULT_TOLERANCE = "#fault_tolerance"
    DLROVER_PRE_CHECK = "#pre_check"
    DLROVER_NETWORK_CHECK = "#network_check"
    DLROVER_JOB_ABORTION = "#job_abortion"
    DLROVER_JOB_RESTART = "#job_restart"


class DLRoverMasterEventName(enum.Enum):
    DLROVER_MASTER_START = "#master_start"
    DLROVER_MASTER_EXIT = "#master_exit"
    DLROVER_WORKER_CREATE = "#worker_create"
    DLROVER_WORKER_RELAUNCH = "#worker_relaunch"
    DLROVER_WORKER_NO_HEARTBEAT = "#worker_no_heartbeat"
    DLROVER_WORKER_EVENT = "#worker_event"
    DLROVER_JOB_TRAIN = "#job_train"
    DLROVER_NODE_JOIN = "#node_join"


class DLRoverAgentEventName(enum.Enum):
    DLROVER_AGENT_START = "#agent_start"
    DLROVER_AGENT_EXIT = "#agent_exit"


class CommonEventName:
    WARNING = "#warning"
    EXCEPTION = "#exception"


class WarningType:
    DEPRECATED = "deprecated"
