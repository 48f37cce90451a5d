"""Whether a decoded record is a record the training process could have written, before the drain replays it.

Why: the drain decodes bytes from shared memory. The ring's framing is checked (``_ring.py``) and ``marshal``
refuses bytes that do not decode, but a damaged record can still decode to the wrong values: a trace id that
is a string, a start time of ``-1``, events that are not triples. Handed to the SDK, such a value can fail
the OTLP encoding of a whole batch of good spans later, in the exporter. So every record is checked here
against the layouts ``record_tracer.py`` writes, and one that does not match is skipped and counted
(``Replayer.bad``), never replayed. ``tests/test_record_check.py`` fuzzes this with damaged records.
"""

from __future__ import annotations

from typing import Any

from otel_training.pipeline.records import (
    BEGIN,
    CLOSE,
    DEVICE,
    DEVICE_FAILED,
    DEVICE_INFO,
    END,
    FLUSH,
    SCOPE,
    STACKS,
    VALUES,
)

_U64, _U128 = 1 << 64, 1 << 128
_SPAN_KINDS = range(5)  # SpanKind's values
_STATUS_CODES = range(3)  # StatusCode's values


def _int(value: Any, low: int, high: int) -> bool:
    return type(value) is int and low <= value < high


def _optional_str(value: Any) -> bool:
    return value is None or type(value) is str


def _mapping(value: Any) -> bool:
    """Attributes: None or a dict. Its keys and values are the SDK's to check: it drops a bad one with a warning,
    as it would in-process, rather than the whole span."""
    return value is None or type(value) is dict


def _trace_state(value: Any) -> bool:
    return value is None or (type(value) is tuple and all(
        type(item) is tuple and len(item) == 2 and type(item[0]) is str and type(item[1]) is str for item in value))


def _links(value: Any) -> bool:
    if value is None:
        return True
    if type(value) not in (list, tuple):
        return False
    for link in value:
        if type(link) is not tuple or len(link) != 6:
            return False
        trace_id, span_id, remote, flags, state, attributes = link
        if not (_int(trace_id, 1, _U128) and _int(span_id, 1, _U64) and type(remote) is bool
                and _int(flags, 0, 256) and _trace_state(state) and _mapping(attributes)):
            return False
    return True


def _events(value: Any) -> bool:
    if value is None:
        return True
    if type(value) not in (list, tuple):
        return False
    return all(type(event) is tuple and len(event) == 3 and type(event[0]) is str and _int(event[1], 0, 1 << 63)
               and _mapping(event[2]) for event in value)


def _begin(record: tuple[Any, ...]) -> str | None:
    if len(record) != 14:
        return f"a begin record of {len(record)} fields"
    (_, span_id, trace_id, parent_id, remote, name, start, kind, attributes, links, scope, state, flags,
     parent_flags) = record
    checks = (("span id", _int(span_id, 1, _U64)), ("trace id", _int(trace_id, 1, _U128)),
              ("parent id", _int(parent_id, 0, _U64)), ("remote flag", type(remote) is bool),
              ("name", type(name) is str), ("start time", _int(start, 0, 1 << 63)),
              ("kind", _int(kind, 0, len(_SPAN_KINDS))), ("attributes", _mapping(attributes)),
              ("links", _links(links)), ("scope", _int(scope, 0, 1 << 63)), ("trace state", _trace_state(state)),
              # The writer's own flags are sampled and random-trace-id at most; a remote parent's may be any byte.
              ("trace flags", _int(flags, 0, 4)), ("parent's trace flags", _int(parent_flags, 0, 256)))
    return next((f"a begin record's {what}" for what, good in checks if not good), None)


def _end(record: tuple[Any, ...]) -> str | None:
    if len(record) not in (3, 8):
        return f"an end record of {len(record)} fields"
    if not (_int(record[1], 1, _U64) and _int(record[2], 0, 1 << 63)):
        return "an end record's span id or end time"
    if len(record) == 3:
        return None
    _, _, _, updates, events, status, name, links = record
    status_ok = status is None or (type(status) is tuple and len(status) == 2
                                   and _int(status[0], 0, len(_STATUS_CODES)) and _optional_str(status[1]))
    checks = (("attributes", _mapping(updates)), ("events", _events(events)), ("status", status_ok),
              ("new name", _optional_str(name)), ("links", _links(links)))
    return next((f"an end record's {what}" for what, good in checks if not good), None)


def check_record(record: Any) -> str | None:
    """None when ``record`` is one the training process could have written, else what is wrong with it."""
    if type(record) is not tuple or not record:
        return "not a record"
    kind = record[0]
    if kind == END and type(kind) is int:
        return _end(record)
    if kind == BEGIN and type(kind) is int:
        return _begin(record)
    if kind == SCOPE and type(kind) is int:
        good = (len(record) == 6 and _int(record[1], 1, 1 << 63) and type(record[2]) is str
                and _optional_str(record[3]) and _optional_str(record[4]) and _mapping(record[5]))
        return None if good else "a scope record"
    if kind == FLUSH and type(kind) is int:  # (FLUSH, token, timeout_s[, the writer's monotonic deadline])
        good = len(record) in (3, 4) and _int(record[1], 0, 1 << 63) and type(record[2]) in (int, float) \
            and 0 <= record[2] < 1e9 and (len(record) == 3 or (type(record[3]) is float and record[3] >= 0))
        return None if good else "a flush record"
    if kind == CLOSE and type(kind) is int:  # (CLOSE[, the writer's monotonic deadline])
        good = len(record) == 1 or (len(record) == 2 and type(record[1]) is float and record[1] >= 0)
        return None if good else "a close record"
    if kind == STACKS and type(kind) is int:  # (STACKS, request id, stacks[, the alert context])
        good = len(record) in (3, 4) and _int(record[1], 1, 1 << 63) and type(record[2]) is str and (
            len(record) == 3 or _mapping(record[3]))
        return None if good else "a stacks record"
    if kind == DEVICE and type(kind) is int:
        good = (len(record) == 4 and _int(record[1], 0, _U64) and _int(record[2], 0, DEVICE_FAILED + 1)
                and _int(record[3], 0, 1 << 63))
        return None if good else "a device record"
    if kind == VALUES and type(kind) is int:  # (VALUES, span id, target, values)
        # The values go into exported attributes without the SDK's checks: scalars under text keys only.
        good = (len(record) == 4 and _int(record[1], 1, _U64) and _int(record[2], -1, 1 << 63)
                and type(record[3]) is dict and all(type(key) is str and type(value) in (bool, int, float, str)
                                                    for key, value in record[3].items()))
        return None if good else "a values record"
    if kind == DEVICE_INFO and type(kind) is int:
        good = len(record) == 3 and type(record[1]) is str and type(record[2]) is str
        return None if good else "a device info record"
    return "a record of no known kind"
