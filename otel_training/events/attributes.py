"""Turning whatever a user passes as event content into span attributes, safely.

Content comes from training code: ints and floats, but also numpy scalars,
tensors, nested dicts of metrics, paths and arbitrary objects. OpenTelemetry
accepts scalars and homogeneous lists only, so everything else is flattened
(dicts, with dots), converted (numpy/CPU tensor scalars) or stringified and
truncated. This never raises, and never touches the value of an accelerator
tensor, which would force a device synchronisation on the training thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from otel_training import semconv as sc

MAX_STRING = 1024
MAX_LIST = 128
MAX_DEPTH = 4

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


def _truncate(text: str) -> str:
    return text if len(text) <= MAX_STRING else text[: MAX_STRING - 3] + "..."


def _describe(value: Any) -> str:
    try:
        text = str(value)
    except Exception:  # noqa: BLE001
        text = f"<{type(value).__name__}>"
    return _truncate(text)


def _array_scalar(value: Any) -> Any:
    """The Python scalar of a one-element numpy/torch value on the CPU, else a description.

    Reading an accelerator tensor would synchronise the device; describe it instead.
    """
    device = getattr(value, "device", None)
    if device is not None and getattr(device, "type", "cpu") != "cpu":
        shape = tuple(getattr(value, "shape", ()))
        return f"<{type(value).__name__} shape={shape} dtype={getattr(value, 'dtype', '?')} device={device}>"
    size = getattr(value, "size", None)
    if callable(size):  # torch: size() is a method, numel() the count
        size = value.numel()
    if size == 1:
        scalar = value.item()
        if isinstance(scalar, _SCALARS):
            return scalar
    return _describe(value)


def _value(value: Any) -> Any:
    """One attribute value, or None when it cannot be represented at all."""
    if type(value) in _SCALARS:
        return _truncate(value) if type(value) is str else value
    if isinstance(value, _SCALARS):  # subclasses: IntEnum, str enums, numpy.bool_ is not one
        return _truncate(str(value)) if isinstance(value, str) else value
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
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            if depth >= MAX_DEPTH:
                out[name] = _describe(value)
            else:
                _flatten(name + ".", value, out, depth + 1)
            continue
        converted = _value(value)
        if converted is not None:
            out[name] = converted


def key_for(key: str, unnamed_prefix: str = CONTENT_PREFIX) -> str:
    """The attribute key of a content key: alias, the key itself if namespaced, or prefixed."""
    alias = ALIASES.get(key)
    if alias is not None:
        return alias
    return key if "." in key else unnamed_prefix + key


def to_attributes(content: Mapping[Any, Any] | None, unnamed_prefix: str = CONTENT_PREFIX) -> dict[str, Any]:
    """Span attributes for ``content``; never raises."""
    if not content:
        return {}
    out: dict[str, Any] = {}
    try:
        for key, value in content.items():
            name = key_for(str(key), unnamed_prefix)
            if type(value) in _SCALARS and type(value) is not str:
                out[name] = value  # the common case, kept cheap
            elif isinstance(value, Mapping):
                _flatten(name + ".", value, out, 1)
            else:
                converted = _value(value)
                if converted is not None:
                    out[name] = converted
    except Exception:  # noqa: BLE001 - a user's odd object must not reach training code
        from otel_training._contain import log_once

        log_once("to_attributes", "otel_training: could not convert event content; part of it is dropped")
    return out
