"""A Duration's attributes from its content: the C extension's PlainAttributes (``native/attributes.c``) gives
what the Python path gives, or hands the content to it; never anything else, whatever the content holds."""

from __future__ import annotations

import enum
from collections import UserDict
from typing import Any

import pytest

from otel_training import _native_loader
from otel_training.events import duration as duration_module
from otel_training.events.attributes import CACHED_KEYS, MAX_KEYS
from otel_training.events.predefined import TrainerProcess


class _Key(str):
    pass


class _Level(enum.IntEnum):
    HIGH = 3


class _Odd:
    def __str__(self) -> str:
        return "odd"


def _contents() -> list[Any]:
    return [
        None, {}, {"batch_size": 32}, {"batch_size": 32, "loss": 0.25, "done": True},
        {"batch_size": 2**63 - 1}, {"batch_size": -(2**63)}, {"batch_size": 2**63}, {"batch_size": -(2**63) - 1},
        {"never_seen_before_key": 1}, {"batch_size": "thirty-two"}, {"batch_size": 1.5, "tag": "a"},
        {_Key("batch_size"): 1}, {"batch_size": _Level.HIGH}, {"nested": {"a": 1}}, {"batch_size": _Odd()},
        {"batch_size": [1, 2]}, {1: 2}, {f"k{index}": index for index in range(MAX_KEYS + 5)},
        UserDict({"batch_size": 3}), UserDict(),
    ]


def _attributes() -> list[Any]:
    return [None, {}, {"training.step": 7}, {"training.step": 7, "training.event.target": "forged"}]


def _made(content: Any, attributes: Any) -> tuple[dict[str, Any], Any]:
    trainer = TrainerProcess()
    step = duration_module.Duration(trainer, "training.step", content, event_name="#step", attributes=attributes)
    return step.attributes, step._late


def test_the_c_path_gives_the_python_paths_attributes_for_any_content(monkeypatch: pytest.MonkeyPatch) -> None:
    extension = _native_loader.at_import(True)
    if extension is None:
        pytest.skip(f"no C extension here: {_native_loader.problem()}")
    c_path = extension.PlainAttributes("training.event.target", "training.event.name", CACHED_KEYS, MAX_KEYS)
    _made({"batch_size": 1, "loss": 0.5, "done": False, "tag": "x"}, None)  # their keys seen once (cached)
    compared = 0
    for content in _contents():
        for attributes in _attributes():
            monkeypatch.setattr(duration_module, "_PLAIN", None)
            expected = _made(content, attributes)
            monkeypatch.setattr(duration_module, "_PLAIN", c_path)
            assert _made(content, attributes) == expected, (content, attributes)
            compared += 1
    assert compared == len(_contents()) * len(_attributes())


def test_the_c_path_takes_only_plain_content_and_refuses_bad_calls() -> None:
    extension = _native_loader.at_import(True)
    if extension is None:
        pytest.skip(f"no C extension here: {_native_loader.problem()}")
    cached = {"batch_size": "training.batch.size"}
    build = extension.PlainAttributes("t", "n", cached, 2)
    assert build("me", "#step", {"training.step": 1}, {"batch_size": 4}) == {
        "t": "me", "n": "#step", "training.step": 1, "training.batch.size": 4}
    assert build("me", "#step", None, None) == {"t": "me", "n": "#step"}
    for content in ({"other": 1}, {"batch_size": "4"}, {"batch_size": 2**64}, {"batch_size": 1, "a": 1, "b": 2},
                    UserDict({"batch_size": 4}), {_Key("batch_size"): 4}):
        assert build("me", "#step", None, content) is None, content
    assert build("me", "#step", UserDict({"a": 1}), None) is None  # not a dict: the Python path updates with it
    for call in (lambda: build(), lambda: build("me", "#step", None), lambda: build("a", "b", None, None, x=1)):
        with pytest.raises(TypeError):
            call()
    with pytest.raises(TypeError):
        extension.PlainAttributes("t", "n", UserDict(), 2)
    with pytest.raises(TypeError):
        extension.PlainAttributes("t", "n", {}, -1)
