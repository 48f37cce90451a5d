"""The step tracker's hooks in C (``native/steps.c`` StepCore) do what its Python hooks do.

Every test runs the same calls on the Python tracker (the fallback) and on the tracker with the C core under it
(``tracker_class``), and asserts what both must do: the counts, the step's state, and which transitions (a
step closing, the forward hook armed, a long wait's span, a contained error) they ask the tracker's Python for.
The transitions are recorded here instead of made, so a test needs no pipeline.
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

import pytest
from opentelemetry.instrumentation.utils import suppress_instrumentation

from otel_training import _ring
from otel_training.integrations.torch.steps import StepTracker
from otel_training.integrations.torch.tracker_class import tracker_class

NATIVE = _ring.supported("on") is None


def _core() -> type | None:
    from otel_training import _native_loader

    native = _native_loader.native("auto")
    assert native is not None
    return native.StepCore  # type: ignore[no-any-return]


KINDS = [pytest.param("python", id="python"), pytest.param("c", id="c", marks=pytest.mark.skipif(
    not NATIVE, reason=f"no C core here: {_ring.supported('on')}"))]


@pytest.fixture(params=KINDS)
def tracker(request: pytest.FixtureRequest) -> Any:
    return _make(request.param)


def _make(kind: str) -> Any:
    base = tracker_class(_core() if kind == "c" else None)

    class Recording(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.log: list[tuple[Any, ...]] = []

        def _open(self, awaiting_input: bool = False, rt: Any = None) -> None:
            self.log.append(("open",))
            self._step, self._awaiting_input, self._just_closed = Step(), awaiting_input, False

        def _close(self) -> None:
            self.log.append(("close", self._optimizer_steps, len(self._backward_ends)))
            if self._complete and self._expected is None:
                self._expected = frozenset(self._stepped)
            self._step = None
            self._number += 1
            self._reset()
            self._just_closed = True

        def _arm_forward(self) -> None:
            self.log.append(("arm",))

        def _wait_span(self, started: int, ended: int, step: Any, error: BaseException | None = None) -> None:
            self.log.append(("wait span", step is not None, type(error).__name__ if error else None))

        def _failed(self, hook: str) -> None:
            self.log.append(("failed", hook))

    made = Recording()
    made.kind = kind
    if kind == "c":
        assert type(made).__mro__[2].__name__ == "StepCore" and "StepCore" in repr(type(made).__mro__)
    return made


class Step:
    """What the hooks read of an open step."""

    def __init__(self, device: bool = False) -> None:
        self.device_step = ("timeline", "step") if device else None
        self.inputs = 0

    def input_ready(self) -> None:
        self.inputs += 1


class Optimizer:
    pass


def _open_step(tracker: Any, fetched: bool = True) -> None:
    tracker.backward_begin()  # the first backward opens the first step (and makes this thread the owner)
    tracker._fetched = fetched


def test_a_loop_without_a_loader_opens_at_backward_and_closes_at_its_optimizers_once_learned(tracker: Any) -> None:
    optimizer = Optimizer()
    _open_step(tracker, fetched=False)
    assert tracker.log == [("open",)] and tracker._owner == threading.get_ident()
    tracker.backward_end()
    tracker.optimizer_pre(optimizer, (), {})
    tracker.optimizer_post(optimizer, (), {})
    # The first step: complete, not closed (which optimizers a step waits for is learned at its close), and
    # the forward hook armed (a loop without a loader begins its next step at the forward pass).
    assert tracker.log == [("open",), ("arm",)]
    assert (tracker._complete, tracker._optimizer_steps, tracker.optimizer_calls) == (True, 1, 1)
    assert tracker._stepped == {id(optimizer)}
    tracker.backward_begin()  # the boundary: the completed step closes, the next opens
    assert tracker.log[2:] == [("close", 1, 1), ("open",)]
    assert tracker._expected == frozenset({id(optimizer)})
    tracker.backward_end()
    tracker.backward_end()
    tracker.optimizer_pre(optimizer, (), {})
    tracker.optimizer_post(optimizer, (), {})  # now known: the step closes at its optimizer
    assert tracker.log[4:] == [("close", 1, 2)] and tracker._step is None
    assert tracker.optimizer_calls == 2 and tracker._number == 2


def test_backward_ends_are_the_wall_clock(tracker: Any) -> None:
    _open_step(tracker)
    before = time.time_ns()
    tracker.backward_end()
    after = time.time_ns()
    (end,) = tracker._backward_ends
    assert type(end) is int and before <= end <= after


def test_only_the_outermost_optimizer_step_counts(tracker: Any) -> None:
    """torch runs the hooks around every class's step(): a subclass calling super().step() runs them nested."""
    optimizer = Optimizer()
    _open_step(tracker)
    tracker._expected = frozenset({id(optimizer)})
    tracker.optimizer_pre(optimizer, (), {})
    tracker.optimizer_pre(optimizer, (), {})
    tracker.optimizer_post(optimizer, (), {})
    assert tracker._step is not None and tracker._optimizer_steps == 0 and tracker._nested == {id(optimizer): 1}
    tracker.optimizer_post(optimizer, (), {})
    assert tracker.log[-1] == ("close", 1, 0) and tracker._nested == {} and tracker.optimizer_calls == 2


def test_two_optimizers_close_the_step_at_the_last(tracker: Any) -> None:
    first, second = Optimizer(), Optimizer()
    _open_step(tracker)
    tracker._expected = frozenset({id(first), id(second)})
    for optimizer in (first, second):
        tracker.optimizer_pre(optimizer, (), {})
        tracker.optimizer_post(optimizer, (), {})
        if optimizer is first:
            assert tracker._step is not None and tracker._optimizer_steps == 1
    assert tracker.log[-1] == ("close", 2, 0)


def test_a_short_wait_is_counted_and_marks_the_input_ready_once(tracker: Any) -> None:
    _open_step(tracker)
    step = tracker._step = Step(device=True)
    tracker._awaiting_input = True
    tracker.fetch_end(time.time_ns())
    tracker.fetch_end(time.time_ns())
    assert step.inputs == 1 and not tracker._awaiting_input
    assert 0 <= tracker._wait_ns < 1_000_000_000
    assert tracker.fetch_end(None) is None
    assert [entry for entry in tracker.log if entry[0] == "wait span"] == []


def test_a_long_wait_and_a_failed_fetch_get_their_span(tracker: Any) -> None:
    _open_step(tracker)
    tracker.fetch_end(time.time_ns() - 5_000_000)
    assert tracker.log[-1] == ("wait span", True, None) and tracker._wait_ns >= 5_000_000
    tracker.fetch_end(time.time_ns(), ValueError("bad batch"))
    assert tracker.log[-1] == ("wait span", True, "ValueError")
    tracker.fetch_end(time.time_ns(), StopIteration())  # the end of the data: no span
    assert tracker.log[-1] == ("wait span", True, "ValueError")


def test_another_threads_hooks_touch_nothing_of_this_threads_step(tracker: Any) -> None:
    optimizer = Optimizer()
    _open_step(tracker)
    tracker._expected = frozenset({id(optimizer)})

    def elsewhere() -> None:
        tracker.backward_end()
        tracker.fetch_end(time.time_ns() - 100)
        tracker.optimizer_pre(optimizer, (), {})
        tracker.optimizer_post(optimizer, (), {})

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join(timeout=30)
    assert tracker._step is not None and tracker._backward_ends == [] and tracker._wait_ns == 0
    assert tracker._optimizer_steps == 0 and tracker.optimizer_calls == 1  # counted: a GradScaler skip's test


def test_suppressed_optimizer_steps_are_not_the_steps(tracker: Any) -> None:
    optimizer = Optimizer()
    _open_step(tracker)
    tracker._expected = frozenset({id(optimizer)})
    with suppress_instrumentation():
        tracker.optimizer_pre(optimizer, (), {})
        tracker.optimizer_post(optimizer, (), {})
    assert tracker._step is not None and tracker._optimizer_steps == 0


def test_an_error_in_a_transition_is_contained_and_reported_once_per_call(tracker: Any) -> None:
    optimizer = Optimizer()
    _open_step(tracker)
    tracker._expected = frozenset({id(optimizer)})

    def broken() -> None:
        raise RuntimeError("broken close")

    tracker._close = broken
    tracker.optimizer_pre(optimizer, (), {})
    assert tracker.optimizer_post(optimizer, (), {}) is None  # not raised into the loop
    assert tracker.log[-1] == ("failed", "optimizer_post")


def test_odd_state_takes_the_python_path_and_still_works(tracker: Any) -> None:
    """State the C shortcut does not take (a list where a set was, a dict subclass): the Python hook's, the same."""
    optimizer = Optimizer()
    _open_step(tracker)
    tracker._expected = frozenset({id(optimizer)})

    class Counts(dict):  # type: ignore[type-arg]
        pass

    tracker._nested = Counts()
    tracker.optimizer_pre(optimizer, (), {})
    tracker.optimizer_post(optimizer, (), {})
    assert tracker.log[-1] == ("close", 1, 0) and type(tracker._nested) is Counts


def test_the_fallback_is_the_python_class_itself() -> None:
    assert tracker_class(None) is StepTracker
    if NATIVE:
        made = tracker_class(_core())
        assert made is tracker_class(_core()) and issubclass(made, StepTracker)
        assert made._py_optimizer_post is StepTracker.optimizer_post


def test_keyboard_interrupt_in_a_transition_goes_on_up(tracker: Any) -> None:
    """The hooks contain an Exception (logged once), never Ctrl-C or SystemExit: the user stops the run."""
    optimizer = Optimizer()
    _open_step(tracker)
    tracker._expected = frozenset({id(optimizer)})

    def interrupted() -> None:
        raise KeyboardInterrupt

    tracker._close = interrupted
    tracker.optimizer_pre(optimizer, (), {})
    with pytest.raises(KeyboardInterrupt):
        tracker.optimizer_post(optimizer, (), {})
    assert ("failed", "optimizer_post") not in tracker.log


@pytest.mark.parametrize("threshold", ["deleted", None, 2e6, 10**19], ids=["deleted", "none", "float", "huge"])
def test_an_odd_threshold_is_the_python_hooks_and_never_a_crash(tracker: Any, threshold: Any) -> None:
    _open_step(tracker)
    if threshold == "deleted":
        del tracker._wait_span_min_ns
    else:
        tracker._wait_span_min_ns = threshold
    tracker.fetch_end(time.time_ns() - 5_000_000)
    waits = [entry for entry in tracker.log if entry[0] in ("wait span", "failed")]
    if threshold in ("deleted", None):
        assert waits == [("failed", "fetch_end")]
    elif threshold == 2e6:
        assert waits == [("wait span", True, None)]
    else:
        assert waits == []


def test_the_threshold_is_the_trackers_field_on_both(tracker: Any) -> None:
    _open_step(tracker)
    tracker._wait_span_min_ns = 10**15
    tracker.fetch_end(time.time_ns() - 5_000_000)
    assert [entry for entry in tracker.log if entry[0] == "wait span"] == []


def test_odd_arguments_and_counts_take_the_python_path(tracker: Any) -> None:
    _open_step(tracker)

    class Nanoseconds(int):
        pass

    tracker._wait_ns = Nanoseconds(7)
    tracker.fetch_end(time.time_ns(), error=ValueError("bad batch"))  # a keyword, as the signature allows
    assert tracker.log[-1] == ("wait span", True, "ValueError")
    tracker.fetch_end(True)  # a bool is no plain start: Python's arithmetic, a 'long' wait
    assert tracker.log[-1] == ("wait span", True, None) and tracker._wait_ns > 7
    optimizer = Optimizer()
    tracker._nested = {id(optimizer): 0}  # present at 0: popped, as dict.pop does
    tracker.optimizer_post(optimizer, (), {})
    assert tracker._nested == {} and tracker._optimizer_steps == 1


def test_a_long_wait_in_another_thread_gets_a_span_outside_the_step(tracker: Any) -> None:
    _open_step(tracker)
    thread = threading.Thread(target=tracker.fetch_end, args=(time.time_ns() - 5_000_000,))
    thread.start()
    thread.join(timeout=30)
    assert tracker.log[-1] == ("wait span", False, None) and tracker._wait_ns == 0


def test_input_ready_failing_is_contained(tracker: Any) -> None:
    _open_step(tracker)

    class Broken(Step):
        def input_ready(self) -> None:
            raise RuntimeError("broken timeline")

    tracker._step = Broken(device=True)
    tracker._awaiting_input = True
    assert tracker.fetch_end(time.time_ns()) is None
    assert tracker.log[-1] == ("failed", "fetch_end") and not tracker._awaiting_input


def test_the_suppression_check_closing_the_step_mid_call(tracker: Any) -> None:
    """The check is called code: if it changed the state, the rest is the Python method's."""
    optimizer = Optimizer()
    _open_step(tracker)

    def check() -> bool:
        tracker._step = None  # as if the step had closed meanwhile
        return True

    tracker._enabled = check
    tracker.optimizer_post(optimizer, (), {})
    assert tracker._optimizer_steps == 0 and tracker._stepped == set()


@pytest.mark.parametrize("kind", KINDS)
def test_a_tracker_in_a_reference_cycle_is_collected(kind: str) -> None:
    import weakref

    tracker = _make(kind)
    _open_step(tracker)
    tracker.cycle = tracker
    tracker._step.owner = tracker
    reference = weakref.ref(tracker)
    del tracker
    gc.collect()
    assert reference() is None
