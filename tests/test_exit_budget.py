"""The way out's budget (``pipeline/exit_budget.py``), on an injected clock: spent once, however many flushes."""

from __future__ import annotations

import pytest

from otel_training.pipeline.exit_budget import ExitBudget


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_each_exit_flush_gets_what_the_ones_before_left() -> None:
    clock = Clock()
    budget = ExitBudget(2.0, clock)
    given: list[float] = []

    def flush(seconds: float) -> str:
        given.append(seconds)
        clock.now += 1.5  # a collector that never answers: the flush takes most of what it was given
        return "flushed"

    assert budget.spend(flush) == "flushed"
    assert budget.spend(flush) == "flushed"
    assert budget.spend(flush) == "flushed"
    assert given == [2.0, 0.5, 0.0]
    assert budget.left_s() == 0.0


def test_time_between_flushes_is_not_charged() -> None:
    clock = Clock()
    budget = ExitBudget(2.0, clock)
    budget.spend(lambda seconds: clock.__setattr__("now", clock.now + 0.5))
    clock.now += 60.0  # the main thread died; non-daemon threads went on for a minute
    assert budget.left_s() == 1.5


def test_a_flush_in_progress_counts_for_another_thread_asking() -> None:
    clock = Clock()
    budget = ExitBudget(2.0, clock)
    seen: list[float] = []

    def flush(seconds: float) -> None:
        clock.now += 0.75
        seen.append(budget.left_s())  # a signal's handler, asking during the hook's flush

    budget.spend(flush)
    assert seen == [1.25] and budget.left_s() == 1.25


def test_a_flush_that_raises_is_charged_too() -> None:
    clock = Clock()
    budget = ExitBudget(1.0, clock)

    def flush(seconds: float) -> None:
        clock.now += 0.4
        raise RuntimeError("exporter")

    with pytest.raises(RuntimeError):
        budget.spend(flush)
    assert budget.left_s() == pytest.approx(0.6)
