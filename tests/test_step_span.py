"""A torch step's span begun and ended in C (``native/step_span.c``) is the one the Python methods make.

The tracker's hooks are driven here as torch's stand-ins drive them (a fetch, a backward pass, an optimizer step),
on a real offloaded pipeline, with no torch loop: the same calls run under the sanitizer build (native-check).
Each test asserts that the C core took the usual begin and end itself (``StepDuration.begin_detached`` and
``Duration.end`` not called), that the spans are the ones the pure-Python pipeline makes, and that each unusual
case went to the Python method, with its outcome. ``slots.c``'s reads, on which the C path stands, are tested on
their own at the end.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from otlp_json import read_spans
from requirements import require

from otel_training import _ring
from otel_training import semconv as sc
from otel_training.events import device_probe
from otel_training.events.duration import Duration
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


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often a step's Python begin and end ran (the C core's usual case calls neither)."""
    counted: Counter[str] = Counter()
    begin, end = StepDuration.begin_detached, Duration.end

    def counting_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        counted["begin"] += 1
        return begin(self, *args, **kwargs)

    def counting_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(self, StepDuration):
            counted["end"] += 1
        return end(self, *args, **kwargs)

    monkeypatch.setattr(StepDuration, "begin_detached", counting_begin)
    monkeypatch.setattr(Duration, "end", counting_end)
    monkeypatch.setattr(device_probe, "PROBE_INTERVAL_S", 3600.0)  # one probe, at the first step
    return counted


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
def test_the_c_core_begins_and_ends_the_usual_steps_itself_with_the_spans_python_makes(tracking, calls) -> None:
    telemetry, tracker = tracking("on")
    assert "StepCore" in repr(type(tracker).__mro__)
    drive(tracker, steps=8, epochs=2)
    assert calls == {"begin": 1}  # the first step (its trace's first count and the device probe): Python's
    native = finish(telemetry, tracker)
    steps = [span for span in native if span["name"] == sc.SPAN_STEP]
    assert sorted(span["attributes"][sc.STEP] for span in steps) == list(range(16))
    assert all(span["attributes"][sc.STEP_OPTIMIZER_STEPS] == 1 and span["attributes"][sc.STEP_SUBSTEPS] == 1
               for span in steps)
    calls.clear()
    telemetry, tracker = tracking("off")
    assert "StepCore" not in repr(type(tracker).__mro__)
    drive(tracker, steps=8, epochs=2)
    assert calls["begin"] == 16 and calls["end"] == 16
    assert shape(native) == shape(finish(telemetry, tracker))


@needs_native
def test_a_step_begun_and_ended_in_c_holds_what_the_python_methods_leave(tracking, calls) -> None:
    """Every slot of the step as the Python begin and end leave them: its runtime, its span, ended."""
    telemetry, tracker = tracking("on")
    batches = Batches()
    drive(tracker, steps=3, batches=batches)  # each step closes at its optimizer step
    tracker.fetch_end(tracker.fetch_begin(batches))  # the next fetch opens the next
    step = tracker._step
    assert calls == {"begin": 1} and step is not None
    assert step._runtime is tracker._rt and step._span is not None and step._span.is_recording()
    assert step._span.parent == tracker.loop.parent._span.get_span_context()
    assert (step._ended, step._token, step._current_token, step._segment) == (False, None, None, None)
    assert step._attributes[sc.STEP] == 3 and step._span.attributes[sc.STEP] == 3
    drive(tracker, steps=1, batches=batches)
    assert calls == {"begin": 1} and step._ended is True and not step._span.is_recording()
    assert tracker._step is None and tracker._number == 4
    spans = finish(telemetry, tracker)
    (ended,) = [span for span in spans if span["attributes"].get(sc.STEP) == 3]
    assert ended["attributes"][sc.STEP_OPTIMIZER_STEPS] == 1 and ended["end"] >= ended["start"]


@needs_native
def test_a_trace_over_budget_pending_values_and_a_device_go_to_the_python_methods(tracking, calls, monkeypatch) -> None:
    telemetry, tracker = tracking("on", trace_max_spans=5)
    drive(tracker, steps=12)
    rolled = calls["begin"]
    assert 1 < rolled < 12  # the steps that found their trace over budget began a new segment in Python
    spans = finish(telemetry, tracker)
    assert len([span for span in spans if sc.TRACE_SEGMENT in span["attributes"]]) >= 2
    calls.clear()

    telemetry, tracker = tracking("on")
    batches = Batches()  # one epoch throughout: no epoch span begins in between
    drive(tracker, steps=2, batches=batches)
    polled: list[int] = []
    monkeypatch.setattr(PendingValues, "poll", lambda self: polled.append(1))
    monkeypatch.setattr(PendingValues, "ended", lambda self, span: 0)
    values = tracker._rt.values
    values.items = (object(),)  # a device value waiting to be read: the begin polls it, the end asks for it
    drive(tracker, steps=2, batches=batches)
    assert calls == {"begin": 3, "end": 2} and len(polled) == 2
    values.items = ()
    drive(tracker, steps=2, batches=batches)
    assert calls == {"begin": 3, "end": 2} and len(polled) == 2  # C again
    values.converting[1] = 1  # an object being converted for a span: the end asks for it
    drive(tracker, steps=1, batches=batches)
    assert calls == {"begin": 3, "end": 3}
    values.converting.clear()
    calls.clear()

    class Timeline:  # a device timeline in use: its steps are timed on it (begin_step None: not this one)
        def begin_step(self, epoch: Any, awaiting_input: bool) -> None:
            return None

    tracker._rt.device = Timeline()
    drive(tracker, steps=2, batches=batches)
    assert calls == {"begin": 2}
    tracker._rt.device = False  # turned off: C again
    drive(tracker, steps=2, batches=batches)
    assert calls == {"begin": 2}
    steps = [span for span in finish(telemetry, tracker) if span["name"] == sc.SPAN_STEP]
    assert sorted(span["attributes"][sc.STEP] for span in steps) == list(range(11))


@needs_native
def test_a_failing_begin_is_contained_logged_once_and_training_goes_on(tracking, calls, caplog) -> None:
    telemetry, tracker = tracking("on")
    batches = Batches()  # one epoch: the epoch span's own begin (Python's) is not among those that fail
    drive(tracker, steps=2, batches=batches)
    provider = tracker._rt.start_child.__self__._provider
    begin_span = provider.begin_span

    def failing(*args: Any) -> Any:
        raise RuntimeError("the ring is gone")

    provider.begin_span = failing  # not the C core's: start_child is the tracer's Python method, which raises
    with caplog.at_level(logging.WARNING, logger="otel_training"):
        drive(tracker, steps=3, batches=batches)
    (logged,) = [record for record in caplog.records if "Duration.begin" in record.getMessage()]
    assert logged.getMessage().startswith("otel_training: internal error in StepTracker.Duration.begin; training "
                                          "continues")
    assert logged.exc_info and str(logged.exc_info[1]) == "the ring is gone"  # the traceback comes with it
    assert calls == {"begin": 1, "end": 3}  # opened unbegun (as the Python begin leaves them): Python's end
    provider.begin_span = begin_span
    drive(tracker, steps=2, batches=batches)
    steps = [span for span in finish(telemetry, tracker) if span["name"] == sc.SPAN_STEP]
    assert sorted(span["attributes"][sc.STEP] for span in steps) == [0, 1, 5, 6]


@needs_native
def test_a_step_ended_inside_its_own_context_is_the_python_ends(tracking, calls) -> None:
    telemetry, tracker = tracking("on")
    batches = Batches()
    drive(tracker, steps=2, batches=batches)
    tracker.fetch_end(tracker.fetch_begin(batches))
    step = tracker._step
    tracker._complete = True
    # The step is the current Duration there (work nested in a step runs so): Python's end, which ends its span and
    # leaves that context alone (begun detached, it entered none: the context ends with its run).
    step.context().run(tracker._close)
    assert calls["end"] == 1 and step._ended is True and not step._span.is_recording()
    spans = finish(telemetry, tracker)
    assert sorted(span["attributes"][sc.STEP] for span in spans if span["name"] == sc.SPAN_STEP) == [0, 1, 2]


# -- slots.c: another class's __slots__ at a field's cost, or what getattr answers ------------------------------
def _slot_read() -> Any:
    from otel_training import _native_loader

    native = _native_loader.native("auto")
    assert native is not None
    return native._slot_read


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
