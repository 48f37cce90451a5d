"""Escaping text from traces before it lands in a line-oriented output.

Names, attributes and stacks come from user code and from files anyone may
have written; printed raw, a newline forges a line of a log and an escape
sequence rewrites a terminal (its title, the screen, the clipboard). Escaped,
they read as what they are: ``\\n``, ``\\x1b``, ``\\u202e``.
"""

from __future__ import annotations

from collections.abc import Mapping

#: C0 and C1 controls, DEL, the Unicode line and paragraph separators, and the
#: bidirectional overrides that make text display other than it reads.
CONTROL_ESCAPES: Mapping[int, str] = {
    **{code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))},
    ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t",
    **{code: f"\\u{code:04x}" for code in (0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A))},
}


def escape_controls(text: object, table: Mapping[int, str] = CONTROL_ESCAPES) -> str:
    """``str(text)`` on one line, its control characters escaped (by ``table``)."""
    return str(text).translate(table)


def encodable(text: str) -> str:
    """``text`` as UTF-8 can encode it: a lone surrogate (from a bytes path or a C library) escaped."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def text(value: object) -> str:
    """``str(value)`` as text the exporters can encode; never raises (for messages and names)."""
    try:
        return encodable(value if type(value) is str else str(value))
    except Exception:  # noqa: BLE001 - a __str__ may raise anything
        return f"<{type(value).__name__}>"


__all__ = ["CONTROL_ESCAPES", "encodable", "escape_controls", "text"]
