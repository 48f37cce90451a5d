"""The offloaded span in C (``native/span.c``): the same span, the same records, as the Python one.

``RecordTracer.start_span`` takes the C core's ``begin_span`` whenever it can (the default sampler, no links,
a parent without trace state); every test here compares what it makes with what the pure-Python path makes
for the same calls, or checks the hand-over to that path where C does not apply.
"""

from __future__ import annotations

import gc
import os
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from otel_training import _native_loader, _ring
from otel_training._ring import CAP_FAST_RECORDS, DRAIN_FIELDS, Ring
from otel_training._sdk_compat import SPAN_CONTEXT_IS_TUPLE
from otel_training.pipeline.record_span import PyRecordSpan, RecordSpan
from otel_training.pipeline.record_tracer import RecordTracerProvider
from otel_training.pipeline.records import BEGIN, END

pytestmark = [
    pytest.mark.skipif(_ring.supported("on") is not None, reason=f"no C core here: {_ring.supported('on')}"),
    pytest.mark.skipif(os.environ.get("OTEL_TRAINING_BUILD_NATIVE") == "0",
                       reason="the C extension's build was skipped on purpose (OTEL_TRAINING_BUILD_NATIVE=0)"),
]


class Rig:
    """A provider on a C-core ring whose drain side (``reader``) says it reads fast records."""

    def __init__(self, capacity: int = 1 << 20) -> None:
        self.ring = Ring.create(capacity, "on")
        self.reader = Ring.attach(os.dup(self.ring.fd), "on")
        self.reader.put(DRAIN_FIELDS["caps"], CAP_FAST_RECORDS)
        self.emitted: list[tuple[bytes, bool | None]] = []

        def emit(payload: bytes, begin: bool | None) -> bool:
            self.emitted.append((payload, begin))
            return self.ring.write(payload, begin)

        self.provider = RecordTracerProvider(emit, Resource.create({}), fast=self.ring.fast_records())
        self.tracer = self.provider.get_tracer("t")

    def records(self) -> list[tuple[Any, ...]]:
        """What the drain decodes, in order (scope records included)."""
        import marshal

        decode = _native_loader.native("on").decode
        return [decode(payload) if payload[0] < 3 else marshal.loads(payload)
                for payload in self.reader.read(1 << 30)]

    def close(self) -> None:
        self.reader.close()
        self.ring.close()


@pytest.fixture
def rig() -> Iterator[Rig]:
    made = Rig()
    yield made
    made.close()


def _spans(records: list[tuple[Any, ...]], kind: int) -> list[tuple[Any, ...]]:
    return [record for record in records if record[0] == kind]


def test_spans_are_made_in_c_and_are_api_spans_with_the_python_spans_fields(rig: Rig) -> None:
    assert SPAN_CONTEXT_IS_TUPLE  # the installed API's SpanContext is the tuple the core builds
    parent = rig.tracer.start_span("parent", kind=SpanKind.SERVER, attributes={"a": 1})
    assert type(parent).__name__ == "NativeRecordSpan" and not isinstance(parent, PyRecordSpan)
    assert isinstance(parent, (RecordSpan, trace.Span))
    with trace.use_span(parent):
        assert trace.get_current_span() is parent
        child = rig.tracer.start_span("child", attributes={"b": "x"}, start_time=1_000)
    context, child_context = parent.get_span_context(), child.get_span_context()
    assert type(context) is SpanContext and context.is_valid and not context.is_remote
    assert context == SpanContext(context.trace_id, context.span_id, False, TraceFlags(3), context.trace_state)
    assert int(context.trace_flags) == 0x03 and int(child_context.trace_flags) == 0x03  # as the SDK's
    assert child_context.trace_id == context.trace_id and child.parent == context and parent.parent is None
    assert (parent.name, parent.kind, parent.attributes, parent.is_recording()) == ("parent", SpanKind.SERVER,
                                                                                     {"a": 1}, True)
    assert child.start_time == 1_000 and child.end_time is None and child.resource is rig.provider.resource
    child.set_attribute("c", 2.5)
    child.end(end_time=2_000)
    parent.end()
    assert not child.is_recording() and child.end_time == 2_000 and child.attributes == {"b": "x", "c": 2.5}
    records = rig.records()
    begins, ends = _spans(records, BEGIN), _spans(records, END)
    assert [(record[5], record[3], record[7]) for record in begins] == [
        ("parent", 0, SpanKind.SERVER.value), ("child", context.span_id, SpanKind.INTERNAL.value)]
    assert begins[1][6] == 1_000 and begins[1][8] == {"b": "x"}
    assert ends[0][1:3] == (child_context.span_id, 2_000) and ends[0][3] == {"c": 2.5}
    assert ends[1][1] == context.span_id and ends[1][2] == parent.end_time
    assert [begin for _, begin in rig.emitted if begin is not None] == []  # written by C: no span record via emit


@pytest.mark.parametrize("call", [lambda span: span.end(), lambda span: span.end(None), lambda span: span.end(7),
                                  lambda span: span.end(end_time=7)])
def test_end_takes_what_the_apis_end_takes_and_ends_once(rig: Rig, call: Any) -> None:
    span = rig.tracer.start_span("s")
    call(span)
    span.end(99)
    span.end()
    ends = _spans(rig.records(), END)
    assert len(ends) == 1 and ends[0][2] == span.end_time != 99
    with pytest.raises(TypeError):
        span.end(when=5)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        span.end(1, 2)  # type: ignore[call-arg]


def test_an_end_with_more_than_attributes_is_the_marshal_record_the_python_span_writes(rig: Rig) -> None:
    made = []
    for name in ("event", "status", "renamed", "link", "float end"):
        span = rig.tracer.start_span(name)
        if name == "event":
            span.add_event("e", {"k": 1}, timestamp=5)
        elif name == "status":
            span.set_status(Status(StatusCode.ERROR, "broken"))
        elif name == "renamed":
            span.update_name("new name")
        elif name == "link":
            span.add_link(SpanContext(1, 2, False), {"l": 1})
        span.end(12.5 if name == "float end" else None)
        made.append(span)
    ends = {record[1]: record for record in _spans(rig.records(), END)}
    events, status, renamed, link, float_end = (ends[span.get_span_context().span_id] for span in made)
    assert events[4] == [("e", 5, {"k": 1})]
    assert status[5] == (StatusCode.ERROR.value, "broken")
    assert renamed[6] == "new name"
    assert link[7][0][:2] == (1, 2)
    assert float_end[2] == 12.5  # carried as given; the drain's record check judges it


@pytest.mark.parametrize("given", [{"a": 1}, {}, None, [("a", 1), ("b", "x")], "mapping"])
def test_set_attributes_in_c_keeps_what_the_python_span_keeps(rig: Rig, given: Any) -> None:
    """``SpanCore.set_attributes`` is C (a step sets its counts on every span it ends): the same as
    ``RecordSpan.set_attributes`` for a dict, nothing, pairs and a Mapping, and nothing once ended."""
    from types import MappingProxyType

    if given == "mapping":
        given = MappingProxyType({"m": 2})
    spans = [rig.tracer.start_span("c"), PyRecordSpan(rig.provider, SpanContext(1, 2, False), None, "py",
                                                       SpanKind.INTERNAL, 1, {"s": 0}, (True, True))]
    assert type(spans[0]).__name__ == "NativeRecordSpan"
    for span in spans:
        span.set_attributes({"first": True})
        span.set_attributes(given)
        span.end(50)
        span.set_attributes({"late": 1})  # ended: ignored by both
    native, python = (dict(span._updates or {}) for span in spans)
    assert native == python and "late" not in native and native["first"] is True
    ends = _spans(rig.records(), END)
    assert ends[0][3] == native  # the C end record carries them


def test_start_child_makes_the_child_start_span_makes_under_the_current_span(rig: Rig) -> None:
    parent = rig.tracer.start_span("parent")
    with trace.use_span(parent):
        by_start = rig.tracer.start_span("a", attributes={"k": 1})
    by_child = rig.tracer.start_child("b", parent, {"k": 1})
    root = rig.tracer.start_child("root", trace.INVALID_SPAN, None)
    for span in (by_start, by_child):
        assert type(span) is type(by_start) and span.parent == parent.get_span_context()
        assert span.get_span_context().trace_id == parent.get_span_context().trace_id
        assert span.attributes == {"k": 1}
    assert root.parent is None and root.get_span_context().trace_id != parent.get_span_context().trace_id
    # a parent C does not take (one with a trace state) is still the parent, whatever the context says
    stated = NonRecordingSpan(SpanContext(5, 6, False, TraceFlags(TraceFlags.SAMPLED), TraceState([("v", "1")])))
    with trace.use_span(parent):
        under = rig.tracer.start_child("under a trace state", stated, None)
    assert isinstance(under, PyRecordSpan) and under.parent == stated.get_span_context()


def test_where_c_does_not_apply_the_python_path_makes_the_span(rig: Rig) -> None:
    state = TraceState([("vendor", "value")])
    with_state = NonRecordingSpan(SpanContext(5, 6, True, TraceFlags(TraceFlags.SAMPLED), state))
    child = rig.tracer.start_span("under a trace state", context=trace.set_span_in_context(with_state))
    assert isinstance(child, PyRecordSpan) and child.get_span_context().trace_state == state
    unsampled = NonRecordingSpan(SpanContext(5, 6, True, TraceFlags(TraceFlags.DEFAULT)))
    assert not rig.tracer.start_span("unsampled", context=trace.set_span_in_context(unsampled)).is_recording()
    linked = rig.tracer.start_span("linked", links=[trace.Link(SpanContext(1, 2, False))])
    odd = rig.tracer.start_span("odd", attributes={"sizes": (1, 2)})
    assert isinstance(linked, PyRecordSpan) and isinstance(odd, PyRecordSpan)
    remote = NonRecordingSpan(SpanContext(5, 6, True, TraceFlags(TraceFlags.SAMPLED)))
    from_remote = rig.tracer.start_span("remote parent", context=trace.set_span_in_context(remote))
    assert type(from_remote).__name__ == "NativeRecordSpan"
    assert int(from_remote.get_span_context().trace_flags) == 0x01  # the parent's trace id is not random
    for span in (child, linked, odd, from_remote):
        span.end()
    begins = {record[5]: record for record in _spans(rig.records(), BEGIN)}
    assert set(begins) == {"under a trace state", "linked", "odd", "remote parent"}
    assert begins["remote parent"][2:5] == (5, 6, True) and begins["remote parent"][12:] == (0x01, 0x01)
    assert begins["under a trace state"][11] == (("vendor", "value"),)


def test_a_full_ring_hands_both_records_to_the_providers_waiting_policy() -> None:
    rig = Rig(capacity=4096)
    try:
        spans = [rig.tracer.start_span("filler", attributes={"pad": "x" * 200}) for _ in range(40)]
        for span in spans:
            span.end()
        refused = [(payload[0], begin) for payload, begin in rig.emitted if payload[0] < 3]
        assert (1, True) in refused and (2, False) in refused  # handed over as the Python span hands them
    finally:
        rig.close()


def test_threads_ending_one_span_at_once_write_one_end(rig: Rig) -> None:
    for _ in range(20):
        span = rig.tracer.start_span("raced")
        barrier = threading.Barrier(4)

        def end(span: Any = span, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            span.end()

        threads = [threading.Thread(target=end) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(_spans(rig.records(), END)) == 20


def test_spans_in_reference_cycles_are_collected_and_open_ones_are_found_by_the_exit_path(rig: Rig) -> None:
    span = rig.tracer.start_span("cyclic")
    span.set_attribute("self", 1)
    span._updates["me"] = span  # type: ignore[index] # a cycle through a C field
    gone = weakref.ref(span)
    assert any(obj is span for obj in gc.get_objects())  # tracked: lifecycle/hooks.open_spans finds open spans
    del span
    gc.collect()
    assert gone() is None


def test_a_forked_child_makes_no_native_spans_into_its_parents_ring(rig: Rig) -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            span = rig.tracer.start_span("in the child")
            span.end()
            os.write(write, b"1" if isinstance(span, PyRecordSpan) and rig.provider.begin_span is None else b"0")
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    os.close(read)
    assert answer == b"1"
    assert [record for record in rig.records() if record[0] in (BEGIN, END)] == []
