"""A tracer whose spans are records in the offload ring, turned into SDK spans by the drain process.

``RecordSpan`` implements the OpenTelemetry API's ``Span``: the events API, the
integrations and the user's own code (through the global provider) use it as
any span (context, parentage, attributes, events, status, exceptions, links).
Beginning one writes a begin record (ids, parent, flags, trace state, name,
start time, attributes, links); ending it writes an end record (end time and
whatever was added meanwhile). No SDK span, no attribute validation, no span
processor runs here: the drain process replays the records through the SDK
and the pipeline's processors and exporters (``pipeline/drain.py``), so the
spans it exports are the ones this process would have exported.

Sampling is decided here, with the SDK's sampler from the environment (the
default, parent-based always-on, costs nothing); the record carries the
decision and the drain's SDK repeats it. Span limits are applied by the drain.
Nothing here raises into the caller: a value marshal cannot carry is converted
as the SDK would keep it (a subclass to its base type, anything else to text).
"""

from __future__ import annotations

import logging
import marshal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.sampling import DEFAULT_ON, Decision, Sampler
from opentelemetry.trace import DEFAULT_TRACE_STATE, Link, SpanContext, SpanKind, TraceFlags

from otel_training import _native_loader
from otel_training._contain import log_once
from otel_training._fork import reset_in_child
from otel_training._ids import getrandbits
from otel_training._sdk_compat import SPAN_CONTEXT_IS_TUPLE, span_switch
from otel_training.config.parsers import ConfigError
from otel_training.pipeline.record_span import _ON_EXCEPTION, PyRecordSpan, RecordSpan, native_span_class
from otel_training.pipeline.records import BEGIN, SCOPE, Emit, FastRecords, encode, encode_links, encode_plain
from otel_training.processors.lineage import LineageSpanProcessor

logger = logging.getLogger("otel_training")

#: A root's flags, as the SDK sets them: sampled, and a random trace id (ours are); a child's keep the
#: parent's random-trace-id bit. Made once: the hot path only looks them up.
_ROOT_FLAGS = TraceFlags(TraceFlags.SAMPLED | TraceFlags.RANDOM_TRACE_ID)
_CHILD_FLAGS = {0: TraceFlags(TraceFlags.SAMPLED), TraceFlags.RANDOM_TRACE_ID: _ROOT_FLAGS}
#: ``trace.get_current_span()`` in one Python frame (``_sdk_compat.span_switch``).
_CURRENT_SPAN: Callable[[], trace_api.Span] = span_switch().current
_INTERNAL = SpanKind.INTERNAL  # an Enum's __hash__ is a Python call: the usual kind is compared first
_KIND_VALUES = {kind: kind.value for kind in SpanKind}  # an Enum's ``.value`` is a descriptor call


def processor_refused(name: str) -> str:
    """Why a span processor cannot be added to an offloaded pipeline, and the switch that keeps it here."""
    return (f"cannot add {name}: this pipeline is offloaded (option offload, OTEL_TRAINING_OFFLOAD; the default "
            "wherever it runs), so spans are built in the drain process and a processor here would see none; "
            "configure(offload=False) (OTEL_TRAINING_OFFLOAD=false) keeps the spans and your processors in this "
            "process (docs/offload.md)")



class RecordTracer(trace_api.Tracer):
    """Starts ``RecordSpan``s in one instrumentation scope."""

    #: Slots: the C core reads them when it begins a tracker's step (``child_setup`` below).
    __slots__ = ("_provider", "_scope")

    def __init__(self, provider: RecordTracerProvider, scope: int) -> None:
        self._provider = provider
        self._scope = scope

    def start_span(self, name: str, context: Context | None = None, kind: SpanKind = SpanKind.INTERNAL,
                   attributes: Mapping[str, Any] | None = None, links: Sequence[Link] | None = None,
                   start_time: int | None = None, record_exception: bool = True,
                   set_status_on_exception: bool = True) -> trace_api.Span:
        provider = self._provider
        lineage = provider.lineage
        if lineage is not None:
            stamp = lineage.stamp
            if stamp:  # over the span's own, as the lineage processor's on_start would
                attributes = {**attributes, **stamp} if attributes else dict(stamp)
        parent: SpanContext | None  # declared apart: the assignment below narrows it to SpanContext
        parent = (_CURRENT_SPAN() if context is None else trace_api.get_current_span(context)).get_span_context()
        begin_span = provider.begin_span
        if begin_span is not None and not links:  # the C core: the begin record and the span in one call
            span = begin_span(provider, name, kind, 0 if kind is _INTERNAL else _KIND_VALUES.get(kind, 0),
                              attributes or None, self._scope,
                              parent, start_time, _ON_EXCEPTION if record_exception is True and
                              set_status_on_exception is True else (record_exception, set_status_on_exception))
            if span is not None:
                return span
        if parent.is_valid:
            trace_id, parent_id = parent.trace_id, parent.span_id
            flags = _CHILD_FLAGS[parent.trace_flags & TraceFlags.RANDOM_TRACE_ID]
            trace_state = parent.trace_state
        else:
            trace_id, parent_id, parent, flags, trace_state = 0, 0, None, _ROOT_FLAGS, None
        sampler = provider.sampler
        if sampler is DEFAULT_ON:
            if parent is not None and not parent.trace_flags.sampled:
                return trace_api.NonRecordingSpan(SpanContext(trace_id, getrandbits(64) or 1, False,
                                                              parent.trace_flags, trace_state))
        trace_id = trace_id or getrandbits(128) or 1
        span_id = getrandbits(64) or 1
        if sampler is not DEFAULT_ON:
            result = sampler.should_sample(context, trace_id, name, kind, attributes, links)
            trace_state = result.trace_state
            if not result.decision.is_recording():  # type: ignore[no-untyped-call]  # the SDK leaves Decision.is_recording unannotated
                return trace_api.NonRecordingSpan(SpanContext(trace_id, span_id, False,
                                                              TraceFlags(flags & ~TraceFlags.SAMPLED), trace_state))
            if result.decision is not Decision.RECORD_AND_SAMPLE:  # recorded for the processors, not exported
                flags = TraceFlags(flags & ~TraceFlags.SAMPLED)
            attributes = result.attributes
        if start_time is None:
            start_time = time.time_ns()
        record = (BEGIN, span_id, trace_id, parent_id, parent is not None and parent.is_remote, name, start_time,
                  _KIND_VALUES.get(kind, 0), attributes or None, encode_links(links) if links else None, self._scope,
                  tuple(trace_state.items()) or None if trace_state else None, int(flags),
                  int(parent.trace_flags) if parent is not None else 0)
        try:
            payload: bytes | None = marshal.dumps(record)  # type: ignore[arg-type]  # attributes may be any Mapping: marshal's ValueError sends the record to encode_plain
        except ValueError:
            payload = encode_plain(record)
        if payload is not None:  # else its end record reaches the drain alone, which counts it as lost
            provider.emit(payload, True)
        return PyRecordSpan(provider, SpanContext(trace_id, span_id, False, flags, trace_state), parent, name, kind,
                            start_time, attributes, (record_exception, set_status_on_exception))

    def start_child(self, name: str, current: trace_api.Span, attributes: Mapping[str, Any] | None = None
                    ) -> trace_api.Span:
        """``start_span(name, attributes=attributes)`` for a caller that has just read the current span
        (``current``): a child of it, made without reading the context again (the events API's steps)."""
        provider = self._provider
        begin_span = provider.begin_span
        if begin_span is not None:
            lineage = provider.lineage
            stamped = attributes
            if lineage is not None:
                stamp = lineage.stamp
                if stamp:
                    stamped = {**attributes, **stamp} if attributes else dict(stamp)
            span = begin_span(provider, name, _INTERNAL, 0, stamped or None, self._scope, current.get_span_context(),
                              None, _ON_EXCEPTION)
            if span is not None:
                return span
        # C does not take this parent (a trace state, say): the Python path, under that parent, not the context's
        return self.start_span(name, trace_api.set_span_in_context(current), attributes=attributes)

    @contextmanager
    def start_as_current_span(self, name: str, context: Context | None = None, kind: SpanKind = SpanKind.INTERNAL,  # type: ignore[override]  # contextlib's manager: the API's _agnosticcontextmanager is private
                              attributes: Mapping[str, Any] | None = None, links: Sequence[Link] | None = None,
                              start_time: int | None = None, record_exception: bool = True,
                              set_status_on_exception: bool = True, end_on_exit: bool = True) -> Iterator[trace_api.Span]:
        span = self.start_span(name, context, kind, attributes, links, start_time, record_exception,
                               set_status_on_exception)
        with trace_api.use_span(span, end_on_exit=end_on_exit, record_exception=record_exception,
                                set_status_on_exception=set_status_on_exception) as current:
            yield current


class RecordTracerProvider(trace_api.TracerProvider):
    """The training process's tracer provider when spans are offloaded (``offload=True``)."""

    #: Slots for the two fields the C core reads when it begins a tracker's step (the rest: the instance dict).
    __slots__ = ("begin_span", "lineage")

    def __init__(self, emit: Emit, resource: Resource, sampler: Sampler = DEFAULT_ON, *,
                 write_control: Callable[[bytes, float], bool] | None = None,
                 flush: Callable[[float], bool] = lambda timeout_s: True,
                 close: Callable[[], bool] = lambda: True, fast: FastRecords | None = None,
                 lineage: LineageSpanProcessor | None = None) -> None:
        self.emit: Emit = emit
        #: The process's lineage (``set_lineage``), stamped on each span as it starts: the lineage processor
        #: would do it in-process, and the drain's cannot see this process's changes.
        self.lineage = lineage
        #: The C core's fast records, for spans with plain values and the default sampler (None: marshal only).
        self.fast = fast
        #: The C core's ``begin_span`` (span and begin record in one call) with the default sampler, else None.
        self.begin_span: Callable[..., RecordSpan | None] | None = None
        if fast is not None and sampler is DEFAULT_ON and SPAN_CONTEXT_IS_TUPLE:
            fast.span_setup(native_span_class(fast.span_core), SpanContext, DEFAULT_TRACE_STATE, _ROOT_FLAGS,
                            _CHILD_FLAGS[0])
            self.begin_span = fast.begin_span
        self.resource = resource
        self.sampler = sampler
        self._write_control = write_control or (lambda payload, timeout_s: emit(payload, None))
        self._flush = flush
        self._close = close
        self._tracers: dict[tuple[str, str | None, str | None], RecordTracer] = {}
        self._lock = threading.Lock()
        self._scopes = 0
        #: Spans made in a forked child (not recorded), and records that could not be encoded.
        self.forked_spans = 0
        self.ring_drops = 0
        reset_in_child(self, RecordTracerProvider._reset_in_child)

    def add_span_processor(self, processor: Any) -> None:
        """What code written for the SDK's provider calls on the global one: refused, saying why and the switch
        (an AttributeError would say neither)."""
        raise ConfigError(processor_refused(type(processor).__name__))

    def get_tracer(self, instrumenting_module_name: str, instrumenting_library_version: str | None = None,
                   schema_url: str | None = None, attributes: Mapping[str, Any] | None = None) -> RecordTracer:
        key = (instrumenting_module_name, instrumenting_library_version, schema_url)
        tracer = self._tracers.get(key)
        if tracer is not None:
            return tracer
        with self._lock:
            tracer = self._tracers.get(key)
            if tracer is None:
                self._scopes += 1
                tracer = RecordTracer(self, self._scopes)
                payload = encode((SCOPE, self._scopes, instrumenting_module_name, instrumenting_library_version,
                                   schema_url, dict(attributes or {}) or None))
                if payload is not None and self._write_control(payload, 1.0):
                    self._tracers[key] = tracer  # else the next get_tracer declares a scope again
                else:
                    log_once("offload-scope", "otel_training: an instrumentation scope could not be declared to "
                             "the drain (its ring is full); its spans are exported under otel_training's scope",
                             exc_info=False)
        return tracer

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Until the drain has exported every record written before this call (bounded)."""
        return self._flush(timeout_millis / 1000)

    def shutdown(self) -> bool:
        """Tell the drain to finish; it exports what is left and stops (bounded by the pipeline's deadline)."""
        return self._close()

    def _reset_in_child(self) -> None:
        """A forked child's copy: the ring is the parent's, so nothing of this provider writes to it."""
        self.emit = self._refuse_in_child
        self.fast = self.begin_span = None  # their writes go to the parent's ring too
        self._write_control = lambda payload, timeout_s: False
        self._lock = threading.Lock()  # it may have been held at the fork

    def _refuse_in_child(self, payload: bytes, begin: bool | None) -> bool:
        if begin:
            self.forked_spans += 1
            log_once("offload-forked", "otel_training: a process forked from one whose spans are offloaded records "
                     "no spans (the ring is its parent's); configure(reconfigure=True) in the child to record them",
                     exc_info=False)
        return False



def _register_child() -> None:
    """The C core begins a torch tracker's step (``native/step_span.c``) with ``start_child``'s usual case in C:
    it needs to know the method and what the method passes to ``begin_span``."""
    extension = _native_loader.at_import(native=True)
    if extension is not None:
        extension.child_setup(RecordTracer.start_child, _INTERNAL, _ON_EXCEPTION)


_register_child()
