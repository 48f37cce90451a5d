"""What the Lightning, Hugging Face and Keras callbacks share: the open trainer spans.

A framework reports an event's beginning and end through two hooks, and its
exception hook (if any) must end whatever is open. So each callback keeps its
open ``Duration``s by kind ("train", "epoch", "step"...), ends a stale one of
the same kind before beginning a new one, and fails them all, innermost first,
on an exception. While a callback drives the steps, the torch instrumentor's own
step spans are suspended so a step is not reported twice.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from opentelemetry.trace import TracerProvider

from otel_training import semconv as sc
from otel_training._contain import contained
from otel_training.events.duration import Duration
from otel_training.events.predefined import TrainerProcess

_TORCH_INSTRUMENTOR = "otel_training.integrations.torch.instrumentor"


class CallbackSpans:
    """Open spans of one framework callback, by kind."""

    def __init__(self, source: str, events: TrainerProcess | None = None, *,
                 tracer_provider: TracerProvider | None = None) -> None:
        self.source = source
        # ``tracer_provider``: as contrib's instrumentors, spans go there instead of the pipeline's.
        self.events = events or TrainerProcess(tracer_provider=tracer_provider)
        self._open: dict[str, Duration] = {}
        self._resume: Callable[[], None] | None = None

    def is_open(self, kind: str) -> bool:
        return kind in self._open

    @contained(default=None)
    def begin(self, kind: str, duration: Duration) -> None:
        if kind in self._open:
            self.end(kind)
        duration.extra_args(**{sc.INSTRUMENTATION_SOURCE: self.source})
        self._open[kind] = duration.begin()

    @contained(default=None)
    def end(self, kind: str, **content: Any) -> None:
        duration = self._open.pop(kind, None)
        if duration is None:
            return
        if content:
            duration.extra_args(**content)
        duration.end()

    @contained(default=None)
    def fail_all(self, error: BaseException) -> None:
        for kind in reversed(list(self._open)):
            self._open.pop(kind).fail(error)

    @contained(default=None)
    def end_all(self) -> None:
        for kind in reversed(list(self._open)):
            self.end(kind)

    @contained(default=None)
    def log(self, metrics: Any) -> None:
        if metrics:
            self.events.log(**{str(key): value for key, value in dict(metrics).items()})

    @contained(default=None)
    def own_steps(self) -> None:
        """Suspend the torch instrumentor's step spans (if torch is instrumented)."""
        module = sys.modules.get(_TORCH_INSTRUMENTOR)
        if module is not None and self._resume is None:
            self._resume = module.suspend_steps()

    @contained(default=None)
    def release_steps(self) -> None:
        resume, self._resume = self._resume, None
        if resume is not None:
            resume()
