"""The predefined processes: trainer, elastic agent and master events.

Method names and DLRover event names (``#step``, ``#rendezvous``...) follow
DLRover's training-event exporter so code written against it reads the same;
span names and attributes come from ``otel_training.semconv``.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import TracerProvider

from otel_training import semconv as sc
from otel_training.events.attributes import METRIC_PREFIX, to_attributes
from otel_training.events.duration import Duration
from otel_training.events.process import Process
from otel_training.events.span_kinds import HostWork, StepDuration


def _given(**values: Any) -> dict[str, Any] | None:
    attributes = {key: value for key, value in values.items() if value is not None}
    return attributes or None


class TrainerProcess(Process):
    """Events of a training process (one per rank)."""

    def __init__(self, target: str = sc.TARGET_TRAINER, *, tracer_provider: TracerProvider | None = None) -> None:
        super().__init__(target, tracer_provider=tracer_provider)

    # Instants.
    def start(self, **content: object) -> None:
        """The process started (with its parameters, e.g. the config)."""
        self.instant("#start", content)

    def init_end(self, **content: object) -> None:
        self.instant("#init_end", content)

    def finish(self, **content: object) -> None:
        self.instant("#finish", content)

    def log(self, **metrics: object) -> None:
        """Metrics (loss, learning rate...) as an event on the current span."""
        late: list[tuple[str, Any]] = []
        attributes = to_attributes(metrics, unnamed_prefix=METRIC_PREFIX, late=late)
        self._event("#log", "#log", attributes, late)

    # Durations.
    def init(self, **content: object) -> Duration:
        return self._span(sc.SPAN_INIT, "#init", None, content, HostWork)

    def load_dataset(self, **content: object) -> Duration:
        return self._span(sc.SPAN_LOAD_DATASET, "#load_dataset", None, content, HostWork)

    def load_ckpt(self, path: str | None = None, step: int | None = None, **content: object) -> Duration:
        return self._span(sc.SPAN_LOAD_CHECKPOINT, "#load_ckpt",
                          _given(**{sc.CHECKPOINT_PATH: path, sc.CHECKPOINT_STEP: step}), content,
                          HostWork)

    def persist_ckpt(self, path: str | None = None, step: int | None = None, **content: object) -> Duration:
        return self._span(sc.SPAN_PERSIST_CHECKPOINT, "#persist_ckpt",
                          _given(**{sc.CHECKPOINT_PATH: path, sc.CHECKPOINT_STEP: step}), content,
                          HostWork)

    def save(self, path: str | None = None, step: int | None = None, **content: object) -> Duration:
        """Saving a checkpoint (the blocking part)."""
        return self._span(sc.SPAN_SAVE_CHECKPOINT, "#save_ckpt",
                          _given(**{sc.CHECKPOINT_PATH: path, sc.CHECKPOINT_STEP: step}), content,
                          HostWork)

    def train(self, **content: object) -> Duration:
        return self._span(sc.SPAN_TRAIN, "#train", None, content, HostWork)

    def epoch(self, epoch: int | None = None, **content: object) -> Duration:
        return self._span(sc.SPAN_EPOCH, "#epoch", _given(**{sc.EPOCH: epoch}), content)

    def step(self, global_step: int | None = None, **content: object) -> Duration:
        # The hot path of the events API: no helper calls on the way to the span.
        return StepDuration(self, sc.SPAN_STEP, content, event_name="#step",
                            attributes=None if global_step is None else {sc.STEP: global_step})

    def data_wait(self, **content: object) -> Duration:
        """The wait for the next batch, inside a step (``batch = next(batches)``): counted as data loading, as
        the torch instrumentor counts a blocking DataLoader fetch, not as the step's work or host time."""
        return self._span(sc.SPAN_DATA_WAIT, "#data_wait", None, content)

    def substep(self, substep: int | None = None, **content: object) -> Duration:
        return self._span(sc.SPAN_SUBSTEP, "#substep", _given(**{sc.SUBSTEP: substep}), content)

    def evaluate(self, **content: object) -> Duration:
        return self._span(sc.SPAN_EVALUATE, "#evaluate", None, content, HostWork)

    def predict(self, **content: object) -> Duration:
        return self._span(sc.SPAN_PREDICT, "#predict", None, content, HostWork)

    def predict_step(self, step: int | None = None, **content: object) -> Duration:
        return self._span(sc.SPAN_PREDICT_STEP, "#predict_step", _given(**{sc.STEP: step}), content)


class AgentProcess(Process):
    """Events of an elastic agent (one per node): rendezvous, restarts, exit."""

    def __init__(self, target: str = sc.TARGET_AGENT) -> None:
        super().__init__(target)

    def start(self, **content: object) -> None:
        self.instant("#start", content)

    def exit(self, exit_code: int | None = None, **content: object) -> None:
        if exit_code is not None:
            content[sc.ELASTIC_EXIT_CODE] = exit_code
        self.instant("#exit", content)

    def node_join(self, node_id: str | int | None = None, **content: object) -> Duration:
        return self._span(sc.SPAN_NODE_JOIN, "#node_join", _given(**{sc.ELASTIC_NODE_ID: node_id}), content)

    def rendezvous(self, round: int | None = None, **content: object) -> Duration:  # noqa: A002 - DLRover's name
        return self._span(sc.SPAN_RENDEZVOUS, "#rendezvous", _given(**{sc.ELASTIC_RENDEZVOUS_ROUND: round}), content)

    def network_check(self, round: int | None = None, **content: object) -> Duration:  # noqa: A002 - DLRover's name
        return self._span(sc.SPAN_NETWORK_CHECK, "#network_check",
                          _given(**{sc.ELASTIC_RENDEZVOUS_ROUND: round}), content)

    def elastic_train(self, **content: object) -> Duration:
        return self._span(sc.SPAN_ELASTIC_TRAIN, "#elastic_train", None, content)

    def process_restart(self, reason: str | None = None, **content: object) -> Duration:
        return self._span(sc.SPAN_PROCESS_RESTART, "#process_restart",
                          _given(**{sc.ELASTIC_RESTART_REASON: reason}), content)


class MasterProcess(Process):
    """Events of the job master: pods, faults and repairs."""

    def __init__(self, target: str = sc.TARGET_MASTER) -> None:
        super().__init__(target)

    def pod_create(self, pod_name: str | None = None, **content: object) -> Duration:
        return self._span(sc.SPAN_POD_CREATE, "#pod_create", _given(**{sc.K8S_POD_NAME: pod_name}), content)

    def pod_change(self, pod_name: str | None = None, **content: object) -> None:
        if pod_name is not None:
            content[sc.K8S_POD_NAME] = pod_name
        self.instant("#pod_change", content)

    def pod_relaunch(self, pod_name: str | None = None, **content: object) -> Duration:
        return self._span(sc.SPAN_POD_RELAUNCH, "#pod_relaunch", _given(**{sc.K8S_POD_NAME: pod_name}), content)

    def fault_detect(self, reason: str | None = None, **content: object) -> Duration:
        return self._span(sc.SPAN_FAULT_DETECT, "#fault_detect", _given(**{sc.ELASTIC_FAULT_REASON: reason}), content)

    def repair(self, reason: str | None = None, **content: object) -> Duration:
        return self._span(sc.SPAN_REPAIR, "#repair", _given(**{sc.ELASTIC_FAULT_REASON: reason}), content)
