"""Keras 3: a ``Callback`` that reports ``fit``/``evaluate``/``predict`` as trainer events.

    model.fit(x, y, callbacks=[OpenTelemetryCallback()])

Works with any Keras backend; with the torch backend the torch instrumentor's
own step spans are suspended while the callback reports steps.
"""

from __future__ import annotations

from typing import Any

import keras
from opentelemetry.trace import TracerProvider

from otel_training import semconv as sc
from otel_training._contain import contained
from otel_training.events.predefined import TrainerProcess
from otel_training.integrations.callbacks import CallbackSpans

SOURCE = "keras"


class OpenTelemetryCallback(keras.callbacks.Callback):  # type: ignore[misc]  # keras ships no type information: its Callback is Any
    """Keras hooks -> ``training.train/epoch/step/evaluate/predict/predict_step`` spans."""

    def __init__(self, events: TrainerProcess | None = None, *, tracer_provider: TracerProvider | None = None) -> None:
        super().__init__()
        self.spans = CallbackSpans(SOURCE, events, tracer_provider=tracer_provider)
        self._global_step = 0

    @contained(default=None)
    def on_train_begin(self, logs: Any = None) -> None:
        self.spans.own_steps()
        self.spans.begin("train", self.spans.events.train())

    @contained(default=None)
    def on_train_end(self, logs: Any = None) -> None:
        self.spans.log(logs)
        self.spans.end_all()
        self.spans.release_steps()

    @contained(default=None)
    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.spans.begin("epoch", self.spans.events.epoch(epoch=epoch))

    @contained(default=None)
    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.spans.log(logs)
        self.spans.end("epoch")

    @contained(default=None)
    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self.spans.begin("step", self.spans.events.step(global_step=self._global_step, batch=batch))

    @contained(default=None)
    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.spans.log(logs)
        self.spans.end("step", **{sc.STEP_SUBSTEPS: 1})
        self._global_step += 1

    @contained(default=None)
    def on_test_begin(self, logs: Any = None) -> None:
        self.spans.begin("evaluate", self.spans.events.evaluate(global_step=self._global_step))

    @contained(default=None)
    def on_test_end(self, logs: Any = None) -> None:
        self.spans.log(logs)
        self.spans.end("evaluate")

    @contained(default=None)
    def on_predict_begin(self, logs: Any = None) -> None:
        self.spans.begin("predict", self.spans.events.predict())

    @contained(default=None)
    def on_predict_end(self, logs: Any = None) -> None:
        self.spans.end("predict")

    @contained(default=None)
    def on_predict_batch_begin(self, batch: int, logs: Any = None) -> None:
        self.spans.begin("predict_step", self.spans.events.predict_step(step=batch))

    @contained(default=None)
    def on_predict_batch_end(self, batch: int, logs: Any = None) -> None:
        self.spans.end("predict_step")
