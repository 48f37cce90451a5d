"""A torch step's span begun and ended in C (``native/step_span.c``) is the one the Python methods make.

The tracker's hooks are driven here as torch's stand-ins drive them (a fetch, a backward pass, an optimizer step),
on a real offloaded pipeline, with no torch loop: the same calls run under the sanitizer build (native-check).
Each test asserts that the C core took the usual begin and end itself (``StepDuration.begin_detached`` and
``Duration.end`` not called), that the spans are the ones the pure-Python pipeline makes, and that each unusual
case went to the Python method, with its outcome. ``slots.c``'s reads, on which the C path stands, are tested on
their own at the end.
"""

from __future__ import annotations

import contextvars
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from otlp_json import read_spans
from requirements import require

from otel_training import _contain, _ring
from otel_training import semconv as sc
from otel_training.events import device_probe
from otel_training.events.duration import Duration
from otel_training.events.runtime import EventsRuntime
from otel_training.events.span_kinds import StepDuration
from otel_training.events.values import PendingValues

torch = require("torch")  # the instrumentor patches torch once it is imported

NATIVE = _ring.supported("on") is None
needs_native = pytest.mark.skipif(not NATIVE, reason=f"no C core here: {_ring.supported('on')}")


class Batches:
    """What the fetch hook reads of a DataLoader iterator: its count so far and its length."""

    def __init__(self, length: int = 10**9) -> None:
        self._num_yielded = 1
        self.length = length

    def __len__(self) -> int:
        return self.length


class Optimizer:
    pass


OPTIMIZER = Optimizer()  # one for the run: a step waits for the optimizers the first one stepped


def _native() -> Any:
    from otel_training import _native_loader

    native = _native_loader.native("auto")
    assert native is not None
    return native


@pytest.fixture
def in_c(monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[int, ...]]:
    """``in_c()``: (begun, ended), the steps the C core began and ended itself since the fixture was made (the
    rest were the Python methods'); ``in_c(contained=True)``: and the errors it contained."""
    monkeypatch.setattr(device_probe, "PROBE_INTERVAL_S", 3600.0)  # one probe, at the first step
    counts = _native()._step_span_counts if NATIVE else (lambda: (0, 0, 0))
    start = counts()

    def since(contained: bool = False) -> tuple[int, ...]:
        now = [value - first for value, first in zip(counts(), start)]
        return tuple(now) if contained else tuple(now[:2])

    return since


@pytest.fixture
def tracking(configure: Any, tmp_path: Any) -> Iterator[Any]:
    """``tracking(native, **options)``: a pipeline on that core and the torch instrumentor's tracker."""
    from otel_training.integrations.torch import TorchInstrumentor

    made: list[Any] = []
    runs: list[Any] = []

    def make(native: str, **options: Any) -> tuple[Any, Any]:
        while made:  # one instrumentor at a time (it is a singleton)
            made.pop().uninstrument()
        telemetry = configure(offload=True, native=native, output_dir=str(tmp_path / f"run{len(runs)}"), **options)
        runs.append(telemetry)
        assert telemetry.drain_ready(timeout_s=60)
        instrumentor = TorchInstrumentor()
        instrumentor.instrument()
        made.append(instrumentor)
        return telemetry, TorchInstrumentor.tracker

    yield make
    for instrumentor in made:
        instrumentor.uninstrument()


def drive(tracker: Any, steps: int, epochs: int = 1, batches: Batches | None = None) -> None:
    """``steps`` iterations of a DataLoader loop in each of ``epochs`` epochs, as torch's stand-ins call the hooks
    (each epoch a new iterator, unless ``batches`` is given: the same epoch goes on)."""
    optimizer = OPTIMIZER
    for _ in range(epochs):
        batches = batches or Batches()
        for _ in range(steps):
            tracker.fetch_end(tracker.fetch_begin(batches))
            tracker.backward_begin()
            tracker.backward_end()
            tracker.optimizer_pre(optimizer, (), {})
            tracker.optimizer_post(optimizer, (), {})


def finish(telemetry: Any, tracker: Any) -> list[dict[str, Any]]:
    tracker.close()
    tracker.loop.close()
    assert telemetry.force_flush(10).completed
    return read_spans(telemetry.trace_path)


def shape(spans: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What a run's spans must share on both cores: names, attributes, parents, traces; not times or ids."""
    by_id = {span["span_id"]: span for span in spans}
    shaped = []
    for span in spans:
        if span["name"] == sc.SPAN_DATA_WAIT:  # a fetch past 1 ms on a loaded machine: timing, not the core
            continue
        attributes = {key: value for key, value in span["attributes"].items()
                      if key not in (sc.STEP_DATA_WAIT_S, "otel_training.native")}
        parent = by_id.get(span["parent_id"])
        shaped.append((span["name"], sorted(attributes.items(), key=repr), parent and parent["name"],
                       parent is not None and parent["trace_id"] == span["trace_id"], span["status"], span["events"]))
    return sorted(shaped, key=repr)


@needs_native
def test_the_c_core_begins_and_ends_the_usual_steps_itself_with_the_spans_python_makes(tracking, in_c) -> None:
    telemetry, tracker = tracking("on")
    assert "StepCore" in repr(type(tracker).__mro__)
    drive(tracker, steps=8, epochs=2)
    assert in_c() == (15, 16)  # the first step's begin (its device probe) is Python's
    native = finish(telemetry, tracker)
    steps = [span for span in native if span["name"] == sc.SPAN_STEP]
    assert sorted(span["attributes"][sc.STEP] for span in steps) == list(range(16))
    assert all(span["attributes"][sc.STEP_OPTIMIZER_STEPS] == 1 and span["attributes"][sc.STEP_SUBSTEPS] == 1
               for span in steps)
    telemetry, tracker = tracking("off")
    assert "StepCore" not in repr(type(tracker).__mro__)
    drive(tracker, steps=8, epochs=2)
    assert in_c() == (15, 16)  # the pure-Python pipeline: none
    assert shape(native) == shape(finish(telemetry, tracker))


@needs_native
def test_a_step_begun_and_ended_in_c_holds_what_the_python_methods_leave(tracking, in_c) -> None:
    """Every slot of the step as the Python begin and end leave them: its runtime, its span, ended."""
    telemetry, tracker = tracking("on")
    batches = Batches()
    drive(tracker, steps=3, batches=batches)  # each step closes at its optimizer step
    tracker.fetch_end(tracker.fetch_begin(batches))  # the next fetch opens the next
    step = tracker._step
    assert in_c() == (3, 3) and step is not None
    assert step._runtime is tracker._rt and step._span is not None and step._span.is_recording()
    assert step._span.parent == tracker.loop.parent._span.get_span_context()
    assert (step._ended, step._token, step._current_token, step._segment) == (False, None, None, None)
    assert step._attributes[sc.STEP] == 3 and step._span.attributes[sc.STEP] == 3
    drive(tracker, steps=1, batches=batches)
    assert in_c() == (3, 4) and step._ended is True and not step._span.is_recording()
    assert tracker._step is None and tracker._number == 4
    spans = finish(telemetry, tracker)
    (ended,) = [span for span in spans if span["attributes"].get(sc.STEP) == 3]
    assert ended["attributes"][sc.STEP_OPTIMIZER_STEPS] == 1 and ended["end"] >= ended["start"]


@needs_native
def test_a_trace_over_budget_pending_values_and_a_device_go_to_the_python_methods(tracking, in_c, monkeypatch) -> None:
    telemetry, tracker = tracking("on", trace_max_spans=5)
    drive(tracker, steps=12)
    begun, ended = in_c()
    assert 0 < begun < 11 and ended == 12  # the steps that found their trace over budget rolled it in Python
    spans = finish(telemetry, tracker)
    assert len([span for span in spans if sc.TRACE_SEGMENT in span["attributes"]]) >= 2

    telemetry, tracker = tracking("on")
    batches = Batches()  # one epoch throughout: no epoch span begins in between
    drive(tracker, steps=2, batches=batches)
    before = in_c()
    polled: list[int] = []
    monkeypatch.setattr(PendingValues, "poll", lambda self: polled.append(1))
    monkeypatch.setattr(PendingValues, "ended", lambda self, span: 0)
    values = tracker._rt.values
    values.items = (object(),)  # a device value waiting to be read: the begin polls it, the end asks for it
    drive(tracker, steps=2, batches=batches)
    assert in_c() == before and len(polled) == 2
    values.items = ()
    drive(tracker, steps=2, batches=batches)  # C again (the first of them ended a step begun in Python)
    assert in_c() == (before[0] + 2, before[1] + 2) and len(polled) == 2
    values.converting[1] = 1  # an object being converted for a span: the end asks for it
    drive(tracker, steps=1, batches=batches)
    assert in_c() == (before[0] + 3, before[1] + 2)
    values.converting.clear()
    before = in_c()

    class Timeline:  # a device timeline in use: its steps are timed on it (begin_step None: not this one)
        def begin_step(self, epoch: Any, awaiting_input: bool) -> None:
            return None

    tracker._rt.device = Timeline()
    drive(tracker, steps=2, batches=batches)
    assert in_c() == (before[0], before[1] + 2)
    tracker._rt.device = False  # turned off: C again
    drive(tracker, steps=2, batches=batches)
    assert in_c() == (before[0] + 2, before[1] + 4)
    steps = [span for span in finish(telemetry, tracker) if span["name"] == sc.SPAN_STEP]
    assert sorted(span["attributes"][sc.STEP] for span in steps) == list(range(11))


@needs_native
def test_a_wrapper_on_the_python_methods_is_honoured_and_c_takes_over_again_once_it_is_gone(tracking, in_c,
                                                                                         monkeypatch) -> None:
    telemetry, tracker = tracking("on")
    batches = Batches()
    drive(tracker, steps=2, batches=batches)
    seen: Counter[str] = Counter()
    for owner, name in ((StepDuration, "begin_detached"), (Duration, "_begin"), (Duration, "end"),
                        (EventsRuntime, "admit")):
        before = in_c()
        original = getattr(owner, name)

        def wrapper(self: Any, *args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
            seen[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)
        drive(tracker, steps=2, batches=batches)
        assert seen[name] >= 2, name  # the user's wrapper saw every step: the Python path ran
        assert in_c()[0] == before[0], name  # no step begun in C while it was there
        monkeypatch.undo()
        drive(tracker, steps=2, batches=batches)
        assert in_c()[0] == before[0] + 2, name  # restored: the class is checked again
    steps = [span for span in finish(telemetry, tracker) if span["name"] == sc.SPAN_STEP]
    assert sorted(span["attributes"][sc.STEP] for span in steps) == list(range(18))


@needs_native
def test_a_failing_begin_is_contained_logged_once_as_pythons_and_training_goes_on(tracking, in_c, caplog,
                                                                                  monkeypatch) -> None:
    monkeypatch.setattr(_contain, "_seen", set())  # logged once a process: an earlier test's may have been
    telemetry, tracker = tracking("on")
    batches = Batches()  # one epoch: the epoch span's own begin (Python's) is not among those that fail
    drive(tracker, steps=2, batches=batches)
    provider = tracker._rt.start_child.__self__._provider
    begin_span = provider.begin_span

    def failing(*args: Any) -> Any:
        raise RuntimeError("the ring is gone")

    provider.begin_span = failing  # not the C core's: start_child is the tracer's Python method, which raises
    before = in_c()
    with caplog.at_level(logging.WARNING, logger="otel_training"):
        drive(tracker, steps=3, batches=batches)
    (logged,) = [record for record in caplog.records if "Duration.begin" in record.getMessage()]
    assert logged.getMessage().startswith("otel_training: internal error in Duration.begin; training continues")
    assert logged.exc_info and str(logged.exc_info[1]) == "the ring is gone"  # the traceback comes with it
    # each begin failed in C and was contained there (the step open, unbegun: as Duration._begin leaves it), and
    # Python's end closed it (nothing to end)
    assert in_c(contained=True) == (before[0], before[1], 3)
    provider.begin_span = begin_span
    drive(tracker, steps=2, batches=batches)
    steps = [span for span in finish(telemetry, tracker) if span["name"] == sc.SPAN_STEP]
    assert sorted(span["attributes"][sc.STEP] for span in steps) == [0, 1, 5, 6]


@needs_native
def test_a_step_ended_inside_its_own_context_is_the_python_ends(tracking, in_c) -> None:
    telemetry, tracker = tracking("on")
    batches = Batches()
    drive(tracker, steps=2, batches=batches)
    tracker.fetch_end(tracker.fetch_begin(batches))
    step = tracker._step
    tracker._complete = True
    before = in_c()
    # The step is the current Duration there (work nested in a step runs so): Python's end, which ends its span and
    # leaves that context alone (begun detached, it entered none: the context ends with its run).
    step.context().run(tracker._close)
    assert in_c() == before and step._ended is True and not step._span.is_recording()
    spans = finish(telemetry, tracker)
    assert sorted(span["attributes"][sc.STEP] for span in spans if span["name"] == sc.SPAN_STEP) == [0, 1, 2]


@needs_native
def test_python_code_run_mid_begin_or_end_frees_nothing_c_still_reads(tracking, in_c) -> None:
    """A finaliser or a property run while C begins or ends a step (an independent review crashed the first
    version so: the parent's context and a root's trace id were borrowed across them)."""
    telemetry, tracker = tracking("on")
    batches = Batches()
    drive(tracker, steps=2, batches=batches)
    parent = tracker.loop.parent
    make = type(tracker)._make_step

    class Finaliser:  # the step's old runtime: let go while C begins it
        def __del__(self) -> None:
            del parent._span._context

    def make_step(key: str, number: int) -> Any:
        step = make(tracker, key, number)
        step._runtime = Finaliser()
        return step

    tracker._make_step = make_step
    context = parent._span._context
    before = in_c()
    drive(tracker, steps=1, batches=batches)  # begun in C under that parent, whose context goes after the begin
    assert in_c()[0] == before[0] + 1 and tracker._step is None
    del tracker._make_step
    parent._span._context = context
    tracker.fetch_end(tracker.fetch_begin(batches))
    span = tracker._step._span
    trace_id = span.get_span_context().trace_id
    span.parent = None  # a root: its end lets its trace's budget go (rt.forget)
    forgotten: list[int] = []

    class Runtime(EventsRuntime):  # forget, looked up: a property that drops the span's context first
        __slots__ = ()

        @property
        def forget(self) -> Callable[[int], None]:
            span._context = None
            [object() for _ in range(1000)]
            return forgotten.append

    runtime = tracker._rt
    runtime.__class__ = Runtime
    try:
        before = in_c()
        drive(tracker, steps=1, batches=batches)
        assert in_c()[1] == before[1] + 1 and forgotten == [trace_id]
    finally:
        runtime.__class__ = EventsRuntime
    steps = [span for span in finish(telemetry, tracker) if span["name"] == sc.SPAN_STEP]
    assert len(steps) == 4


def test_a_duration_begun_current_and_ended_inside_its_own_context_ends_its_span(configure) -> None:
    """Entered in the caller's context, ended in another (its own ``context()``): nothing to restore there, and
    the span still ends (it was left open, with an error logged, before)."""
    from otel_training.events.predefined import TrainerProcess

    telemetry = configure(offload=True)
    duration = TrainerProcess().duration("work")

    def begin_and_end_elsewhere() -> None:  # in a context of its own: the one it is entered in keeps it current
        duration.begin()
        duration.context().run(duration.end)

    contextvars.copy_context().run(begin_and_end_elsewhere)
    assert duration._ended is True and not duration.span.is_recording()
    duration.end()  # once
    assert telemetry.force_flush(10).completed
    assert [span["name"] for span in read_spans(telemetry.trace_path) if span["name"] == "work"] == ["work"]


# -- slots.c: another class's __slots__ at a field's cost, or what getattr answers ------------------------------
def _slot_read() -> Any:
    return _native()._slot_read


@needs_native
def test_a_slot_is_read_from_its_offset_and_anything_else_as_getattr_answers() -> None:
    read = _slot_read()

    class Slotted:
        __slots__ = ("a", "b")

    class Child(Slotted):
        pass

    class Dicted:
        def __init__(self) -> None:
            self.a = "from the dict"

    class Hooked(Slotted):
        __slots__ = ()

        def __getattribute__(self, name: str) -> Any:
            return "hooked"

    one, child, hooked = Slotted(), Child(), Hooked()
    one.a, one.b, child.a = 1, 2, "child"
    object.__setattr__(hooked, "a", "set")
    assert read(one, "a") == (1, True) and read(one, "b") == (2, True)  # one cache, another name: looked up again
    assert read(child, "a") == ("child", True)  # a subclass: the base's slot
    assert read(Dicted(), "a") == ("from the dict", False)
    assert read(hooked, "a") == ("hooked", False)  # a class that reads attributes its own way: its answer
    with pytest.raises(AttributeError, match="'b'"):
        read(child, "b")  # unset
    with pytest.raises(AttributeError):
        read(one, "missing")
    assert read(one, "a") == (1, True)
    Slotted.a = property(lambda self: "a property now")  # the class changed: its version tag with it
    assert read(one, "a") == ("a property now", False)
    with pytest.raises(TypeError):
        read(one, 3)
