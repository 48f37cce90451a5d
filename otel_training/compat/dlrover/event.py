"""DLRover's ``Event`` and its two line formats (DLRover's text line and JSON lines).

The bytes of the log are DLRover's contract with its master (which parses
``#step`` lines with ``ast.literal_eval``), so the escaping that keeps every
line one line and readable by the master lives here, in one place, apart from
who writes the lines (``exporter``) and who makes the events (``emitter``).
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from otel_training._text import CONTROL_ESCAPES, escape_controls, text
from otel_training.compat.dlrover.names import EventType


def generate_event_id() -> str:
    """A short random id (DLRover's 8 hex digits): a BEGIN and its END share one.

    Not from ``uuid4`` as DLRover's: reading the system's entropy costs more than
    the rest of a step's events, and an id needs to be distinct, not secret.
    """
    return f"{random.getrandbits(32):08x}"


#: Beyond what JSON escapes itself: DEL, the C1 controls (NEL ends a line for
#: ``str.splitlines``), the line separators and the bidirectional overrides. As
#: ``\\uXXXX`` they stay valid JSON and valid Python literals (the master reads
#: step content with ``ast.literal_eval``).
_JSON_ESCAPES = {code: f"\\u{code:04x}" for code in CONTROL_ESCAPES if code >= 0x7F}
#: A bracketed field may not hold the controls, nor the backslash and brackets of the line.
_FIELD_ESCAPES = {**CONTROL_ESCAPES, ord("\\"): "\\\\", ord("["): "\\x5b", ord("]"): "\\x5d"}


def _default(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    return f"<<non-serializable: {type(value).__qualname__}>>"


def _salvage(content: Any) -> Any:
    """What of ``content`` JSON can hold: a value it cannot (a cycle) is described, a key stringified."""
    out: dict[str, Any] = {}
    try:
        for key, value in content.items():
            try:
                json.dumps(value, default=_default)
                out[key if isinstance(key, str) else text(key)] = value
            except Exception:  # noqa: BLE001 - a value JSON cannot hold (a cycle, a failing __str__): described instead
                out[key if isinstance(key, str) else text(key)] = _default(value)
    except Exception:  # noqa: BLE001 - not a readable mapping at all
        return _default(content)
    return out


#: Finds what the tables above escape, so that the common line skips the translation.
_JSON_UNSAFE = re.compile("[" + "".join(re.escape(chr(code)) for code in _JSON_ESCAPES) + "]")
_FIELD_UNSAFE = re.compile("[" + "".join(re.escape(chr(code)) for code in _FIELD_ESCAPES) + "]")


#: The event whose content DLRover's master reads with ``ast.literal_eval``, not as JSON.
_MASTER_LITERAL_EVENT = "#step"


def _as_literal(value: Any) -> Any:
    """``value`` as content DLRover's master can read: JSON that is also a Python literal, no ``[``.

    The master removes every ``[...]`` from a ``#step`` line, then parses the rest with
    ``ast.literal_eval``. So JSON's true/false become 1/0 (the same truthiness in both), nulls
    are left out, and an array becomes its JSON text (its brackets escaped in the line, so the
    string reads back as written). DLRover's own writer puts ``"success": true`` on every
    step's END: lines its master refuses.
    """
    if value is True or value is False:
        return int(value)
    if isinstance(value, dict):
        return {key: _as_literal(item) for key, item in value.items() if item is not None}
    if isinstance(value, (list, tuple)):
        return json.dumps(value, default=_default)
    return value


def _dumps(record: Any) -> str:
    dumped = json.dumps(record, ensure_ascii=False, default=_default)
    return dumped.translate(_JSON_ESCAPES) if _JSON_UNSAFE.search(dumped) else dumped


def _field(value: Any) -> str:
    if type(value) is str and not _FIELD_UNSAFE.search(value):
        return f"[{value}]"
    return f"[{escape_controls(value, _FIELD_ESCAPES)}]"


@dataclass(frozen=True)
class Event:
    """One line of the log, as DLRover's own ``Event`` holds it."""

    pid: int | str
    event_id: str
    event_time: datetime
    name: str
    event_type: EventType
    content: dict[str, Any]
    target: str = ""
    #: Bracketed fields before the content (time, pid, id, target, name, type): the master checks the count.
    max_event_prefix: ClassVar[int] = 6

    def __str__(self) -> str:
        """DLRover's text line: ``[time] [pid] [event_id] [target] [name] [type] {content}``."""
        literal = self.name == _MASTER_LITERAL_EVENT
        body = _as_literal(self.content) if literal else self.content
        try:
            content = _dumps(body)
        except Exception:  # noqa: BLE001 - a cycle, or keys JSON cannot hold
            content = _dumps(_salvage(body))
        if literal and ("[" in content or "]" in content):
            content = content.replace("[", "\\u005b").replace("]", "\\u005d")  # only inside strings now
        return " ".join((_field(self.event_time.isoformat()), _field(self.pid), _field(self.event_id),
                         _field(self.target), _field(self.name), _field(self.event_type.name), content))

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "event_id": self.event_id,
            "event_time": self.event_time.isoformat(),
            "target": self.target,
            "name": self.name,
            "event_type": self.event_type.name,
            "content": self.content,
        }

    def to_json(self) -> str:
        record = self.to_dict()
        try:
            return _dumps(record)
        except Exception:  # noqa: BLE001 - any content that fails to serialise is salvaged, never lost nor raised
            record["content"] = _salvage(self.content)
            record["target"], record["name"], record["event_id"] = (
                text(record["target"]), text(record["name"]), text(record["event_id"]))
            return _dumps(record)

    @classmethod
    def _now(cls, event_type: EventType, event_id: str, target: str, name: str, content: Any) -> Event:
        return cls(pid=os.getpid(), event_id=event_id, event_time=datetime.now(), name=name,
                   event_type=event_type, content=content if content is not None else {}, target=target)

    @classmethod
    def instant(cls, event_id: str, target: str, name: str, content: dict[str, Any] | None = None) -> Event:
        return cls._now(EventType.INSTANT, event_id, target, name, content)

    @classmethod
    def begin(cls, event_id: str, target: str, name: str, content: dict[str, Any]) -> Event:
        return cls._now(EventType.BEGIN, event_id, target, name, content)

    @classmethod
    def end(cls, event_id: str, target: str, name: str, content: dict[str, Any]) -> Event:
        return cls._now(EventType.END, event_id, target, name, content)


class LogFormatter:
    """DLRover's text line (``DLROVER_EVENT_TEXT_FORMATTER=LOG``, the default)."""

    def format(self, event: Event) -> str:
        return str(event)


class JsonFormatter:
    """One JSON object per line (``DLROVER_EVENT_TEXT_FORMATTER=JSON``)."""

    def format(self, event: Event) -> str:
        return event.to_json()
