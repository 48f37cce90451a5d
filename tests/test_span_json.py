"""The direct span encoder writes, to the byte, what the OTLP protobuf encoder and protobuf's JSON mapping wrote.

The reference is the route the file exporter took before and metrics still
take: ``to_otlp_json(encode_spans(spans))``. Batches are randomized but seeded,
so a failure reproduces; ``_coverage`` checks that the batches really hold
every field and value kind the comparison is meant to cover.
"""

from __future__ import annotations

import enum
import json
import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState
from otlp_json import read_spans

from otel_training import _sdk_compat
from otel_training.exporters.otlp_json import OtlpJsonFileSpanExporter, to_otlp_json
from otel_training.exporters.span_json import spans_to_otlp_json

_CHARACTERS = ["a", "Z", "0", " ", "_", ".", '"', "\\", "/", "\n", "\r", "\t", "\b", "\f", "\x00", "\x1f", "\x7f",
               "é", "ß", "中", "\u2028", "\u2029", "\ufeff", "😀", "\U0010ffff"]
_SURROGATE = "\ud83d"  # half of a pair: UTF-8 cannot hold it


class _Level(enum.IntEnum):
    HIGH = 7


class _Float(float):
    def __repr__(self) -> str:
        return "not what JSON should say"


class _Text(str):
    pass


def _text(rng: random.Random, surrogates: bool = False) -> str:
    text = "".join(rng.choice(_CHARACTERS) for _ in range(rng.randrange(0, 9)))
    if surrogates and rng.random() < 0.05:
        text += _SURROGATE
    return text


def _int(rng: random.Random) -> int:
    return rng.choice([0, 1, -1, 2**53 + 1, 2**63 - 1, -(2**63), rng.randrange(-(2**63), 2**63),
                       rng.randrange(-1000, 1000), 2**63, -(2**63) - 1, 2**64 + 5])  # the last three: out of int64


def _float(rng: random.Random) -> float:
    return rng.choice([0.0, -0.0, 1.0, 0.1, 1e16, 1e-7, 1e308, -1e308, 5e-324, 2.5e-310, 123456789.125,
                       math.nan, math.inf, -math.inf, rng.uniform(-1e9, 1e9), rng.random()])


def _scalar(rng: random.Random, kind: str, surrogates: bool = False) -> Any:
    if kind == "str":
        return _text(rng, surrogates)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "int":
        return _int(rng)
    return _float(rng)


def _sdk_value(rng: random.Random) -> Any:
    """What the SDK's attribute validation lets through: scalars and homogeneous sequences (None allowed in them)."""
    kind = rng.choice(["str", "bool", "int", "float"])
    shape = rng.random()
    if shape < 0.6:
        return _scalar(rng, kind, surrogates=True)
    values = [None if rng.random() < 0.1 else _scalar(rng, kind) for _ in range(rng.randrange(0, 4))]
    return values if shape < 0.8 else tuple(values)


def _any_value(rng: random.Random, depth: int = 0) -> Any:
    """What a span built by hand (as the watchdog does) may hold: all the OTLP encoder knows, and some it refuses."""
    pick = rng.random()
    if pick < 0.45 or depth > 2:
        return _sdk_value(rng)
    if pick < 0.55:
        return rng.choice([None, b"", b"\x00\xffbytes", bytes(range(7))])
    if pick < 0.65:
        return [_any_value(rng, depth + 1) for _ in range(rng.randrange(0, 3))]  # mixed types, nested
    if pick < 0.75:
        return {rng.choice(["k", "", 3, "é\n"]): _any_value(rng, depth + 1) for _ in range(rng.randrange(0, 3))}
    if pick < 0.85:
        return rng.choice([_Level.HIGH, _Float(2.5), _Float(math.nan), _Text("sub\"class")])
    return rng.choice([object(), {1, 2}, 1 + 2j])  # refused: the attribute is left out


def _attributes(rng: random.Random, count: int, value=_sdk_value, odd_keys: bool = False) -> dict[Any, Any]:
    attributes: dict[Any, Any] = {}
    for _ in range(rng.randrange(0, count + 1)):
        key = rng.choice(["training.step", "training.epoch", "k", "ключ", 'q"uote']) + _text(rng)
        if odd_keys and rng.random() < 0.15:
            key = rng.choice(["", 5, "bad" + _SURROGATE])
        attributes[key] = value(rng)
    return attributes


def _span_context(rng: random.Random, remote: bool | None = None) -> SpanContext:
    state = TraceState([("vendor", "a1"), ("other", "x-y")]) if rng.random() < 0.3 else TraceState()
    return SpanContext(rng.randrange(1, 2**128), rng.choice([1, rng.randrange(1, 2**64), 2**64 - 1]),
                       is_remote=rng.random() < 0.5 if remote is None else remote,
                       trace_flags=TraceFlags(TraceFlags.SAMPLED), trace_state=state)


def _providers(memory: InMemorySpanExporter) -> list[TracerProvider]:
    limits = SpanLimits(max_attributes=6, max_events=2, max_links=2, max_event_attributes=3, max_link_attributes=3)
    resources = [
        Resource({"service.name": "train", "training.rank": 3, "ok": True, "loss": 0.5, "ids": (1, 2)},
                 "https://opentelemetry.io/schemas/1.26.0"),
        Resource({"service.name": "other\n中", "empty": ()}),
        Resource({}),
        # Equal to the first but another object: the OTLP encoder's dict puts its spans in the same group.
        Resource({"service.name": "train", "training.rank": 3, "ok": True, "loss": 0.5, "ids": (1, 2)},
                 "https://opentelemetry.io/schemas/1.26.0"),
    ]
    providers = []
    for resource in resources:
        provider = TracerProvider(resource=resource, span_limits=limits, shutdown_on_exit=False)
        provider.add_span_processor(SimpleSpanProcessor(memory))
        providers.append(provider)
    return providers


def _tracers(providers: list[TracerProvider]) -> list[trace.Tracer]:
    tracers = []
    for provider in providers:
        tracers.append(provider.get_tracer("otel_training", "0.1.0"))
        tracers.append(provider.get_tracer("scope.with.schema", schema_url="https://example.com/s",
                                           attributes={"scope.attr": "v", "n": 1}))
        tracers.append(provider.get_tracer("unnamed-version"))
    return tracers


def _sdk_span(rng: random.Random, tracer: trace.Tracer) -> None:
    parent = rng.random()
    context = None
    if parent < 0.7:
        context = trace.set_span_in_context(NonRecordingSpan(_span_context(rng)))
    links = [Link(_span_context(rng), _attributes(rng, 4)) for _ in range(rng.randrange(0, 4))]
    span = tracer.start_span(_text(rng) if rng.random() < 0.9 else "", context=context,
                             kind=rng.choice(list(SpanKind)), attributes=_attributes(rng, 9), links=links,
                             start_time=rng.choice([0, rng.randrange(1, 2**63)]))
    for _ in range(rng.randrange(0, 4)):
        span.add_event(_text(rng), _attributes(rng, 4), timestamp=rng.choice([0, rng.randrange(1, 2**63)]))
    status = rng.random()
    if status < 0.25:
        span.set_status(Status(StatusCode.ERROR, _text(rng) or None))
    elif status < 0.4:
        span.set_status(Status(StatusCode.OK))
    span.end(end_time=rng.choice([0, rng.randrange(1, 2**63)]))


class _OwnSpan(ReadableSpan):
    """Not the SDK's own class: read only through the public properties."""


def _hand_made_span(rng: random.Random, resource: Resource) -> ReadableSpan:
    scope = rng.choice([None, InstrumentationScope("hand", "1", "https://example.com/h", {"a": 1}),
                        InstrumentationScope("")])
    kind = rng.choice([ReadableSpan, _OwnSpan])
    return kind(
        name=_text(rng),
        context=_span_context(rng, remote=False),
        parent=rng.choice([None, _span_context(rng)]),
        resource=resource,
        attributes=rng.choice([None, _attributes(rng, 6, _any_value, odd_keys=True)]),
        events=[Event(_text(rng), _attributes(rng, 3, _any_value, odd_keys=True), rng.randrange(0, 2**63))
                for _ in range(rng.randrange(0, 3))],
        links=[Link(_span_context(rng), _attributes(rng, 3, _any_value)) for _ in range(rng.randrange(0, 2))],
        kind=rng.choice(list(SpanKind)),
        status=rng.choice([Status(StatusCode.UNSET), Status(StatusCode.ERROR, "died\n" + _text(rng)),
                           Status(StatusCode.ERROR)]),
        start_time=rng.randrange(0, 2**63),
        end_time=rng.choice([None, rng.randrange(0, 2**63)]),
        instrumentation_scope=scope,
    )


def _batches(seed: int) -> Iterator[list[ReadableSpan]]:
    rng = random.Random(seed)
    memory = InMemorySpanExporter()
    providers = _providers(memory)
    tracers = _tracers(providers)
    for _ in range(300):
        _sdk_span(rng, rng.choice(tracers))
    spans: list[ReadableSpan] = list(memory.get_finished_spans())
    spans += [_hand_made_span(rng, rng.choice([provider.resource for provider in providers])) for _ in range(100)]
    rng.shuffle(spans)  # resources and scopes interleave within a batch
    while spans:
        size = rng.choice([1, 2, 7, 50, 200])
        yield spans[:size]
        spans = spans[size:]


def _reference(spans: list[ReadableSpan]) -> str:
    return to_otlp_json(encode_spans(spans))


_SEEDS = range(6)


@pytest.fixture(params=[True, False], ids=["sdk-fields", "public-properties"])
def sdk_fields(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    assert _sdk_compat.READS_SDK_FIELDS, "this SDK keeps its span fields elsewhere: the fast path is off"
    monkeypatch.setattr(_sdk_compat, "READS_SDK_FIELDS", request.param)
    return request.param


@pytest.mark.parametrize("seed", _SEEDS)
def test_randomized_batches_encode_to_the_same_bytes(seed: int, sdk_fields: bool) -> None:
    for batch in _batches(seed):
        expected = _reference(batch)
        actual = spans_to_otlp_json(batch)
        assert json.loads(actual) == json.loads(expected)
        assert actual == expected


def _walk(node: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value
            yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def test_the_randomized_batches_hold_every_field_and_value_kind() -> None:
    """Without this, a generator that lost a case would leave the comparison above passing vacuously."""
    found: dict[str, set[Any]] = {}
    batches = resource_groups = 0
    for seed in _SEEDS:
        for batch in _batches(seed):
            request = json.loads(_reference(batch))
            batches += 1
            resource_groups = max(resource_groups, len(request["resourceSpans"]))
            for key, value in _walk(request):
                found.setdefault(key, set()).add(json.dumps(value, sort_keys=True) if key in (
                    "doubleValue", "arrayValue", "kvlistValue", "flags", "status", "scope", "resource") else "")
    for key in ("traceId", "spanId", "parentSpanId", "traceState", "name", "kind", "startTimeUnixNano",
                "endTimeUnixNano", "attributes", "droppedAttributesCount", "events", "droppedEventsCount", "links",
                "droppedLinksCount", "status", "flags", "timeUnixNano", "schemaUrl", "scope", "version",
                "stringValue", "boolValue", "intValue", "doubleValue", "bytesValue", "arrayValue", "kvlistValue",
                "value", "key", "message", "code", "scopeSpans", "resourceSpans", "resource"):
        assert key in found, key
    assert {'"NaN"', '"Infinity"', '"-Infinity"', "-0.0", "5e-324"} <= found["doubleValue"]
    assert "{}" in found["arrayValue"] and len(found["arrayValue"]) > 1  # empty and not
    assert "{}" in found["kvlistValue"] and len(found["kvlistValue"]) > 1
    assert {"256", "768"} <= found["flags"]
    assert {"{}", '{"code": 1}', '{"code": 2}'} <= found["status"]
    assert "{}" in found["scope"] and "{}" in found["resource"]
    assert batches > 20 and resource_groups >= 3


def test_refused_attributes_are_left_out_as_the_otlp_encoder_leaves_them_out() -> None:
    span = ReadableSpan(
        "refusals", context=SpanContext(1, 2, is_remote=False),
        attributes={"big": 2**63, "small": -(2**63) - 1, "list": [1, 2**64], "text": "a" + _SURROGATE,
                    "bad" + _SURROGATE: 1, 7: "not a string key", "object": object(), "kept": "yes", "": "no key"},
        start_time=1, end_time=2)
    line = spans_to_otlp_json([span])
    assert line == _reference([span])
    attributes = json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"]
    assert attributes == [{"key": "kept", "value": {"stringValue": "yes"}}, {"value": {"stringValue": "no key"}}]


def test_a_span_name_utf8_cannot_hold_fails_the_batch_and_writes_nothing(tmp_path: Path) -> None:
    good = ReadableSpan("good", context=SpanContext(1, 2, is_remote=False), start_time=1, end_time=2)
    bad = ReadableSpan("bad" + _SURROGATE, context=SpanContext(1, 3, is_remote=False), start_time=1, end_time=2)
    with pytest.raises(UnicodeEncodeError):
        _reference([good, bad])
    path = tmp_path / "traces-r0.jsonl"
    exporter = OtlpJsonFileSpanExporter(path)
    assert exporter.export([good, bad]) is SpanExportResult.FAILURE
    assert exporter.export([good]) is SpanExportResult.SUCCESS
    exporter.shutdown()
    assert [span["name"] for span in read_spans(path)] == ["good"]


def test_an_empty_batch_is_an_empty_request() -> None:
    assert spans_to_otlp_json([]) == _reference([]) == "{}"
