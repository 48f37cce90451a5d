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

        def arm_forward(self) -> None:
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


# -- the step's close and its making (``_close``, ``_make_step``): the C core's against the Python methods --------
class Ending:
    """An open step that records how it was ended (and the collectives' attributes, on the Python path)."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.ended: list[dict[str, Any]] = []
        self.extra: dict[str, Any] = {}
        self.fail = fail
        self.device_step = None

    def end(self, attributes: dict[str, Any] | None = None) -> None:
        if self.fail is not None:
            raise self.fail
        self.ended.append(dict(attributes or {}))

    def extra_args(self, **content: Any) -> None:
        self.extra.update(content)


def _closing(kind: str) -> Any:
    """A tracker whose ``_close`` is its class's own (the C core's on ``c``), with an open, complete step."""
    base = tracker_class(_core() if kind == "c" else None)

    class Closing(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.armed = 0

        def arm_forward(self) -> None:
            self.armed += 1

    made = Closing()
    optimizer = Optimizer()
    made._owner = threading.get_ident()
    made._step, made._ctx = Ending(), object()
    made._stepped, made._complete, made._optimizer_steps = {id(optimizer)}, True, 1
    made._backward_ends.append(time.time_ns())
    made._wait_ns, made._number, made._start_ns = 2_500_000, 7, time.time_ns()
    return made


def _after_close(tracker: Any) -> tuple[Any, ...]:
    return (tracker._step, tracker._ctx, tracker._number, tracker._backward_ends, tracker._stepped,
            tracker._optimizer_steps, tracker._fetched, tracker._complete, tracker._wait_ns, tracker._start_ns,
            tracker._just_closed, tracker._expected is not None and len(tracker._expected))


@pytest.mark.parametrize("fetched", [True, False], ids=["loader", "no-loader"])
def test_a_step_closes_with_its_counts_and_the_state_is_the_next_steps_on_both(fetched: bool) -> None:
    seen = {}
    for kind in [param.values[0] for param in KINDS if NATIVE or param.values[0] == "python"]:
        tracker = _closing(kind)
        tracker._fetched = fetched
        step = tracker._step
        tracker._close()
        assert step.ended == [{"training.step.substeps": 1, "training.step.optimizer_steps": 1,
                               "training.step.skipped": False, "training.step.data_wait_s": 0.0025}], kind
        assert type(step.ended[0]["training.step.data_wait_s"]) is float
        assert tracker.armed == (0 if fetched else 1), kind  # a loop without a loader: its forward opens the next
        seen[kind] = _after_close(tracker)
        assert seen[kind] == (None, None, 8, [], set(), 0, False, False, 0, 0, True, 1), kind
        tracker._close()  # nothing open: nothing happens
        assert tracker._number == 8 and len(step.ended) == 1
    assert len(set(map(repr, seen.values()))) == 1


def test_a_skipped_step_and_odd_state_close_alike_on_both() -> None:
    """No optimizer step (a GradScaler skip): skipped; a wait that is a float or a number past int64 goes to the
    Python method, which the C core hands it to before any change."""
    results = []
    for kind in [param.values[0] for param in KINDS if NATIVE or param.values[0] == "python"]:
        for wait in (0, 1.5e6, 2**70):
            tracker = _closing(kind)
            tracker._optimizer_steps, tracker._wait_ns = 0, wait
            step = tracker._step
            tracker._close()
            results.append((kind, wait, step.ended, _after_close(tracker)))
            assert step.ended[0]["training.step.skipped"] is True
            assert step.ended[0]["training.step.data_wait_s"] == wait / 1e9
    by_kind = {}
    for kind, wait, ended, after in results:
        by_kind.setdefault(kind, []).append((wait, ended, after))
    assert len({repr(value) for value in by_kind.values()}) == 1


def test_collectives_and_substeps_take_the_python_close(monkeypatch: pytest.MonkeyPatch) -> None:
    """Collectives' attributes and substep spans are the Python method's: the C core hands the whole close over."""
    for kind in [param.values[0] for param in KINDS if NATIVE or param.values[0] == "python"]:
        tracker = _closing(kind)

        class Collectives:
            def step_attributes(self) -> dict[str, Any]:
                return {"training.collective.count": 3}

        tracker.collectives = Collectives()
        step = tracker._step
        tracker._close()
        assert step.extra == {"training.collective.count": 3} and len(step.ended) == 1, kind
        assert tracker._number == 8 and tracker._step is None


def test_a_failing_end_is_raised_to_the_closes_caller_with_the_step_let_go() -> None:
    for kind in [param.values[0] for param in KINDS if NATIVE or param.values[0] == "python"]:
        tracker = _closing(kind)
        tracker._step = Ending(fail=RuntimeError("end failed"))
        with pytest.raises(RuntimeError, match="end failed"):
            tracker._close()
        assert tracker._step is None and tracker._ctx is None, kind
        tracker.close()  # the public close contains whatever the next one raises
        tracker._step = Ending(fail=ValueError("again"))
        tracker.close()
        assert tracker._step is None


def _slots(step: Any) -> dict[str, Any]:
    from otel_training.events.duration import Duration

    return {name: getattr(step, name) for name in Duration.__slots__}


def test_the_c_core_makes_each_step_a_copy_equal_to_the_python_ones() -> None:
    if not NATIVE:
        pytest.skip(f"no C core here: {_ring.supported('on')}")
    from otel_training import semconv as sc
    from otel_training.events.span_kinds import StepDuration

    python, native = tracker_class(None)(), tracker_class(_core())()
    native.trainer = python.trainer  # the same process: the same target
    made = [native._make_step(sc.STEP, number) for number in (0, 1, 2**40)]
    template = native._step_template
    assert type(template) is StepDuration and all(step is not template for step in made)
    for number, step in zip((0, 1, 2**40), made):
        expected = python._make_step(sc.STEP, number)
        assert type(step) is StepDuration
        assert _slots(step) == _slots(expected)
        assert list(step._attributes.items()) == list(expected._attributes.items())  # the same order too
        assert step._attributes[sc.STEP] == number
    # every step its own attributes: one step's change is not the next's, nor the template's
    made[0]._attributes["x"] = 1
    assert "x" not in made[1]._attributes and "x" not in template._attributes
    assert len({id(step._attributes) for step in [*made, template]}) == 4


def test_a_template_the_c_core_cannot_copy_is_made_by_python_every_time() -> None:
    if not NATIVE:
        pytest.skip(f"no C core here: {_ring.supported('on')}")
    from otel_training import semconv as sc
    from otel_training.events.span_kinds import StepDuration

    tracker = tracker_class(_core())()

    class WithDict:
        _attributes: dict[str, Any] = {}

    for odd in (WithDict(), 3, "text"):
        tracker._step_template = odd
        step = tracker._make_step(sc.STEP, 5)
        assert type(step) is StepDuration and step._attributes[sc.STEP] == 5
        assert tracker._step_template is odd
    # odd arguments: the Python method's (which makes whatever it makes of them)
    assert tracker._make_step(sc.STEP, 5.0)._attributes[sc.STEP] == 5.0


# -- a fetch's begin and a step's opening (``fetch_begin``, ``_open``): the C core's against the Python methods ---
class Loop:
    """What the fetch and the opening read and call of the loop's spans (``loop_spans.LoopSpans``)."""

    def __init__(self, started: bool = True) -> None:
        self.started = started
        self.epoch_iterator: Any = None
        self.evaluation: Any = None
        self.parent: Any = None
        self.calls: list[tuple[Any, ...]] = []

    def fetched(self, iterator: Any) -> None:
        self.calls.append(("fetched",))
        self.epoch_iterator = lambda: iterator

    def begin_evaluation(self) -> None:
        self.calls.append(("begin evaluation",))
        self.evaluation = "evaluation"

    def end_evaluation(self) -> None:
        self.calls.append(("end evaluation",))
        self.evaluation = None


class Lengths:
    def __init__(self, exhausted: bool = False, fail: bool = False) -> None:
        self.answer, self.fail = exhausted, fail

    def exhausted(self, iterator: Any) -> bool:
        if self.fail:
            raise RuntimeError("no length")
        return self.answer


def _fetching(kind: str, grad: bool = True) -> Any:
    """A tracker whose ``fetch_begin`` is its class's own, recording the openings, closes and runtime asked for."""
    base = tracker_class(_core() if kind == "c" else None)

    class Fetching(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.log: list[tuple[Any, ...]] = []
            self.loop = Loop()
            self._lengths = Lengths()
            self._grad_enabled = lambda: grad
            self._rt = "runtime"

        def _open(self, awaiting_input: bool = False, rt: Any = None) -> None:
            self.log.append(("open", awaiting_input, rt))
            self._step = Ending()

        def _close(self) -> None:
            self.log.append(("close",))
            self._step, self._complete = None, False

        def _training(self) -> Any:
            self.log.append(("training",))
            return "fresh runtime"

        def _failed(self, hook: str) -> None:
            self.log.append(("failed", hook))

    return Fetching()


def _both() -> list[str]:
    return [param.values[0] for param in KINDS if NATIVE or param.values[0] == "python"]


def test_a_fetch_opens_the_step_awaiting_its_input_and_the_next_fetch_closes_it_on_both(monkeypatch) -> None:
    import otel_training.integrations.torch.steps as steps

    seen = {}
    for kind in _both():
        tracker = _fetching(kind)
        monkeypatch.setattr(steps, "grad_enabled", tracker._grad_enabled)  # the Python method's name for it
        iterator = object()
        before = time.time_ns()
        started = tracker.fetch_begin(iterator)
        assert type(started) is int and before <= started <= time.time_ns(), kind
        assert tracker._owner == threading.get_ident() and tracker._fetched is True
        assert tracker.log == [("open", True, "runtime")] and tracker.loop.calls == [("fetched",)], kind
        tracker.fetch_begin(iterator)  # the same epoch, a step open and not complete: nothing
        tracker._complete = True
        tracker.fetch_begin(iterator)  # the boundary: the completed step closes, the next opens
        assert tracker.log[1:] == [("close",), ("open", True, "runtime")] and tracker.loop.calls == [("fetched",)]
        tracker.loop.started = False  # the loop's train span not begun: the runtime asked for it
        tracker._complete = True
        tracker.fetch_begin(object())  # and a new iterator is a new epoch
        assert tracker.log[3:] == [("close",), ("training",), ("open", True, "fresh runtime")], kind
        assert tracker.loop.calls == [("fetched",), ("fetched",)]
        seen[kind] = (tracker.log, tracker.loop.calls, tracker._fetched)
    assert len({repr(value) for value in seen.values()}) == 1


def test_an_exhausted_loader_a_fetch_without_gradients_and_another_thread_on_both(monkeypatch) -> None:
    import otel_training.integrations.torch.steps as steps

    for kind in _both():
        tracker = _fetching(kind, grad=False)
        monkeypatch.setattr(steps, "grad_enabled", tracker._grad_enabled)
        tracker.fetch_begin(object())  # no gradients before training began: nothing
        assert tracker.log == [] and tracker.loop.calls == [] and tracker._fetched is False, kind
        tracker._number = 3  # after training began: an evaluation
        assert type(tracker.fetch_begin(object())) is int
        assert tracker.loop.calls == [("begin evaluation",)] and tracker.log == [], kind
        tracker._lengths = Lengths(exhausted=True)  # a fetch that only raises StopIteration is no wait
        assert tracker.fetch_begin(object()) is None and tracker.log == [], kind
        results: list[Any] = []
        other = _fetching(kind)
        other._owner = -1 if kind == "python" else 2**64 - 1  # another thread drives steps
        worker = threading.Thread(target=lambda: results.append(other.fetch_begin(object())))
        worker.start()
        worker.join(timeout=30)
        assert type(results[0]) is int and other.log == [] and other._fetched is False, kind


def test_a_failing_length_is_contained_and_dormant_or_suspended_trackers_take_the_python_path(monkeypatch) -> None:
    import otel_training.integrations.torch.steps as steps

    for kind in _both():
        tracker = _fetching(kind)
        monkeypatch.setattr(steps, "grad_enabled", tracker._grad_enabled)
        tracker._lengths = Lengths(fail=True)
        assert tracker.fetch_begin(object()) is None
        assert tracker.log == [("failed", "fetch_begin")], kind
        tracker = _fetching(kind)
        tracker.suspended = True  # a framework's callbacks make the steps
        assert type(tracker.fetch_begin(object())) is int and tracker.log == [] and tracker._owner is None, kind
        tracker.suspended, tracker.dormant = False, True  # dormant (no claim pending: stays so)
        assert tracker.fetch_begin(object()) is None and tracker.log == [], kind


class Opening:
    """A step as ``_open`` begins it: the arguments of its ``begin_detached``."""

    def __init__(self, key: str, number: int) -> None:
        self.key, self.number = key, number
        self.begun: Any = None

    def begin_detached(self, *args: Any) -> Any:
        self.begun = args
        return self


def _opening(kind: str) -> Any:
    base = tracker_class(_core() if kind == "c" else None)

    class Open(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.loop = Loop()
            self.log: list[tuple[Any, ...]] = []

        def _make_step(self, key: str, number: int) -> Any:
            return Opening(key, number)

        def disarm_forward(self) -> None:
            self.log.append(("disarm",))
            self._forward_handle = None

        def _training(self) -> Any:
            self.log.append(("training",))
            return "fresh runtime"

    return Open()


def test_a_step_opens_under_the_loops_parent_ending_an_evaluation_and_the_forward_hook_on_both() -> None:
    seen = {}
    for kind in _both():
        tracker = _opening(kind)
        tracker.loop.evaluation, tracker.loop.parent = "evaluation", "epoch"
        tracker._forward_handle, tracker._just_closed, tracker._number, tracker._ctx = "handle", True, 4, "old"
        before = time.time_ns()
        tracker._open(True, "runtime")
        step = tracker._step
        assert (step.key, step.number, step.begun) == ("training.step", 4, (True, "runtime", True, "epoch")), kind
        assert tracker.loop.calls == [("end evaluation",)] and tracker.log == [("disarm",)], kind
        assert before <= tracker._start_ns <= time.time_ns()
        assert (tracker._ctx, tracker._awaiting_input, tracker._just_closed) == (None, True, False)
        tracker.loop.parent = None  # no loop span: begun in the caller's context
        tracker._open(False, "runtime")
        assert tracker._step.begun == (False, "runtime") and tracker._awaiting_input is False, kind
        tracker._open()  # no runtime given: the Python method asks for it (the same on both)
        assert tracker._step.begun == (False, "fresh runtime") and tracker.log[-1] == ("training",), kind
        seen[kind] = (tracker.log, tracker.loop.calls)
    assert len({repr(value) for value in seen.values()}) == 1


def test_a_failing_begin_is_raised_to_the_opens_caller_and_leaves_no_step() -> None:
    for kind in _both():
        tracker = _opening(kind)

        class Failing(Opening):
            def begin_detached(self, *args: Any) -> Any:
                raise RuntimeError("begin failed")

        tracker._make_step = lambda key, number: Failing(key, number)
        with pytest.raises(RuntimeError, match="begin failed"):
            tracker._open(True, "runtime")
        assert tracker._step is None, kind


def test_the_c_core_takes_the_usual_fetch_and_opening_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without this, every test above could pass on the Python methods the C core hands odd cases to."""
    if not NATIVE:
        pytest.skip(f"no C core here: {_ring.supported('on')}")
    handed: list[str] = []
    for make, hook, call in [(_fetching, "_py_fetch_begin", lambda made: made.fetch_begin(object())),
                             (_opening, "_py_open", lambda made: made._open(True, "runtime")),
                             (_closing, "_py_close", lambda made: made._close())]:
        made = make("c")
        native_class = type(made).__mro__[1]
        python_method = getattr(native_class, hook)
        monkeypatch.setattr(native_class, hook, lambda self, *args, _hook=hook, _method=python_method, **kwargs: (
            handed.append(_hook), _method(self, *args, **kwargs))[1])
        call(made)
        made.dormant = True  # and an odd case is handed over
        if hook == "_py_fetch_begin":
            call(made)
            assert handed == ["_py_fetch_begin"]
            handed.clear()
    assert handed == []


def test_a_template_of_another_class_is_checked_again_and_copied_whole() -> None:
    """The C core remembers the class it checked and where it keeps its attributes: a template of another class
    (a subclass with a slot of its own) is checked again, and its copies carry every slot."""
    if not NATIVE:
        pytest.skip(f"no C core here: {_ring.supported('on')}")
    from otel_training import semconv as sc
    from otel_training.events.span_kinds import StepDuration

    class Tagged(StepDuration):
        __slots__ = ("tag",)

    tracker = tracker_class(_core())()
    first = tracker._make_step(sc.STEP, 1)
    assert type(first) is StepDuration and first._attributes[sc.STEP] == 1
    tagged = Tagged(tracker.trainer, sc.SPAN_STEP, None, event_name="#step", attributes={sc.STEP: 0})
    tagged.tag = "kept"
    tracker._step_template = tagged
    copy = tracker._make_step(sc.STEP, 2)
    assert type(copy) is Tagged and copy.tag == "kept" and copy._attributes[sc.STEP] == 2
    assert _slots(copy) == {**_slots(tagged), "_attributes": copy._attributes}
    assert tagged._attributes[sc.STEP] == 0


# -- an independent review's findings (2026-12-05): fields changed by Python code the C core calls ------------
def test_fields_deleted_or_rebound_by_python_code_mid_hook_are_errors_never_a_crash() -> None:
    """C reads a field again after any Python call (which may delete or rebind it): an error the caller contains,
    as the Python method's AttributeError is, never a read of a missing field."""
    if not NATIVE:
        pytest.skip(f"no C core here: {_ring.supported('on')}")
    tracker = _fetching("c")

    def close_and_forget_the_loop() -> None:
        tracker._step, tracker._complete = None, False
        del tracker.loop

    tracker._step, tracker._complete, tracker._owner = Ending(), True, threading.get_ident()
    tracker._close = close_and_forget_the_loop
    assert tracker.fetch_begin(object()) is None and tracker.log == [("failed", "fetch_begin")]

    opening = _opening("c")
    opening.loop.evaluation = "evaluation"
    opening.loop.end_evaluation = lambda: opening.__delattr__("_step_key")
    with pytest.raises(AttributeError, match="_step_key"):
        opening._open(True, "runtime")
    assert opening._step is None

    closing = _closing("c")

    class Context:
        def __del__(self) -> None:
            closing._end_keys = ["a", "b", "c", "d"]  # a finaliser run as the step's context is let go

    closing._ctx = Context()
    step = closing._step
    closing._close()
    assert step.ended == [{"training.step.substeps": 1, "training.step.optimizer_steps": 1,
                           "training.step.skipped": False, "training.step.data_wait_s": 0.0025}]
    assert closing._end_keys == ["a", "b", "c", "d"] and closing._number == 8


def test_what_the_steps_end_changes_is_read_after_it_on_both() -> None:
    """The Python method reads the step number and whether a loader fetched after ending the step: so does C."""
    seen = {}
    for kind in _both():
        tracker = _closing(kind)
        tracker._fetched = False

        class Changing(Ending):
            def end(self, attributes: dict[str, Any] | None = None) -> None:
                tracker._fetched, tracker._number = True, 100

        tracker._step = Changing()
        tracker._close()
        seen[kind] = (tracker._number, tracker.armed, tracker._fetched)
        assert seen[kind] == (101, 0, False), kind
    assert len(set(seen.values())) == 1


def test_a_subclass_that_declares_attributes_again_is_copied_through_its_own_slot() -> None:
    if not NATIVE:
        pytest.skip(f"no C core here: {_ring.supported('on')}")
    from otel_training import semconv as sc
    from otel_training.events.span_kinds import StepDuration

    class Again(StepDuration):
        __slots__ = ("_attributes",)  # hides Duration's slot of the same name

    tracker = tracker_class(_core())()
    template = Again(tracker.trainer, sc.SPAN_STEP, None, event_name="#step", attributes={sc.STEP: 0})
    tracker._step_template = template
    copies = [tracker._make_step(sc.STEP, number) for number in (1, 2)]
    assert [copy._attributes[sc.STEP] for copy in copies] == [1, 2]
    assert copies[0]._attributes is not copies[1]._attributes and template._attributes[sc.STEP] == 0
