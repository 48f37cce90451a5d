"""The torch instrumentor's per-step wrappers: the C gate (``native/gate.c``) does what the Python ones do.

Each test runs both: the Python wrapper (``_fetch_wrapper(tracker)``, what the fallback runs) and the C one
(``_fetch_wrapper(tracker, _native_gate())``), called as wrapt calls them.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
from opentelemetry.instrumentation.utils import suppress_instrumentation

from otel_training import _native_loader, _ring
from otel_training.integrations.torch import instrumentor

NATIVE = _ring.supported("on") is None and os.environ.get("OTEL_TRAINING_BUILD_NATIVE") != "0"


class Tracker:
    """Records the hook calls the wrappers make."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def fetch_begin(self, iterator: Any) -> int:
        self.calls.append(("fetch_begin", iterator))
        return 41

    def fetch_end(self, started: Any, error: BaseException | None = None) -> None:
        self.calls.append(("fetch_end", started, error))

    def backward_begin(self) -> None:
        self.calls.append(("backward_begin",))

    def backward_end(self) -> None:
        self.calls.append(("backward_end",))


def _makers() -> list[Any]:
    makers: list[Any] = [pytest.param(None, id="python")]
    makers.append(pytest.param("native", id="c", marks=pytest.mark.skipif(
        not NATIVE, reason=f"no C core here: {_ring.supported('on')}")))
    return makers


def _gate(which: str | None) -> Any:
    if which is None:
        return None
    from otel_training.pipeline import configure as pipeline

    with pytest.MonkeyPatch.context() as patch:  # CI's fallback pass says off: these tests are the C gate's
        patch.setenv("OTEL_TRAINING_NATIVE", "auto")
        patch.setattr(pipeline, "get_telemetry", lambda: None)
        gate = instrumentor._native_gate()
    assert gate is not None  # the extension loads here and the suppression keys are read
    return gate


@pytest.mark.parametrize("which", _makers())
def test_a_fetch_calls_begin_with_the_iterator_and_end_with_its_start(which: str | None) -> None:
    tracker = Tracker()
    wrapper = instrumentor._fetch_wrapper(tracker, _gate(which))
    assert (type(wrapper).__name__ == "Gate") == (which is not None)
    seen: list[Any] = []

    def wrapped(*args: Any, **kwargs: Any) -> str:
        seen.append((args, kwargs))
        return "batch"

    assert wrapper(wrapped, "iterator", (1, 2), {"k": 3}) == "batch"
    assert seen == [((1, 2), {"k": 3})]
    assert tracker.calls == [("fetch_begin", "iterator"), ("fetch_end", 41, None)]


@pytest.mark.parametrize("which", _makers())
@pytest.mark.parametrize("error", [StopIteration(), ValueError("broken loader"), KeyboardInterrupt()])
def test_a_fetch_that_raises_ends_with_the_error_and_the_error_goes_on(which: str | None,
                                                                       error: BaseException) -> None:
    tracker = Tracker()
    wrapper = instrumentor._fetch_wrapper(tracker, _gate(which))

    def wrapped(*args: Any, **kwargs: Any) -> None:
        raise error

    with pytest.raises(type(error)) as raised:
        wrapper(wrapped, "iterator", (), {})
    assert raised.value is error and raised.value.__traceback__ is not None
    assert tracker.calls == [("fetch_begin", "iterator"), ("fetch_end", 41, error)]
    assert sys.exc_info() == (None, None, None)


@pytest.mark.parametrize("which", _makers())
def test_backward_calls_begin_then_end_and_no_end_when_it_raises(which: str | None) -> None:
    tracker = Tracker()
    wrapper = instrumentor._backward_wrapper(tracker, _gate(which))
    assert wrapper(lambda *args, **kwargs: (args, kwargs), None, ("loss",), {"retain_graph": True}) == (
        ("loss",), {"retain_graph": True})
    assert tracker.calls == [("backward_begin",), ("backward_end",)]
    tracker.calls.clear()

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        wrapper(broken, None, (), {})
    assert tracker.calls == [("backward_begin",)]


@pytest.mark.parametrize("which", _makers())
def test_inside_suppress_instrumentation_only_the_wrapped_call_runs(which: str | None) -> None:
    tracker = Tracker()
    fetch = instrumentor._fetch_wrapper(tracker, _gate(which))
    backward = instrumentor._backward_wrapper(tracker, _gate(which))
    with suppress_instrumentation():
        assert fetch(lambda: "batch", "iterator", (), {}) == "batch"
        assert backward(lambda: "grads", None, (), {}) == "grads"
    assert tracker.calls == []
    assert fetch(lambda: "batch", "iterator", (), {}) == "batch"  # and on again after it
    assert tracker.calls[0] == ("fetch_begin", "iterator")


@pytest.mark.parametrize("which", _makers())
def test_an_error_in_a_hook_goes_up_as_from_the_python_wrapper(which: str | None) -> None:
    class Broken(Tracker):
        def fetch_end(self, started: Any, error: BaseException | None = None) -> None:
            raise LookupError("hook")

    wrapper = instrumentor._fetch_wrapper(Broken(), _gate(which))
    with pytest.raises(LookupError, match="hook"):
        wrapper(lambda: "batch", "iterator", (), {})
    with pytest.raises(LookupError, match="hook"):  # the hook's error, not the loader's, as in Python
        wrapper(lambda: (_ for _ in ()).throw(ValueError("loader")), "iterator", (), {})


@pytest.mark.skipif(not NATIVE, reason="no C core here")
def test_the_c_gate_refuses_what_it_cannot_call() -> None:
    native = _native_loader.native("on")
    variable, key, plain = instrumentor.suppression_keys()  # type: ignore[misc]
    with pytest.raises(TypeError):
        native.Gate(1, print, variable, key, plain, True)
    with pytest.raises(TypeError):
        native.Gate(print, print, {}, key, plain, True)
    gate = native.Gate(print, print, variable, key, plain, False)
    with pytest.raises(TypeError):
        gate(print, None, [], {})  # args must be a tuple
    with pytest.raises(TypeError):
        gate(print, None, ())
    with pytest.raises(TypeError):
        gate(print, None, (), {}, extra=1)


def test_the_fallback_and_the_off_option_take_the_python_wrappers(monkeypatch: pytest.MonkeyPatch) -> None:
    from otel_training.pipeline import configure as pipeline

    class Configured:
        options = {"native": "off"}

    keys = instrumentor.suppression_keys
    monkeypatch.setattr(pipeline, "get_telemetry", lambda: None)  # before configure(): the environment says
    monkeypatch.setenv("OTEL_TRAINING_NATIVE", "off")
    assert instrumentor._native_gate() is None
    monkeypatch.setenv("OTEL_TRAINING_NATIVE", "auto")
    assert (instrumentor._native_gate() is not None) == NATIVE
    monkeypatch.setenv("OTEL_TRAINING_NATIVE", "sometimes")  # configure() reports it; here: auto
    assert (instrumentor._native_gate() is not None) == NATIVE
    monkeypatch.setattr(instrumentor, "suppression_keys", lambda: None)  # an API whose keys C cannot read
    assert instrumentor._native_gate() is None
    monkeypatch.setattr(instrumentor, "suppression_keys", keys)
    monkeypatch.setattr(pipeline, "get_telemetry", lambda: Configured())  # the pipeline's option wins
    assert instrumentor._native_gate() is None
