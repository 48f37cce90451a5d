"""Each accessor of ``_sdk_compat`` still reads the real thing on the installed SDK.

A renamed SDK internal must fail here, loudly, rather than degrade quietly at a
user's (pending spans counted as dropped, the file exporter on its slow path).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import metrics as metrics_api
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

import otel_training
from otel_training import _native_loader, _sdk_compat


def _require_extension() -> None:
    """The C extension's tests run where it is built (CI builds it); elsewhere they say why not."""
    pytest.skip(f"no C extension here: {_native_loader.problem()}")

PACKAGE = Path(otel_training.__file__).parent


class _Held(SpanExporter):
    def export(self, spans: Any) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def test_the_batch_processors_queue_length_is_read() -> None:
    # A schedule delay of an hour and a batch bigger than what is queued: nothing leaves the queue.
    processor = BatchSpanProcessor(_Held(), max_queue_size=100, schedule_delay_millis=3_600_000,
                                   max_export_batch_size=100)
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("test")
    assert _sdk_compat.batch_queue_length(processor) == 0
    for _ in range(7):
        tracer.start_span("s").end()
    assert _sdk_compat.batch_queue_length(processor) == 7
    provider.shutdown()


def test_an_unknown_processor_has_no_queue_length() -> None:
    assert _sdk_compat.batch_queue_length(object()) is None  # type: ignore[arg-type]


def test_the_api_placeholder_meter_provider_is_recognised() -> None:
    assert not _sdk_compat.is_proxy_meter_provider(MeterProvider(shutdown_on_exit=False))
    placeholder = metrics_api._internal._ProxyMeterProvider()
    assert _sdk_compat.is_proxy_meter_provider(placeholder)


def test_a_tracer_emits_into_a_live_spans_pipeline() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource({"service.name": "probe"}), shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    span = provider.get_tracer("test").start_span("watched")
    pipeline = _sdk_compat.span_pipeline(span)
    assert pipeline is not None
    tracer = _sdk_compat.tracer_for_pipeline(span.resource, pipeline, ALWAYS_ON, RandomIdGenerator(),
                                             InstrumentationScope("scope"))
    tracer.start_span("alert").end()
    span.end()
    (alert, watched) = exporter.get_finished_spans()
    assert (alert.name, alert.resource.attributes["service.name"]) == ("alert", "probe")
    assert watched.name == "watched"
    assert _sdk_compat.span_pipeline(object()) is None


def test_span_fields_read_the_sdk_fields_and_equal_the_public_properties(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _sdk_compat.READS_SDK_FIELDS, "this SDK keeps its span fields elsewhere: the file exporter's fast path is off"
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("test").start_as_current_span("s", attributes={"k": 1}) as span:
        span.add_event("e")
    (finished,) = exporter.get_finished_spans()
    fast = _sdk_compat.span_fields(finished)
    fast_items = dict(_sdk_compat.attribute_items(finished.attributes))
    monkeypatch.setattr(_sdk_compat, "READS_SDK_FIELDS", False)
    slow = _sdk_compat.span_fields(finished)
    assert fast[:6] == slow[:6] and fast[9:] == slow[9:]
    assert dict(fast[6]) == dict(slow[6]) == fast_items == {"k": 1}
    assert list(fast[7]) == list(slow[7]) and len(fast[7]) == 1


def test_the_probe_turns_the_direct_reads_off_when_the_sdk_keeps_a_field_elsewhere(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class CopiesItsEvents(ReadableSpan):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._events = tuple(self._events)

    assert _sdk_compat._reads_sdk_fields()
    monkeypatch.setattr(_sdk_compat, "ReadableSpan", CopiesItsEvents)
    assert not _sdk_compat._reads_sdk_fields()


#: Private SDK/API names some module once reached for; only _sdk_compat may.
_SDK_PRIVATE = {"_batch_processor", "_span_processor", "_ProxyMeterProvider", "_BaseConfigurator",
                "_active_span_processor", "_real_meter_provider"}


def _private_otel_uses(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("opentelemetry"):
            parts = (node.module or "").split(".") + [alias.name for alias in node.names]
            found += [f"{path.name}:{node.lineno} from {node.module} import {alias.name}" for alias in node.names
                      if any(part.startswith("_") for part in parts)]
        elif isinstance(node, ast.Attribute) and (node.attr in _SDK_PRIVATE or node.attr == "_internal"):
            found.append(f"{path.name}:{node.lineno} .{node.attr}")
    return found


@pytest.mark.parametrize("native", [False, True], ids=["python", "c"])
def test_the_fast_instrumentation_check_reads_contribs_suppression_keys(native: bool) -> None:
    """The check the torch hooks make, as contrib's: in Python and in C (``native/gate.c``), in and out of
    ``suppress_instrumentation()``, with either key, and in a context where nothing is set yet."""
    import contextvars

    from opentelemetry import context as context_api
    from opentelemetry.instrumentation.utils import is_instrumentation_enabled, suppress_instrumentation

    if native and _native_loader.problem() is not None:
        _require_extension()
    enabled = _sdk_compat.instrumentation_check(native)
    assert enabled is not is_instrumentation_enabled  # the fast one, not the fallback
    assert (type(enabled).__name__ == "InstrumentationEnabled") is native
    assert contextvars.Context().run(enabled) is True
    if native:
        with pytest.raises(TypeError):
            enabled(1)
    assert enabled() is is_instrumentation_enabled() is True
    with suppress_instrumentation():
        assert enabled() is is_instrumentation_enabled() is False
    # the plain-string key older instrumentations set
    token = context_api.attach(context_api.set_value("suppress_instrumentation", True))
    try:
        assert enabled() is is_instrumentation_enabled() is False
    finally:
        context_api.detach(token)
    assert enabled() is True


def test_no_module_but_sdk_compat_reaches_into_opentelemetry_internals() -> None:
    uses = [use for path in sorted(PACKAGE.rglob("*.py")) if path.name != "_sdk_compat.py"
            for use in _private_otel_uses(path)]
    assert uses == []


@pytest.mark.parametrize("native", [False, True], ids=["python", "c"])
def test_span_switch_reads_and_switches_the_current_span_as_the_api_does(native: bool) -> None:
    """``span_switch`` goes around the API's frames on the default runtime context: the same current span, the
    same context after attach and detach, and the API sees what it set; the C extension's calls
    (``native/context.c``) and the Python closures alike."""
    from opentelemetry import context as context_api
    from opentelemetry import trace as trace_api
    from opentelemetry.trace import NonRecordingSpan, SpanContext

    if native and _native_loader.problem() is not None:
        _require_extension()
    switch = _sdk_compat.span_switch(native)
    if native:  # the extension's, no Python frame
        assert type(switch.current).__name__ == "CurrentSpan" and type(switch.attach).__name__ == "AttachSpan"
    else:  # the fast closures, on the installed API
        assert switch.current.__qualname__.startswith("span_switch")
    outer = NonRecordingSpan(SpanContext(1, 2, False))
    inner = NonRecordingSpan(SpanContext(1, 3, False))
    assert switch.current() is trace_api.get_current_span() is trace_api.INVALID_SPAN
    key_token = context_api.attach(context_api.set_value("other", 7))
    with trace_api.use_span(outer):
        assert switch.current() is outer
        token = switch.attach(inner)
        assert trace_api.get_current_span() is inner and switch.current() is inner
        assert context_api.get_value("other") == 7  # the rest of the context is kept
        switch.detach(token)
        assert trace_api.get_current_span() is outer
    context_api.detach(key_token)
    assert switch.current() is trace_api.INVALID_SPAN
    assert _sdk_compat.trace_id_of(SpanContext(9, 8, False)) == 9



def test_the_c_span_switch_outside_any_context_and_on_bad_calls() -> None:
    """In a fresh thread context (nothing set yet) the C reader gives the invalid span and attach starts from an
    empty context; wrong calls raise TypeError, as a Python function would, never crash."""
    import contextvars

    from opentelemetry import trace as trace_api
    from opentelemetry.trace import NonRecordingSpan, SpanContext

    if _native_loader.problem() is not None:
        _require_extension()
    switch = _sdk_compat.span_switch(True)
    span = NonRecordingSpan(SpanContext(4, 5, False))

    def fresh() -> None:
        assert switch.current() is trace_api.INVALID_SPAN
        token = switch.attach(span)
        assert trace_api.get_current_span() is span and switch.current() is span
        switch.detach(token)
        assert switch.current() is trace_api.INVALID_SPAN

    contextvars.Context().run(fresh)
    for call in (lambda: switch.current(1), lambda: switch.attach(), lambda: switch.attach(span, span),
                 lambda: switch.attach(span=span)):
        with pytest.raises(TypeError):
            call()
    extension = _native_loader.native("on")
    for made_half in (lambda: extension.CurrentSpan.__new__(extension.CurrentSpan)(),
                      lambda: extension.InstrumentationEnabled.__new__(extension.InstrumentationEnabled)(),
                      lambda: extension.Gate.__new__(extension.Gate)("iterator")):
        with pytest.raises(TypeError):  # never an instance without its fields, never a crash
            made_half()
    with pytest.raises(TypeError):
        extension.InstrumentationEnabled(contextvars.ContextVar("v"), "key", 1)
    with pytest.raises(TypeError):
        extension.CurrentSpan(object(), "key", None)
    with pytest.raises(TypeError):
        extension.AttachSpan(contextvars.ContextVar("v"), "key", "not a type")
