"""Every use of an OpenTelemetry SDK or API internal (a ``_name``), in one place.

The SDK does not promise these names. Each accessor here checks what it reads
and falls back to public behaviour, and ``tests/test_sdk_compat.py`` asserts
that each one still reads the real thing on the installed SDK, so an SDK that
renames one fails that test instead of silently degrading (a pending span
counted as dropped, a span exported through the slow path).
"""

from __future__ import annotations

import contextvars
import operator
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from opentelemetry import metrics as metrics_api
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanLimits, SpanProcessor
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import Sampler
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode

from otel_training import _native_loader

if TYPE_CHECKING:
    from typing import TypedDict

    from opentelemetry.sdk._configuration import _BaseConfigurator as BaseConfigurator
    from opentelemetry.sdk.trace import Event
    from opentelemetry.trace import Link

    class _ProbeFields(TypedDict):
        """The ``ReadableSpan`` arguments ``_reads_sdk_fields`` probes with."""

        name: str
        context: SpanContext
        parent: SpanContext
        resource: Resource
        attributes: BoundedAttributes
        events: BoundedList[Event]
        links: BoundedList[Link]
        kind: SpanKind
        status: Status
        start_time: int
        end_time: int

__all__ = [
    "SPAN_CONTEXT_IS_TUPLE",
    "BaseConfigurator",
    "SpanSwitch",
    "attribute_items",
    "batch_queue_length",
    "instrumentation_check",
    "is_proxy_meter_provider",
    "span_fields",
    "span_pipeline",
    "span_switch",
    "suppression_keys",
    "trace_id_of",
    "tracer_for_pipeline",
]

def __getattr__(name: str) -> Any:
    # ``BaseConfigurator``: what contrib's ``opentelemetry_configurator`` entry point expects a
    # subclass of. Imported on first use: the SDK's configuration module loads the logs SDK and
    # the entry points, which only ``opentelemetry-instrument`` needs.
    if name == "BaseConfigurator":
        from opentelemetry.sdk._configuration import _BaseConfigurator

        return _BaseConfigurator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _current_context_variable() -> contextvars.ContextVar[Any] | None:
    """The ContextVar the SDK's default runtime context keeps the current context in, or None under any other
    runtime context (``OTEL_PYTHON_CONTEXT``), whose public calls must run instead."""
    from opentelemetry import context as context_api
    from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext

    runtime = getattr(context_api, "_RUNTIME_CONTEXT", None)
    variable = getattr(runtime, "_current_context", None)
    return variable if type(runtime) is ContextVarsRuntimeContext and type(variable) is contextvars.ContextVar \
        else None


def _suppression_key_pair() -> tuple[str, str] | None:
    """contrib's two suppression keys (the API's and its own plain one), as ``is_instrumentation_enabled()``
    reads them, or None where contrib keeps them otherwise."""
    from opentelemetry import context as context_api
    from opentelemetry.instrumentation import utils

    key = getattr(context_api, "_SUPPRESS_INSTRUMENTATION_KEY", None)
    plain = getattr(utils, "_SUPPRESS_INSTRUMENTATION_KEY_PLAIN", None)
    if (type(key) is not str or type(plain) is not str
            or getattr(utils, "_SUPPRESS_INSTRUMENTATION_KEY", key) is not key):
        return None
    return key, plain


def suppression_keys() -> tuple[contextvars.ContextVar[Any], str, str] | None:
    """(the runtime context's ContextVar, contrib's two suppression keys) for a check made in C (the torch
    instrumentor's per-step wrappers, ``native/gate.c``): instrumentation is suppressed when the current
    context holds a true value under either key, as ``is_instrumentation_enabled()`` reads it. None where the
    API or contrib keep them otherwise (another runtime context): the Python check runs there."""
    variable, pair = _current_context_variable(), _suppression_key_pair()
    return None if variable is None or pair is None else (variable, *pair)


def instrumentation_check(native: bool | None = None) -> Callable[[], bool]:
    """A faster ``is_instrumentation_enabled()`` for hooks that run several times a training step.

    contrib's check reads the current context twice through ``get_value``, five
    Python calls; a torch step passes it seven times. This reads the context
    once, in C where the extension loads (``native/gate.c``'s InstrumentationEnabled, no Python frame;
    ``native`` as for ``span_switch``). Imported by integrations only: the contrib module it reads is theirs.
    """
    from opentelemetry import context as context_api
    from opentelemetry.instrumentation import utils

    pair = _suppression_key_pair()
    if pair is None:
        return utils.is_instrumentation_enabled
    key, plain = pair
    # The SDK's default runtime context keeps the current context in one ContextVar: read it directly (one C
    # call instead of two Python frames; a cold frame costs about a microsecond in a training loop). Any
    # other runtime context (OTEL_PYTHON_CONTEXT) goes through the public call.
    variable = _current_context_variable()
    extension = _native_loader.at_import(native) if variable is not None else None
    if extension is not None:
        return extension.InstrumentationEnabled(variable, key, plain)  # type: ignore[no-any-return]  # the C extension has no stubs: a callable returning bool
    get_current = variable.get if variable is not None else context_api.get_current

    def enabled() -> bool:
        current = get_current()
        return not (current.get(key) or current.get(plain))

    return enabled


class SpanSwitch(NamedTuple):
    """The current span, read and switched in as few Python frames as the runtime context allows.

    ``current()`` is ``trace.get_current_span()``; ``attach(span)`` is
    ``context.attach(trace.set_span_in_context(span))``, returning its token; ``detach(token)`` is
    ``context.detach(token)``. The API's calls take three to six Python frames each, and a step
    span makes all three: on the SDK's default runtime context (one ContextVar) these make one,
    one and none. Any other runtime context (``OTEL_PYTHON_CONTEXT``) gets the public calls.
    """

    current: Callable[[], Any]
    attach: Callable[[Any], object]
    detach: Callable[[Any], None]


def span_switch(native: bool | None = None) -> SpanSwitch:
    """The ``SpanSwitch`` for the installed API (see its docstring).

    ``native``: on the default runtime context, ``current`` and ``attach`` are the C extension's
    (``native/context.c``: the same operations on the same objects, no Python frame) where it loads, else the
    Python closures below, the fallback; None decides as the process was started (``OTEL_TRAINING_NATIVE``;
    ``off`` keeps the closures, whatever the extension). Asked once, at import, by the modules that switch.
    """
    from opentelemetry import context as context_api
    from opentelemetry import trace as trace_api
    from opentelemetry.context import Context
    from opentelemetry.trace import propagation

    key = getattr(propagation, "_SPAN_KEY", None)
    variable = _current_context_variable()
    if type(key) is not str or variable is None:
        def public_attach(span: Any) -> object:
            return context_api.attach(trace_api.set_span_in_context(span))

        return SpanSwitch(trace_api.get_current_span, public_attach, context_api.detach)
    invalid = trace_api.INVALID_SPAN
    extension = _native_loader.at_import(native)
    if extension is not None:
        return SpanSwitch(extension.CurrentSpan(variable, key, invalid), extension.AttachSpan(variable, key, Context),
                          variable.reset)
    get = variable.get
    put = variable.set

    def current() -> Any:
        return get().get(key, invalid)

    def attach(span: Any) -> object:
        values = dict(get())
        values[key] = span
        return put(Context(values))

    return SpanSwitch(current, attach, variable.reset)


def batch_queue_length(processor: BatchSpanProcessor) -> int | None:
    """Spans waiting in the SDK batch processor's queue; None where the SDK keeps them elsewhere.

    Needed to tell spans still pending from spans the queue dropped (the SDK
    counts neither publicly): a None makes the caller say it does not know,
    never count the pending ones as lost.
    """
    queue = getattr(getattr(processor, "_batch_processor", None), "_queue", None)
    try:
        return len(queue) if queue is not None else None
    except TypeError:
        return None


def is_proxy_meter_provider(provider: Any) -> bool:
    """Whether ``provider`` is the API's placeholder, i.e. no global MeterProvider has been set."""
    proxy = getattr(getattr(metrics_api, "_internal", None), "_ProxyMeterProvider", None)
    if proxy is not None:
        return isinstance(provider, proxy)
    return type(provider).__name__ == "_ProxyMeterProvider"


def span_pipeline(span: Any) -> SpanProcessor | None:
    """The processor pipeline of the provider that made a live SDK span, or None."""
    return getattr(span, "_span_processor", None) if isinstance(span, Span) else None


def tracer_for_pipeline(resource: Resource, pipeline: SpanProcessor, sampler: Sampler, ids: IdGenerator,
                        scope: InstrumentationScope) -> SdkTracer:
    """A tracer that emits into an existing provider's pipeline without holding the provider.

    The stuck detector, given no provider, puts its alert in the pipeline of the
    stuck span itself (same resource, processors and exporter); the SDK offers
    no public way to get a tracer from a span.
    """
    return SdkTracer(sampler, resource, pipeline, ids, None, SpanLimits(), scope)  # type: ignore[arg-type]  # any processor does, not only the SDK's two multi-processors; the deprecated info is None


def _reads_sdk_fields() -> bool:
    """Whether a ``ReadableSpan`` keeps what its properties return in the fields ``span_fields`` reads.

    ``.attributes`` wraps the attributes in a new proxy whose items go through
    Python-level ``__iter__`` and ``__getitem__``, ``.events`` and ``.links``
    copy their lists under a lock, and every property is a call: together about
    half the cost of encoding a typical span. A finished span never changes, so
    reading its fields is safe; this check keeps an SDK that stores them
    otherwise on the public properties.
    """
    fields: _ProbeFields = {"name": "probe", "context": SpanContext(1, 2, is_remote=False),
              "parent": SpanContext(1, 3, is_remote=True), "resource": Resource({}),
              "attributes": BoundedAttributes(attributes={"k": 1}), "events": BoundedList(1),
              "links": BoundedList(1), "kind": SpanKind.CLIENT, "status": Status(StatusCode.ERROR, "probe"),
              "start_time": 5, "end_time": 6}
    span = ReadableSpan(**fields)
    try:
        return (all(getattr(span, "_" + name) is value for name, value in fields.items())
                and dict(fields["attributes"]._dict) == {"k": 1}  # noqa: SLF001 - the SDK field span_fields reads
                and (fields["attributes"].dropped, fields["events"].dropped, fields["links"].dropped)
                == (span.dropped_attributes, span.dropped_events, span.dropped_links) == (0, 0, 0))
    except AttributeError:
        return False


#: Whether ``span_fields`` and ``attribute_items`` read the SDK's fields (else its public properties).
READS_SDK_FIELDS = _reads_sdk_fields()


def _span_context_is_tuple() -> bool:
    """Whether the API's ``SpanContext`` is the 6-tuple (trace id, span id, is_remote, flags, trace state,
    is_valid) that ``tuple.__new__`` makes, as its own ``__new__`` does.

    The C core builds the contexts of offloaded spans that way (``native/span.c``), without the Python
    ``__new__`` and its range checks (its ids are valid by construction), and reads a parent's the same way. An
    API that stores them otherwise keeps the Python path (``record_tracer.RecordTracer.start_span``).
    """
    from opentelemetry.trace import DEFAULT_TRACE_STATE, TraceFlags

    flags = TraceFlags(TraceFlags.SAMPLED)
    try:
        made = SpanContext(5, 7, False, flags, DEFAULT_TRACE_STATE)
        built = tuple.__new__(SpanContext, (5, 7, False, flags, DEFAULT_TRACE_STATE, True))
        return (isinstance(made, tuple) and tuple(made) == (5, 7, False, flags, DEFAULT_TRACE_STATE, True)
                and (built.trace_id, built.span_id, built.is_remote, built.trace_flags, built.trace_state,
                     built.is_valid) == (5, 7, False, flags, DEFAULT_TRACE_STATE, True) and built == made)
    except Exception:  # noqa: BLE001 - any other shape: the Python path
        return False


#: Whether the C core may build and read ``SpanContext`` as a tuple (``_span_context_is_tuple``).
SPAN_CONTEXT_IS_TUPLE = _span_context_is_tuple()


def span_fields(span: ReadableSpan) -> tuple[Any, ...]:
    """(context, parent, name, kind, start, end, attributes, events, links, status, and the three
    dropped counts) of a finished span, as cheaply as this SDK allows."""
    if READS_SDK_FIELDS and type(span) is ReadableSpan:
        attributes, events, links, status = span._attributes, span._events, span._links, span._status  # noqa: SLF001 - the SDK's fields: its properties copy them under a lock
        # What the dropped_* properties compute, without three more calls.
        return (span._context, span._parent, span._name, span._kind, span._start_time, span._end_time,  # noqa: SLF001 - the SDK's fields, one property call each saved
                attributes, events, links, status,
                attributes.dropped if type(attributes) is BoundedAttributes else span.dropped_attributes,
                events.dropped if type(events) is BoundedList else span.dropped_events,
                links.dropped if type(links) is BoundedList else span.dropped_links)
    return (span.get_span_context(), span.parent, span.name, span.kind, span.start_time, span.end_time,
            span.attributes, span.events, span.links, span.status,
            span.dropped_attributes, span.dropped_events, span.dropped_links)


def attribute_items(attributes: Mapping[str, Any]) -> Iterable[tuple[str, Any]]:
    """The items of a span's attributes without the proxy ``BoundedAttributes.items()`` builds."""
    if READS_SDK_FIELDS and type(attributes) is BoundedAttributes:
        return attributes._dict.items()  # noqa: SLF001 - BoundedAttributes' own dict, checked by _reads_sdk_fields
    return attributes.items()


#: ``span_context.trace_id`` without the property's Python frame where the context is that tuple (one C call).
trace_id_of: Callable[[SpanContext], int] = (
    operator.itemgetter(0) if SPAN_CONTEXT_IS_TUPLE else operator.attrgetter("trace_id"))
