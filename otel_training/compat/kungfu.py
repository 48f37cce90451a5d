"""KungFu's failure-detector functions, as otel-training step spans.

A script switches by changing one import (this is the only import path)::

    from otel_training.compat.kungfu import monitor_batch_begin, monitor_batch_end

A KungFu-instrumented script calls ``monitor_batch_begin()`` / ``monitor_batch_end()``
around each batch, ``monitor_epoch_end()`` after each epoch and
``monitor_train_end()`` at the end; KungFu's monitor then declares the rank stuck
when END does not follow BEGIN within 10 s. Changing the import to this module
turns the same calls into ``training.train`` / ``training.epoch`` /
``training.step`` spans (global step and epoch counted here), which the stuck
detector (``stuck_threshold_s``, ``stuck_adaptive``) and the watchdog watch.

Every function is contained and safe to call out of order: a batch end without
a begin is ignored, a begin while a batch is open ends the open one first.
"""

from __future__ import annotations

import threading

from otel_training._contain import contained
from otel_training.events.duration import Duration
from otel_training.events.predefined import TrainerProcess

__all__ = ["monitor_batch_begin", "monitor_batch_end", "monitor_epoch_end", "monitor_train_end"]


class _Monitor:
    """The state KungFu keeps in its C++ monitor: where we are in training."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.trainer = TrainerProcess()
        self.train: Duration | None = None
        self.epoch: Duration | None = None
        self.step: Duration | None = None
        self.global_step = 0
        self.epoch_index = 0

    def batch_begin(self) -> None:
        with self.lock:
            if self.step is not None:
                self.step.end()
            if self.train is None:
                self.train = self.trainer.train().begin()
            if self.epoch is None:
                self.epoch = self.trainer.epoch(epoch=self.epoch_index).begin()
            self.step = self.trainer.step(global_step=self.global_step).begin()

    def batch_end(self) -> None:
        with self.lock:
            self._end_step()

    def epoch_end(self) -> None:
        with self.lock:
            self._end_step()
            if self.epoch is not None:
                self.epoch.end()
                self.epoch = None
            self.epoch_index += 1

    def train_end(self) -> None:
        with self.lock:
            self._end_step()
            for duration in (self.epoch, self.train):
                if duration is not None:
                    duration.end()
            self.epoch = self.train = None

    def _end_step(self) -> None:
        if self.step is not None:
            self.step.end()
            self.step = None
            self.global_step += 1


_monitor = _Monitor()


@contained(default=None)
def monitor_batch_begin() -> None:
    """A batch (step) begins: opens the step span, and the train and epoch spans if needed."""
    _monitor.batch_begin()


@contained(default=None)
def monitor_batch_end() -> None:
    """The batch ended: ends the step span and counts the global step."""
    _monitor.batch_end()


@contained(default=None)
def monitor_epoch_end() -> None:
    """The epoch ended: ends its span; the next batch opens the next epoch."""
    _monitor.epoch_end()


@contained(default=None)
def monitor_train_end() -> None:
    """Training ended: ends the epoch and train spans."""
    _monitor.train_end()


def _reset() -> None:
    """Start over (tests, or a new training run in the same process)."""
    global _monitor
    _monitor = _Monitor()
