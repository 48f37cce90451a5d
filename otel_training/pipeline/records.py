"""The offloaded span records: their kinds, their marshal encoding, and the C core's fast form.

Why a module of its own: the training process writes these records (``record_tracer.py``), the drain
decodes and checks them (``drain.py``, ``record_check.py``); the layout is the one thing both sides share.
A record is a ``marshal``-encoded tuple of plain values (layouts in ``record_check.py``), or, for a span's
begin and end with plain values once the drain reads them, the compact form the C core writes
(``native/records.h``), which the drain's decoder turns into the same tuple.
"""

from __future__ import annotations

import marshal
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from opentelemetry.trace import Link

from otel_training._contain import contain

BEGIN, END, SCOPE, FLUSH, CLOSE = 1, 2, 3, 4, 5
#: The training process's answer to the drain's request for its threads' stacks (``stacks.py``).
STACKS = 6
#: A step's device work began or ended: ``(DEVICE, token, which, ns)``, written by the C core's device resolver
#: thread (``native/device.h``; ``which``: ``DEVICE_BEGIN``, ``DEVICE_END`` or ``DEVICE_FAILED``), and the
#: device those steps run on: ``(DEVICE_INFO, label, name)`` (``device_records.py``, ``device_steps.py``).
DEVICE, DEVICE_INFO = 7, 8
#: Values read after they were logged (``events/values.py``): ``(VALUES, span_id, target, {key: value})``,
#: ``target`` -1 for the span's attributes, else the timestamp of its event (``processors/late_values.py``).
VALUES = 9
DEVICE_BEGIN, DEVICE_END, DEVICE_FAILED = 0, 1, 2
_EXACT = (str, bool, int, float, bytes, type(None))

#: ``emit(payload, begin)``: write one record (``begin`` None: a control record); False when it was dropped.
Emit = Callable[[bytes, "bool | None"], bool]


class FastRecords(Protocol):
    """The C core's writer of compact span records (``native/records.h``): ids, time, encoding and the ring
    write in one call each. Either call returns None when it does not apply (the drain does not read them yet,
    or a value is not bool, int64, float or str): the caller then writes the marshal record, as without it."""

    #: The C base of the span class ``begin_span`` makes (``native/span.c``).
    span_core: type

    def span_setup(self, span_type: type, context_type: type, trace_state: Any, root_flags: int,
                   child_flags: int) -> None:
        """What ``begin_span`` builds: ``span_type`` (a subclass of ``span_core``), the API's ``SpanContext``
        and its empty ``TraceState``, and the flags of a root and of a child whose trace id is not random."""

    def begin_span(self, provider: Any, name: str, kind: Any, kind_value: int,
                   attributes: Mapping[str, Any] | None, scope: int, parent: Any, start: int | None,
                   on_exception: tuple[bool, bool]) -> Any:
        """The span (``span_type``), its begin record written (or handed to ``provider.emit`` when the ring is
        full); ``parent``: the parent's ``SpanContext`` (None or invalid: a new root); ``start`` None: now."""

    def end(self, span_id: int, end: int, updates: Mapping[str, Any] | None) -> tuple[bytes | None] | None:
        """(the payload the full ring refused, or None)."""


def plain(value: Any) -> Any:
    """``value`` as marshal carries it: what the SDK keeps, converted to exact built-in types."""
    kind = type(value)
    if kind in _EXACT:
        return value
    if isinstance(value, (list, tuple)):
        return tuple(plain(item) for item in value)
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, str):  # a str Enum: its value, as JSON would write it (``str()`` gives its name)
        return str.__str__(value)
    for base in (bool, int, float, bytes):  # an IntEnum, numpy's float64...
        if isinstance(value, base):
            return base(value)  # type: ignore[arg-type]  # value is an instance of base: each base takes its own
    return str(value)


def encode(record: tuple[Any, ...]) -> bytes | None:
    """The record's bytes; None (logged once) if even its plain form cannot be encoded."""
    try:
        return marshal.dumps(record)
    except ValueError:
        return encode_plain(record)


def encode_plain(record: tuple[Any, ...]) -> bytes | None:
    """``encode`` once marshal has refused the record as it is."""
    # Never raise into the code that began or ended the span.
    with contain("offload-encode", "otel_training: a span could not be recorded for the drain; it is counted as "
                 "dropped"):
        return marshal.dumps(plain(record))
    return None


def encode_links(links: Sequence[Link] | None) -> list[tuple[Any, ...]] | None:
    if not links:
        return None
    return [(link.context.trace_id, link.context.span_id, link.context.is_remote, int(link.context.trace_flags),
             tuple(link.context.trace_state.items()) or None, dict(link.attributes or {})) for link in links]
