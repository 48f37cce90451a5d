"""Hugging Face transformers: a ``TrainerCallback`` that reports training as trainer events.

    Trainer(..., callbacks=[OpenTelemetryCallback()])

train, epoch, step (one per optimizer step, with a substep per micro-batch under
gradient accumulation), evaluate and predict (from the first prediction step to
the metrics), checkpoint saves with path and bytes, and ``on_log`` metrics
(loss, learning rate, grad norm) as log events.
"""

from __future__ import annotations

import os
import time
from typing import Any

from opentelemetry.trace import TracerProvider
from transformers import TrainerCallback

from otel_training import semconv as sc
from otel_training._contain import contained
from otel_training.events.past_spans import record_span
from otel_training.events.predefined import TrainerProcess
from otel_training.integrations.callbacks import CallbackSpans

SOURCE = "transformers"


class OpenTelemetryCallback(TrainerCallback):
    """HF ``Trainer`` hooks -> ``training.*`` spans."""

    def __init__(self, events: TrainerProcess | None = None, *, tracer_provider: TracerProvider | None = None) -> None:
        self.spans = CallbackSpans(SOURCE, events, tracer_provider=tracer_provider)
        self._substep = 0
        self._last_ns = time.time_ns()

    def _mark(self) -> None:
        self._last_ns = time.time_ns()

    @contained(default=None)
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.spans.own_steps()
        self.spans.begin("train", self.spans.events.train(max_steps=state.max_steps, epochs=args.num_train_epochs))

    @contained(default=None)
    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.spans.end_all()
        self.spans.release_steps()

    @contained(default=None)
    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.spans.begin("epoch", self.spans.events.epoch(epoch=int(state.epoch or 0)))

    @contained(default=None)
    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.spans.end("epoch")

    @contained(default=None)
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.spans.begin("step", self.spans.events.step(global_step=state.global_step))
        self._substep = 0
        if args.gradient_accumulation_steps > 1:
            self.spans.begin("substep", self.spans.events.substep(substep=0))

    @contained(default=None)
    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.spans.end("substep")
        self._substep += 1
        self.spans.begin("substep", self.spans.events.substep(substep=self._substep))

    @contained(default=None)
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.spans.end("substep")
        self.spans.end("step", **{sc.STEP_SUBSTEPS: self._substep + 1})
        self._mark()

    @contained(default=None)
    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        self.spans.log(logs)
        self._mark()

    @contained(default=None)
    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.spans.is_open("evaluate"):
            self.spans.begin("evaluate", self.spans.events.evaluate(global_step=state.global_step))

    @contained(default=None)
    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        self._end_prediction("evaluate", metrics)

    @contained(default=None)
    def on_predict(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        self._end_prediction("predict", metrics)

    def _end_prediction(self, kind: str, metrics: Any) -> None:
        if not self.spans.is_open("evaluate"):  # no prediction step seen: an empty span
            duration = self.spans.events.evaluate() if kind == "evaluate" else self.spans.events.predict()
            self.spans.begin("evaluate", duration)
        self.spans.log(metrics)
        self.spans.end("evaluate")
        self._mark()

    @contained(default=None)
    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Reported after the checkpoint is written: a span from the previous hook to now."""
        path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        attributes: dict[str, Any] = {
            sc.CHECKPOINT_PATH: path,
            sc.CHECKPOINT_STEP: state.global_step,
            sc.CHECKPOINT_FORMAT: "transformers",
            sc.INSTRUMENTATION_SOURCE: SOURCE,
        }
        size = _directory_bytes(path)
        if size is not None:
            attributes[sc.CHECKPOINT_BYTES] = size
        record_span(sc.SPAN_SAVE_CHECKPOINT, "#save_ckpt", self._last_ns, time.time_ns(), attributes,
                    events=self.spans.events.events_runtime())
        self._mark()


def _directory_bytes(path: str) -> int | None:
    if not os.path.isdir(path):
        return None
    return sum(os.path.getsize(os.path.join(root, name)) for root, _dirs, files in os.walk(path) for name in files)
