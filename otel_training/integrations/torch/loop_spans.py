"""The training loop's own spans in a zero-code run: ``training.train``, one ``training.epoch`` per pass, and
``training.evaluate`` for the batches fetched without gradients between steps.

Without them an unmodified script's steps were each a trace of their own (201
traces for a 200-step script in Jaeger, issue 30), where the README promises one
trace per rank's run rooted at ``training.train``, and where the manual API gives
one. So the step tracker begins, detached as its steps are:

* ``training.train`` at the first sign of training (the first step, or a
  checkpoint or process-group call before it), ended when the pipeline closes
  (at exit, ended ERROR by the lifecycle hooks if the process dies of an
  exception or a signal) or the instrumentation is removed;
* ``training.epoch`` (``training.epoch`` = 0, 1, ...) from the first training
  fetch of a new ``DataLoader`` iterator until the next training iterator
  begins or training ends: what a loop does after its pass (the evaluation, the
  checkpoint save) belongs to the epoch, as in the manual API and the README's
  trace layout. A loop without a DataLoader has steps right under
  ``training.train``.

Steps, data waits, evaluations and checkpoint spans begin in the context where
the innermost of them is current, so they nest; the trace budget
(``trace_max_spans``, ``trace_max_age_s``) continues a long run in linked trace
segments as it does for the manual API. A loop framed by the user's own spans
(the events API, a framework callback's) gets none of these: its steps nest in
the user's spans as before.
"""

from __future__ import annotations

import contextvars
import weakref
from collections.abc import Callable
from typing import Any

from opentelemetry.trace import Span

from otel_training import semconv as sc
from otel_training.events.duration import Duration, current_duration
from otel_training.events.predefined import TrainerProcess

SOURCE = "torch"


class LoopSpans:
    """``training.train`` and the epochs of one step tracker (``steps.StepTracker``)."""

    #: Slots: the C core's fetch and opening read ``started``, ``epoch_iterator``, ``evaluation`` and ``parent`` on
    #: every step (native/steps.c), at a field's cost.
    __slots__ = ("_trainer", "_train", "_epoch", "epoch_iterator", "_epochs", "context", "parent", "_train_context",
                 "declined", "started", "evaluation")

    def __init__(self, trainer: TrainerProcess) -> None:
        self._trainer = trainer
        self._train: Duration | None = None
        self._epoch: Duration | None = None
        #: The iterator of the epoch open now (a weak reference, or a closure for an iterator without them; None:
        #: none): read by the fetch hook, which calls ``fetched`` only for another iterator (a new epoch's first fetch).
        self.epoch_iterator: Callable[[], object] | None = None
        self._epochs = 0
        #: The context the loop's work begins in: its epoch's or its train span's, or None (the caller's).
        #: An attribute, not a property: the step tracker reads it on every step. Read-only outside.
        self.context: contextvars.Context | None = None
        #: The Duration current in ``context`` (the epoch or the train span), or None: a step begins under it
        #: directly (``Duration._begin``'s ``under``), without entering the context. Read-only outside.
        self.parent: Duration | None = None
        self._train_context: contextvars.Context | None = None
        #: The user's own spans frame the loop: no train or epoch of ours.
        self.declined = False
        #: ``training()`` has nothing left to do (its train span is open, or it declined): the step tracker
        #: reads it on every fetch instead of calling. Read-only outside.
        self.started = False
        #: The open ``training.evaluate`` span, if any (read-only outside: the step tracker ends it through
        #: ``end_evaluation`` when one is open, without a call on every step).
        self.evaluation: Duration | None = None

    @property
    def span(self) -> Span | None:
        """The innermost open one's span, for work recorded after the fact (a data wait outside any step)."""
        innermost = self.evaluation or self._epoch or self._train
        return innermost.span if innermost is not None else None

    def training(self) -> None:
        """Training work begins (a step, a checkpoint, a process group): ``training.train`` once, unless the
        caller's own Duration frames it."""
        if self._train is not None or self.declined:
            return
        if current_duration() is not None:
            self.declined = self.started = True
            return
        train = self._trainer.train(**{sc.INSTRUMENTATION_SOURCE: SOURCE})
        train.begin_detached()
        self._train = train
        self.started = True
        self.context = self._train_context = train.context()
        self.parent = train

    def fetched(self, iterator: Any) -> None:
        """A training fetch from ``iterator``: a new iterator is a new epoch (the previous one ends)."""
        if self._train is None or self._train_context is None:
            return
        previous = self.epoch_iterator() if self.epoch_iterator is not None else None
        if previous is iterator:
            return
        self.end_epoch()
        epoch = self._trainer.epoch(epoch=self._epochs, **{sc.INSTRUMENTATION_SOURCE: SOURCE})
        self._train_context.run(epoch.begin_detached)
        self._epochs += 1
        self._epoch = epoch
        self.context, self.parent = epoch.context(), epoch
        try:
            self.epoch_iterator = weakref.ref(iterator)
        except TypeError:  # an iterator without weak references: kept by identity until the next one
            self.epoch_iterator = lambda: iterator

    def end_epoch(self) -> None:
        epoch, self._epoch, self.epoch_iterator = self._epoch, None, None
        if epoch is not None:
            epoch.end()
            self.context, self.parent = self._train_context, self._train

    def begin_evaluation(self) -> None:
        """A ``training.evaluate`` span from the first batch fetched without gradients after a step until the
        next step opens: host work, so the time between steps it covers is no hang (``host_gaps.py``), and
        goodput counts it as evaluation."""
        if self.evaluation is None:
            self.evaluation = self._trainer.evaluate(**{sc.INSTRUMENTATION_SOURCE: SOURCE})
            if self.context is None:
                self.evaluation.begin_detached()
            else:
                self.context.run(self.evaluation.begin_detached)

    def end_evaluation(self) -> None:
        evaluation, self.evaluation = self.evaluation, None
        if evaluation is not None:
            evaluation.end()

    def close(self) -> None:
        """Training ends (the pipeline closes, the instrumentation is removed)."""
        self.end_evaluation()
        self.end_epoch()
        train, self._train, self.context, self._train_context, self.parent = self._train, None, None, None, None
        self.started = self.declined
        if train is not None:
            train.end()
