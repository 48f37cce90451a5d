"""Turning whatever a user passes as event content into span attributes, safely.

Content comes from training code: ints and floats, but also numpy scalars,
tensors, nested dicts of metrics, paths and arbitrary objects. OpenTelemetry
accepts scalars and homogeneous lists only, so everything else is flattened
(dicts, with dots), converted (numpy/CPU tensor scalars) or stringified and
truncated. This never raises, and never touches the value of an accelerator
tensor, which would force a device synchronisation on the training thread.

What the exporters cannot encode is converted here, once, rather than lost at
every export with a traceback: an integer beyond int64 becomes its decimal
text, and a lone surrogate (a path decoded with ``surrogateescape``) its
``\\udcXX`` escape.
"""

from __future__ import annotations

import datetime
import itertools
import uuid
from collections.abc import Mapping
from enum import Enum
from pathlib import PurePath
from typing import Any

from otel_training import semconv as sc
from otel_training._contain import contain, log_once
from otel_training._text import encodable as _encodable
from otel_training._text import text as text  # re-exported: duration.py and process.py import it from here

MAX_STRING = 1024
MAX_LIST = 128
MAX_DEPTH = 4
#: Attributes from one content: under the SDK's default limit of 128 per span or
#: event, with room for the ones we add, as the SDK logs a warning per attribute
#: past its limit (and going through 200,000 keys costs seconds on the training thread).
MAX_KEYS = 100
#: Integers in [-INT64_LIMIT, INT64_LIMIT) are attribute values as they are; others become their text.
INT64_LIMIT = 1 << 63
_INT64_MIN, _INT64_MAX = -INT64_LIMIT, INT64_LIMIT - 1

_SCALARS = (bool, int, float, str)

#: DLRover-style content keys with a semantic-convention name.
ALIASES: dict[str, str] = {
    "global_step": sc.STEP,
    "step": sc.STEP,
    "epoch": sc.EPOCH,
    "substep": sc.SUBSTEP,
    "batch_size": sc.BATCH_SIZE,
    "samples": sc.SAMPLES,
    "tokens": sc.TOKENS,
    "loss": sc.LOSS,
    "lr": sc.LEARNING_RATE,
    "learning_rate": sc.LEARNING_RATE,
    "path": sc.CHECKPOINT_PATH,
    "ckpt_path": sc.CHECKPOINT_PATH,
    "checkpoint_path": sc.CHECKPOINT_PATH,
    "ckpt_step": sc.CHECKPOINT_STEP,
    "checkpoint_step": sc.CHECKPOINT_STEP,
    "size": sc.CHECKPOINT_BYTES,
    "bytes": sc.CHECKPOINT_BYTES,
    "rendezvous_round": sc.ELASTIC_RENDEZVOUS_ROUND,
    "round": sc.ELASTIC_RENDEZVOUS_ROUND,
    "node_id": sc.ELASTIC_NODE_ID,
    "node_rank": sc.ELASTIC_NODE_RANK,
    "node_count": sc.ELASTIC_NODE_COUNT,
    "pod_name": sc.K8S_POD_NAME,
    "reason": sc.ELASTIC_FAULT_REASON,
    "exit_code": sc.ELASTIC_EXIT_CODE,
}

#: Prefix of content keys that have no alias and no namespace of their own.
CONTENT_PREFIX = "training.content."
METRIC_PREFIX = "training.metric."


def _int(value: int) -> int | str:
    return value if _INT64_MIN <= value <= _INT64_MAX else str(int(value))


def _truncate(text: str) -> str:
    text = _encodable(text)
    return text if len(text) <= MAX_STRING else text[: MAX_STRING - 3] + "..."


def _describe(value: Any) -> str:
    return _truncate(text(value))


def device_description(value: Any) -> str:
    """What an accelerator tensor is, without reading it (reading would synchronise the device)."""
    shape = tuple(getattr(value, "shape", ()))
    return f"<{type(value).__name__} shape={shape} dtype={getattr(value, 'dtype', '?')} device={value.device}>"


def is_device_scalar(value: Any) -> bool:
    """A one-element tensor on a device other than the CPU: the events API reads it once the device has
    computed it (``events/values.py``) instead of describing it."""
    device = getattr(value, "device", None)
    if device is None or getattr(device, "type", "cpu") == "cpu":
        return False
    try:
        return value.numel() == 1  # type: ignore[no-any-return]  # a tensor's numel() is an int: == gives a bool
    except Exception:  # noqa: BLE001 - not a tensor after all
        return False


def _array_scalar(value: Any) -> Any:
    """The Python scalar of a one-element numpy/torch value on the CPU, else a description.

    Reading an accelerator tensor would synchronise the device; describe it instead.
    """
    device = getattr(value, "device", None)
    if device is not None and getattr(device, "type", "cpu") != "cpu":
        return device_description(value)
    size = getattr(value, "size", None)
    if callable(size):  # torch: size() is a method, numel() the count
        size = value.numel()
    if size == 1:
        scalar = value.item()
        if isinstance(scalar, _SCALARS):
            return _value(scalar)  # a uint64 may be beyond int64
    return _describe(value)


def attribute_value(value: Any) -> Any:
    """One value as an attribute value (None when it cannot be one): a device value once read (a Python
    scalar), or what ``needs_text`` selects (its text, truncated), off the training thread."""
    return _value(value)


def describe_now(value: Any) -> Any:
    """What ``late`` holds, as an attribute value here and now: where nothing reads it later (an injected
    provider's pipeline cannot hold spans for values), as before: a device tensor described, an object's text."""
    return device_description(value) if is_device_scalar(value) else attribute_value(value)


#: Types whose text is known to be cheap and never to block: described where they are logged.
_CHEAP_TEXT = (PurePath, Enum, datetime.date, datetime.time, datetime.timedelta, uuid.UUID, bytes, complex, type,
               range, slice)


def needs_text(value: Any) -> bool:
    """Whether ``value`` becomes an attribute only through its ``__str__``, which a user's class may make slow
    or blocking: the events API converts those off the training thread (``events/values.py``)."""
    return not (type(value) in _SCALARS or value is None
                or isinstance(value, (*_SCALARS, list, tuple, Mapping, *_CHEAP_TEXT))
                or (hasattr(value, "item") and hasattr(value, "dtype")))


def _value(value: Any) -> Any:
    """One attribute value, or None when it cannot be represented at all."""
    if type(value) in _SCALARS:
        if type(value) is str:
            return _truncate(value)
        return _int(value) if type(value) is int else value
    if isinstance(value, _SCALARS):  # subclasses: IntEnum, str enums, numpy.bool_ is not one
        if isinstance(value, str):
            return _truncate(str(value))
        return _int(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if isinstance(value, (list, tuple)):
        items = [_value(item) for item in list(value)[:MAX_LIST]]
        kinds = {type(item) for item in items}
        if len(kinds) == 1 and kinds.pop() in _SCALARS:
            return items
        if not items:
            return []
        return [_describe(item) for item in items]
    if hasattr(value, "item") and hasattr(value, "dtype"):
        return _array_scalar(value)
    if value is None:
        return None
    return _describe(value)


def _flatten(prefix: str, content: Mapping[Any, Any], out: dict[str, Any], depth: int) -> None:
    for key, value in content.items():
        if len(out) >= MAX_KEYS:
            return
        name = f"{prefix}{text(key)}"
        if isinstance(value, Mapping):
            if depth >= MAX_DEPTH:
                out[name] = _describe(value)
            else:
                _flatten(name + ".", value, out, depth + 1)
            continue
        converted = _value(value)
        if converted is not None:
            out[name] = converted


#: Content keys already turned into attribute keys (``key_for`` of their encodable text): a step's
#: ``batch_size=`` costs a dict lookup, not two calls. Bounded: a program that makes up keys refills it.
#: ``Duration`` reads it for its inline path.
CACHED_KEYS: dict[str, str] = {}
_MAX_CACHED_KEYS = 1024
#: ``to_attributes``' containment: it runs for every event's content (``trainer.log()`` every step, each instant),
#: so it keeps an inline ``try`` (a ``with`` block cost ~120 ns of its ~950) and logs with this one.
_CONVERT_FAILED = contain("to_attributes", "otel_training: could not convert event content; part of it is dropped")


def key_for(key: str, unnamed_prefix: str = CONTENT_PREFIX) -> str:
    """The attribute key of a content key: alias, the key itself if namespaced, or prefixed."""
    alias = ALIASES.get(key)
    if alias is not None:
        return alias
    return key if "." in key else unnamed_prefix + key


def to_attributes(content: Mapping[Any, Any] | None, unnamed_prefix: str = CONTENT_PREFIX,
                  late: list[tuple[str, Any]] | None = None) -> dict[str, Any]:
    """Span attributes for ``content``, at most ``MAX_KEYS``; never raises.

    Nothing asks ``content`` for its truth value or length: an array refuses
    one, and a user's Mapping may raise on it while its items read fine.
    ``late``: one-element device tensors, and objects that only their
    ``__str__`` describes (``needs_text``), go there as (key, value), to be
    read once computed or converted off the training thread
    (``events/values.py``), instead of being described here.
    """
    out: dict[str, Any] = {}
    if content is None:
        return out
    if not hasattr(content, "items"):
        _not_a_mapping(content)
        return out
    try:
        for key, value in content.items():
            if len(out) >= MAX_KEYS:
                log_once("to_attributes:keys", "otel_training: event content with more than %d keys; "
                         "the rest are dropped", MAX_KEYS, exc_info=False)
                break
            name = CACHED_KEYS.get(key) if type(key) is str and unnamed_prefix is CONTENT_PREFIX else None
            if name is None:
                name = key_for(_encodable(key) if type(key) is str else text(key), unnamed_prefix)
                if type(key) is str and unnamed_prefix is CONTENT_PREFIX:
                    if len(CACHED_KEYS) >= _MAX_CACHED_KEYS:
                        CACHED_KEYS.clear()
                    CACHED_KEYS[key] = name
            if type(value) is float or type(value) is bool:
                out[name] = value  # the common case, kept cheap
            elif type(value) is int:
                out[name] = value if _INT64_MIN <= value <= _INT64_MAX else str(value)
            elif isinstance(value, Mapping):
                _flatten(name + ".", value, out, 1)
            elif late is not None and (is_device_scalar(value) or needs_text(value)):
                late.append((name, value))
            else:
                converted = _value(value)
                if converted is not None:
                    out[name] = converted
    except Exception:  # noqa: BLE001 - every event's content, inline: a user's odd object must not reach training code
        _CONVERT_FAILED.failed()
    return out


def readable(content: Any) -> Mapping[Any, Any] | None:
    """``content`` as a plain dict of at most ``MAX_KEYS + 1`` items, or None when it cannot be read.

    For code that tests content for truth (``Duration``): an array, or a Mapping
    whose ``__bool__``/``__len__`` raises, would raise into the caller there.
    """
    if content is None or type(content) is dict:
        return content
    if not hasattr(content, "items"):
        _not_a_mapping(content)
        return None
    # A user's mapping whose items() raises: dropped, never raised into training.
    with contain("readable-content", "otel_training: event content is not a readable mapping; it is dropped"):
        return dict(itertools.islice(content.items(), MAX_KEYS + 1))
    return None


def _not_a_mapping(content: Any) -> None:
    log_once("content-type", "otel_training: event content must be a mapping, not %s; it is dropped",
             type(content).__name__, exc_info=False)
