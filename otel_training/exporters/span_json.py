"""OTLP JSON text for a batch of SDK spans, written without protobuf.

The file exporter runs on the batch processor's thread, and the GIL it holds is
the training thread's. The generic route (build the OTLP protobuf request,
convert it with protobuf's JSON mapping, re-encode the base64 ids as hex, dump
the dict) costs 60 to 200 µs per span on our 2-core machines; writing the text
straight from the spans costs about a tenth of that (docs/pipeline.md, "Without
a collector", and bench/bench_file_exporter.py).

The text is the generic route's to the byte, which ``tests/test_span_json.py``
checks on randomized batches: spans grouped by resource, then by scope, in
order of first appearance (equal resources or scopes share a group, as in the
OTLP encoder's dict); keys in protobuf field-number order; fields holding their
default value (empty, zero, None) left out, but a present empty message written
as ``{}``; int64 and fixed64 as decimal strings, uint32 as numbers; doubles as
Python's ``repr``, non-finite ones as ``"NaN"``, ``"Infinity"``, ``"-Infinity"``;
bytes in base64, ids in hex. An attribute the OTLP encoder refuses (an int
outside int64, a value of another type, a key or string that UTF-8 cannot
hold) is left out, as that encoder leaves it out; anything else it refuses
(such a span name) fails the batch when the line is encoded for writing.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from otel_training._contain import log_once
from otel_training._sdk_compat import attribute_items, span_fields

_string = json.encoder.encode_basestring  # what json.dumps(ensure_ascii=False) escapes strings with

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_INFINITY = float("inf")

# opentelemetry.proto.trace.v1.Span.SpanKind: the API's values shifted by one (0 is UNSPECIFIED).
_KIND = {kind: ',"kind":%d' % (kind.value + 1) for kind in SpanKind}
_INTERNAL = _KIND[SpanKind.INTERNAL]
_STATUS = {0: ',"status":{}', 1: ',"status":{"code":1}', 2: ',"status":{"code":2}'}
# SpanFlags: CONTEXT_HAS_IS_REMOTE (0x100), plus CONTEXT_IS_REMOTE (0x200) for a remote context.
_LOCAL_FLAGS = ',"flags":256}'
_REMOTE_FLAGS = ',"flags":768}'

# '{"key":"…","value":' per attribute key: a job repeats a few dozen keys in every span.
_key_prefixes: dict[str, str] = {}
_KEY_PREFIXES_MAX = 4096




def _object(fields: str) -> str:
    """``{…}`` around fields built as ``,"a":…,"b":…``."""
    return "{" + fields[1:] + "}" if fields else "{}"


def _key_prefix(key: str) -> str:
    prefix = _key_prefixes.get(key)
    if prefix is None:
        if not isinstance(key, str):
            raise TypeError(f"attribute key {key!r} is not a string")
        key.encode("utf-8")  # a lone surrogate raises here, as in the protobuf encoder
        prefix = '{"key":' + _string(key) + ',"value":' if key else '{"value":'
        if len(_key_prefixes) < _KEY_PREFIXES_MAX:
            _key_prefixes[key] = prefix
    return prefix


def _text(value: str) -> str:
    if not value.isascii():
        value.encode("utf-8")
    return _string(value)


def _double(value: float) -> str:
    if value != value:
        return '"NaN"'
    if value == _INFINITY:
        return '"Infinity"'
    if value == -_INFINITY:
        return '"-Infinity"'
    return float.__repr__(value)


def _int64(value: int) -> str:
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"Value out of range: {value}")
    return int.__repr__(value)


def _any_value(value: Any) -> str:
    """An AnyValue, with the type tests of the OTLP encoder's ``_encode_value`` in its order."""
    kind = type(value)
    if kind is tuple or kind is list:  # what the SDK keeps a sequence as; none of the tests before Sequence's match
        return _array(value)
    if value is None:
        return "{}"
    if isinstance(value, bool):
        return '{"boolValue":true}' if value else '{"boolValue":false}'
    if isinstance(value, str):
        return '{"stringValue":' + _text(value) + "}"
    if isinstance(value, int):
        return '{"intValue":"' + _int64(value) + '"}'
    if isinstance(value, float):
        return '{"doubleValue":' + _double(value) + "}"
    if isinstance(value, bytes):
        return '{"bytesValue":"' + base64.b64encode(value).decode("ascii") + '"}'
    if isinstance(value, Sequence):
        return _array(value)
    if isinstance(value, Mapping):
        values = ",".join([_key_prefix(str(key)) + _any_value(item) + "}" for key, item in value.items()])
        return '{"kvlistValue":{"values":[' + values + "]}}" if values else '{"kvlistValue":{}}'
    raise TypeError(f"Invalid type {type(value)} of value {value}")


def _array(values: Sequence[Any]) -> str:
    parts: list[str] = []
    append = parts.append
    for value in values:
        kind = type(value)
        # The homogeneous arrays the SDK lets through, inline; anything else by _any_value.
        if kind is str and value.isascii():
            append(f'{{"stringValue":{_string(value)}}}')
        elif kind is int and _INT64_MIN <= value <= _INT64_MAX:
            append(f'{{"intValue":"{value}"}}')
        elif kind is float and value - value == 0.0:  # finite
            append(f'{{"doubleValue":{float.__repr__(value)}}}')
        else:
            append(_any_value(value))
    return '{"arrayValue":{"values":[' + ",".join(parts) + "]}}" if parts else '{"arrayValue":{}}'


def _attributes(attributes: Mapping[str, Any] | None) -> str:
    """``,"attributes":[…]``, or nothing when there are none left to write."""
    if not attributes:
        return ""
    parts: list[str] = []
    append = parts.append
    items = attribute_items(attributes)
    for key, value in items:
        try:
            prefix = _key_prefixes.get(key) or _key_prefix(key)
            kind = type(value)
            # The common types inline; anything else, or what needs care, by _any_value.
            if kind is str and value.isascii():
                append(f'{prefix}{{"stringValue":{_string(value)}}}}}')
            elif kind is int and _INT64_MIN <= value <= _INT64_MAX:
                append(f'{prefix}{{"intValue":"{value}"}}}}')
            elif kind is float and value - value == 0.0:  # finite
                append(f'{prefix}{{"doubleValue":{float.__repr__(value)}}}}}')
            else:
                append(f"{prefix}{_any_value(value)}}}")
        except Exception as error:  # noqa: BLE001 - the OTLP encoder, too, leaves the attribute out
            log_once("span-json:attribute", "otel_training: attribute %r left out of the trace file: %s",
                     key, error, exc_info=False)
    return ',"attributes":[' + ",".join(parts) + "]" if parts else ""


def _span(span: ReadableSpan) -> str:
    (context, parent, name, kind, start, end, attributes, events, links, status,
     dropped_attributes, dropped_events, dropped_links) = span_fields(span)
    trace_state = context.trace_state
    state = ',"traceState":' + _string(",".join([f"{key}={value}" for key, value in trace_state.items()])) \
        if trace_state else ""
    parent_id = f',"parentSpanId":"{parent.span_id:016x}"' if parent else ""
    name = ',"name":' + _string(name) if name else ""
    kind = _INTERNAL if kind is SpanKind.INTERNAL else _KIND[kind]  # an Enum hashes in Python
    start = f',"startTimeUnixNano":"{start:d}"' if start else ""
    end = f',"endTimeUnixNano":"{end:d}"' if end else ""
    rest = _attributes(attributes)
    if dropped_attributes:
        rest += f',"droppedAttributesCount":{dropped_attributes:d}'
    if events:
        rest += ',"events":[' + ",".join([_event(event) for event in events]) + "]"
    if dropped_events:
        rest += f',"droppedEventsCount":{dropped_events:d}'
    if links:
        rest += ',"links":[' + ",".join([_link(link) for link in links]) + "]"
    if dropped_links:
        rest += f',"droppedLinksCount":{dropped_links:d}'
    if status is not None:
        if status.description:
            code = status.status_code.value
            rest += ',"status":{"message":' + _string(status.description) + (f',"code":{code:d}}}' if code else "}")
        else:
            code = status.status_code
            rest += ',"status":{}' if code is StatusCode.UNSET else _STATUS[code.value]
    flags = _REMOTE_FLAGS if parent and parent.is_remote else _LOCAL_FLAGS
    return (f'{{"traceId":"{context.trace_id:032x}","spanId":"{context.span_id:016x}"'
            f"{state}{parent_id}{name}{kind}{start}{end}{rest}{flags}")


def _event(event: Any) -> str:
    fields = ',"timeUnixNano":"%d"' % event.timestamp if event.timestamp else ""
    if event.name:
        fields += ',"name":' + _string(event.name)
    fields += _attributes(event.attributes)
    dropped = event.dropped_attributes
    if dropped:
        fields += ',"droppedAttributesCount":%d' % dropped
    return _object(fields)


def _link(link: Any) -> str:
    context = link.context
    text = '{"traceId":"%032x","spanId":"%016x"' % (context.trace_id, context.span_id)
    text += _attributes(link.attributes)
    dropped = link.dropped_attributes
    if dropped:
        text += ',"droppedAttributesCount":%d' % dropped
    return text + (_REMOTE_FLAGS if context.is_remote else _LOCAL_FLAGS)


def _scope(scope: Any) -> str:
    if scope is None:
        return "{}"
    fields = ""
    if scope.name:
        fields += ',"name":' + _string(scope.name)
    if scope.version:
        fields += ',"version":' + _string(scope.version)
    return _object(fields + _attributes(scope.attributes))


def spans_to_otlp_json(spans: Sequence[ReadableSpan]) -> str:
    """One ``ExportTraceServiceRequest`` as one line of OTLP JSON (no newline)."""
    groups: dict[Any, dict[Any, list[str]]] = {}
    # Most spans of a batch share one resource and one scope object: find their
    # group by identity before hashing (a Resource hashes by dumping its attributes).
    by_identity: dict[tuple[int, int], list[str]] = {}
    alive = []  # keeps every object whose id is a key above from being freed and its id reused
    last_resource = last_scope = group = None
    for span in spans:
        resource = span.resource
        scope = span.instrumentation_scope or None
        if resource is not last_resource or scope is not last_scope or group is None:
            identity = (id(resource), id(scope))
            group = by_identity.get(identity)
            if group is None:
                group = groups.setdefault(resource, {}).setdefault(scope, [])
                by_identity[identity] = group
                alive.append((resource, scope))
            last_resource, last_scope = resource, scope
        group.append(_span(span))
    if not groups:
        return "{}"
    resource_spans = []
    for resource, scopes in groups.items():
        scope_spans = []
        for scope, encoded in scopes.items():
            schema_url = scope.schema_url if scope else None
            scope_spans.append('{"scope":' + _scope(scope) + ',"spans":[' + ",".join(encoded) + "]"
                               + (',"schemaUrl":' + _string(schema_url) if schema_url else "") + "}")
        schema_url = resource.schema_url
        resource_spans.append('{"resource":' + _object(_attributes(resource.attributes))
                              + ',"scopeSpans":[' + ",".join(scope_spans) + "]"
                              + (',"schemaUrl":' + _string(schema_url) if schema_url else "") + "}")
    return '{"resourceSpans":[' + ",".join(resource_spans) + "]}"


__all__ = ["spans_to_otlp_json"]
