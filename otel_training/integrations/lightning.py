"""PyTorch Lightning: a ``Callback`` that reports the fit as trainer events.

    trainer = lightning.Trainer(callbacks=[OpenTelemetryCallback()])

train, epoch, step (one per optimizer step; with ``accumulate_grad_batches`` each
batch is a substep), validation as evaluate, predict, checkpoint saves with path
and bytes, and the loss and learning rate of each step.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the standalone package
    from pytorch_lightning.callbacks import Callback  # type: ignore[assignment]  # the standalone package's Callback: another class, the same hooks

from opentelemetry.trace import TracerProvider

from otel_training import semconv as sc
from otel_training._contain import contained
from otel_training.events.predefined import TrainerProcess
from otel_training.integrations.callbacks import CallbackSpans

SOURCE = "lightning"


class OpenTelemetryCallback(Callback):
    """Lightning hooks -> ``training.train/epoch/step/substep/evaluate/predict/save_checkpoint`` spans."""

    def __init__(self, events: TrainerProcess | None = None, *, tracer_provider: TracerProvider | None = None) -> None:
        super().__init__()
        self.spans = CallbackSpans(SOURCE, events, tracer_provider=tracer_provider)
        self._step_start_global = 0
        self._substep = 0
        self._trainer: Any = None

    @contained(default=None)
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.spans.own_steps()
        self._wrap_save(trainer)

    @contained(default=None)
    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.spans.end_all()
        self.spans.release_steps()
        if self._trainer is not None:
            self._trainer.__dict__.pop("save_checkpoint", None)
            self._trainer = None

    # -- fit --------------------------------------------------------------
    @contained(default=None)
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.spans.begin("train", self.spans.events.train(max_epochs=trainer.max_epochs))

    @contained(default=None)
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.spans.end("step")
        self.spans.end("train", global_step=trainer.global_step)

    @contained(default=None)
    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.spans.begin("epoch", self.spans.events.epoch(epoch=trainer.current_epoch))

    @contained(default=None)
    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.spans.end("step")
        self.spans.end("epoch")

    @contained(default=None)
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if not self.spans.is_open("step"):
            self._step_start_global = trainer.global_step
            self._substep = 0
            self.spans.begin("step", self.spans.events.step(global_step=trainer.global_step))
        if trainer.accumulate_grad_batches > 1:
            self.spans.begin("substep", self.spans.events.substep(substep=self._substep, batch_idx=batch_idx))

    @contained(default=None)
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        metrics: dict[str, Any] = {}
        if loss is not None:
            metrics["loss"] = loss.detach() if hasattr(loss, "detach") else loss
        if trainer.optimizers:
            metrics["lr"] = trainer.optimizers[0].param_groups[0]["lr"]
        self.spans.log(metrics)
        self.spans.end("substep")
        self._substep += 1
        if trainer.global_step != self._step_start_global or trainer.is_last_batch:
            self.spans.end("step", **{sc.STEP_SUBSTEPS: self._substep})

    # -- evaluation and prediction ------------------------------------------
    @contained(default=None)
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self.spans.begin("evaluate", self.spans.events.evaluate(global_step=trainer.global_step))

    @contained(default=None)
    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        metrics = {key: value for key, value in trainer.callback_metrics.items() if key.startswith("val")}
        self.spans.log(metrics)
        self.spans.end("evaluate")

    @contained(default=None)
    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        self.spans.begin("predict", self.spans.events.predict())

    @contained(default=None)
    def on_predict_end(self, trainer: Any, pl_module: Any) -> None:
        self.spans.end("predict")

    @contained(default=None)
    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.spans.fail_all(exception)

    # -- checkpoints ----------------------------------------------------------
    def _wrap_save(self, trainer: Any) -> None:
        """Lightning has no hook after a checkpoint is written: wrap this trainer's save."""
        if "save_checkpoint" in trainer.__dict__:
            return
        original = trainer.save_checkpoint
        events = self.spans.events

        def save_checkpoint(filepath: Any, *args: Any, **kwargs: Any) -> Any:
            path = os.fspath(filepath)
            with events.save(path=path, step=trainer.global_step) as save:
                save.extra_args(**{sc.INSTRUMENTATION_SOURCE: SOURCE, sc.CHECKPOINT_FORMAT: "lightning"})
                with _outer_checkpoint():
                    result = original(filepath, *args, **kwargs)
                _record_size(save, path)
            return result

        trainer.save_checkpoint = save_checkpoint
        self._trainer = trainer


def _outer_checkpoint() -> Any:
    module = sys.modules.get("otel_training.integrations.torch.checkpoint")
    return module.outer_checkpoint() if module is not None else contextlib.nullcontext()


@contained(default=None)
def _record_size(save: Any, path: str) -> None:
    if os.path.isfile(path):
        save.extra_args(**{sc.CHECKPOINT_BYTES: os.path.getsize(path)})
