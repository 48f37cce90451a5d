"""The torch instrumentor's per-step stand-ins: the C gate (``native/gate.c``) does what the Python ones do.

Each test runs both: the Python stand-in (``_fetch_wrapper(tracker, wrapped)``, what the fallback runs) and the
C one (``_fetch_wrapper(tracker, wrapped, _native_gate())``), called as the function they stand in for is:
the DataLoader iterator's ``__next__`` as a method (``next(iterator)``), ``torch.autograd.backward`` as a
module's function.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any

import pytest
from opentelemetry.instrumentation.utils import suppress_instrumentation

from otel_training import _native_loader, _ring
from otel_training.integrations.torch import instrumentor

NATIVE = _ring.supported("on") is None and os.environ.get("OTEL_TRAINING_BUILD_NATIVE") != "0"


class Tracker:
    """Records the hook calls the stand-ins make."""

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
    from otel_training.assembly import configure as pipeline

    with pytest.MonkeyPatch.context() as patch:  # CI's fallback pass says off: these tests are the C gate's
        patch.setenv("OTEL_TRAINING_NATIVE", "auto")
        patch.setattr(pipeline, "get_telemetry", lambda: None)
        gate = instrumentor._native_gate()
    assert gate is not None  # the extension loads here and the suppression keys are read
    return gate


class Loader:
    """An iterator class whose ``__next__`` the fetch stand-in takes the place of, as on ``_BaseDataLoaderIter``."""

    def __init__(self, batches: list[Any]) -> None:
        self.batches = list(batches)
        self.seen: list[tuple[Any, ...]] = []

    def __iter__(self) -> Loader:
        return self

    def __next__(self, *args: Any, **kwargs: Any) -> Any:
        """The next batch."""
        self.seen.append((args, kwargs))
        if not self.batches:
            raise StopIteration
        return self.batches.pop(0)


def _loader_class(tracker: Any, which: str | None, next_: Any = None) -> tuple[type[Loader], Any]:
    """A fresh Loader subclass with the stand-in installed as its ``__next__``, and the stand-in's close."""
    cls = type("Loader", (Loader,), {})
    stand_in, close = instrumentor._fetch_wrapper(tracker, next_ or Loader.__next__, _gate(which))
    cls.__next__ = stand_in  # type: ignore[method-assign]
    return cls, close


@pytest.mark.parametrize("which", _makers())
def test_a_fetch_calls_begin_with_the_iterator_and_end_with_its_start(which: str | None) -> None:
    tracker = Tracker()
    cls, _ = _loader_class(tracker, which)
    assert (type(vars(cls)["__next__"]).__name__ == "Gate") == (which is not None)
    loader = cls(["batch"])
    assert next(loader) == "batch"  # the interpreter's own call
    assert tracker.calls == [("fetch_begin", loader), ("fetch_end", 41, None)]
    tracker.calls.clear()
    loader.batches.append("second")
    assert loader.__next__(1, k=3) == "second"  # bound as a method, arguments passed on as they came
    assert loader.seen[-1] == ((1,), {"k": 3})
    assert tracker.calls == [("fetch_begin", loader), ("fetch_end", 41, None)]
    loader.batches.append("third")
    assert cls.__next__(loader) == "third"  # unbound from the class, the iterator first
    assert tracker.calls[-2:] == [("fetch_begin", loader), ("fetch_end", 41, None)]


@pytest.mark.parametrize("which", _makers())
def test_the_stand_in_looks_like_the_function_it_stands_in_for(which: str | None) -> None:
    cls, _ = _loader_class(Tracker(), which)
    stand_in = vars(cls)["__next__"]
    assert stand_in.__wrapped__ is Loader.__next__
    assert stand_in.__name__ == "__next__" and stand_in.__doc__ is not None
    assert cls.__next__.__qualname__ == Loader.__next__.__qualname__
    assert list(cls(["a", "b"])) == ["a", "b"]  # a for loop over it


@pytest.mark.parametrize("which", _makers())
@pytest.mark.parametrize("error", [StopIteration(), ValueError("broken loader"), KeyboardInterrupt()])
def test_a_fetch_that_raises_ends_with_the_error_and_the_error_goes_on(which: str | None,
                                                                       error: BaseException) -> None:
    tracker = Tracker()

    def broken(iterator: Any) -> None:
        raise error

    cls, _ = _loader_class(tracker, which, broken)
    loader = cls([])
    with pytest.raises(type(error)) as raised:
        loader.__next__()
    assert raised.value is error and raised.value.__traceback__ is not None
    assert tracker.calls == [("fetch_begin", loader), ("fetch_end", 41, error)]
    assert sys.exc_info() == (None, None, None)


@pytest.mark.parametrize("which", _makers())
def test_backward_calls_begin_then_end_and_no_end_when_it_raises(which: str | None) -> None:
    tracker = Tracker()
    module = types.ModuleType("autograd")
    backward, _ = instrumentor._backward_wrapper(tracker, lambda *args, **kwargs: (args, kwargs), _gate(which))
    module.backward = backward  # type: ignore[attr-defined]
    assert module.backward("loss", None, retain_graph=True) == (("loss", None), {"retain_graph": True})
    assert tracker.calls == [("backward_begin",), ("backward_end",)]
    tracker.calls.clear()

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("out of memory")

    backward, _ = instrumentor._backward_wrapper(tracker, broken, _gate(which))
    with pytest.raises(RuntimeError, match="out of memory"):
        backward()
    assert tracker.calls == [("backward_begin",)]


@pytest.mark.parametrize("which", _makers())
def test_inside_suppress_instrumentation_or_once_closed_only_the_wrapped_call_runs(which: str | None) -> None:
    tracker = Tracker()
    cls, close_fetch = _loader_class(tracker, which)
    backward, close_backward = instrumentor._backward_wrapper(tracker, lambda: "grads", _gate(which))
    loader = cls(["a", "b", "c"])
    with suppress_instrumentation():
        assert next(loader) == "a"
        assert backward() == "grads"
    assert tracker.calls == []
    assert next(loader) == "b"  # and on again after it
    assert tracker.calls[0] == ("fetch_begin", loader)
    tracker.calls.clear()
    close_fetch()
    close_backward()
    assert next(loader) == "c" and backward() == "grads"
    assert tracker.calls == []  # closed: passes calls on, records nothing


@pytest.mark.parametrize("which", _makers())
def test_an_error_in_a_hook_goes_up_as_from_the_python_wrapper(which: str | None) -> None:
    class Broken(Tracker):
        def fetch_end(self, started: Any, error: BaseException | None = None) -> None:
            raise LookupError("hook")

    cls, _ = _loader_class(Broken(), which)
    with pytest.raises(LookupError, match="hook"):
        next(cls(["batch"]))

    def loader_error(iterator: Any) -> None:
        raise ValueError("loader")

    cls, _ = _loader_class(Broken(), which, loader_error)
    with pytest.raises(LookupError, match="hook"):  # the hook's error, not the loader's, as in Python
        next(cls([]))


@pytest.mark.skipif(not NATIVE, reason="no C core here")
def test_the_c_gate_refuses_what_it_cannot_call() -> None:
    native = _native_loader.native("on")
    variable, key, plain = instrumentor.suppression_keys()  # type: ignore[misc]
    with pytest.raises(TypeError):
        native.Gate(1, print, variable, key, plain, True, print)
    with pytest.raises(TypeError):
        native.Gate(print, print, {}, key, plain, True, print)
    with pytest.raises(TypeError):
        native.Gate(print, print, variable, key, plain, True, "not callable")
    with pytest.raises(TypeError):
        native.Gate(print, print, variable, key, plain, True)  # no wrapped
    fetch = native.Gate(print, print, variable, key, plain, True, print)
    with pytest.raises(TypeError, match="iterator first"):
        fetch()  # a fetch without its iterator
    half = native.Gate.__new__(native.Gate)
    with pytest.raises(TypeError):
        half("iterator")
    with pytest.raises(AttributeError):
        half.__wrapped__  # noqa: B018
    assert half.closed is False


def test_the_fallback_and_the_off_option_take_the_python_wrappers(monkeypatch: pytest.MonkeyPatch) -> None:
    from otel_training.assembly import configure as pipeline

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
