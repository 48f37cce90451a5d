"""Parsing option values: each parser takes what a variable, a file or an argument gave and returns
the value or raises ``ConfigError`` saying what is wrong with it (the caller adds where it came from).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

#: The longest duration any setting takes, ours or a standard ``OTEL_*`` one: longer
#: than any sensible bound on a flush, a step or a trace, and far inside what a
#: timed wait accepts (past ~292 years it raises ``OverflowError``, at exit or in
#: an exporter thread, hours after the typo).
MAX_SECONDS = 7 * 24 * 3600
#: The largest size or count (queue, batch, spans per trace): a 32-bit int, as the
#: other OpenTelemetry SDKs take; beyond it a queue is unbounded in all but name.
MAX_SIZE = 2**31 - 1
#: The largest identity number (rank, world size...): OTLP's integers are int64,
#: and a bigger one vanishes from every export.
MAX_INT64 = 2**63 - 1


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the option and where it came from."""


def _parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        low = value.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
    raise ValueError("expected a boolean (true/false)")


def _parse_bool_or_auto(value: Any) -> bool | str:
    """True, False, or "auto" (decided where the pipeline is built: offload where it runs)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return _parse_bool(value)
    except ValueError:
        raise ValueError("expected auto or a boolean (true/false)") from None


def _parse_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("expected an integer, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise ValueError("expected an integer") from None
    raise ValueError("expected an integer")


def _parse_seconds(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a number of seconds, got a boolean")
    expected = f"expected a number of seconds >= 0 and <= {MAX_SECONDS} (a week)"
    try:
        if isinstance(value, (int, float)):
            seconds = float(value)
        elif isinstance(value, str):
            seconds = float(value.strip())
        else:
            raise ValueError("expected a number of seconds")
    except OverflowError:  # an int beyond any float, e.g. 10**400
        raise ValueError(expected) from None
    except ValueError:  # "soon": the range, not Python's "could not convert string to float"
        raise ValueError(expected) from None
    if math.isnan(seconds) or not 0 <= seconds <= MAX_SECONDS:
        raise ValueError(expected)
    return seconds


def _parse_str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("expected a string")
    return value


def _parse_path(value: Any) -> str:
    path = _parse_str(value)
    if "\0" in path:  # the OS refuses it, with an error naming nothing
        raise ValueError("a path cannot contain a NUL character")
    return path


def _parse_str_list(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        items = [item.strip() for item in value.split(",")]
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
    else:
        raise ValueError("expected a list of strings (or a comma-separated string)")
    if not all(isinstance(item, str) and item for item in items):
        raise ValueError("expected non-empty strings")
    return tuple(items)


def _optional(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def parse_optional(value: Any) -> Any:
        if value is None or (isinstance(value, str) and value.strip() == ""):
            return None
        return parse(value)

    return parse_optional


def _choice(*choices: str) -> Callable[[Any], str]:
    def parse_choice(value: Any) -> str:
        if not isinstance(value, str) or value.strip().lower() not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value.strip().lower()

    return parse_choice


def _non_negative(parse: Callable[[Any], int], maximum: int) -> Callable[[Any], int]:
    def parse_non_negative(value: Any) -> int:
        number = parse(value)
        if not 0 <= number <= maximum:
            raise ValueError(f"expected an integer in 0..{maximum}")
        return number

    return parse_non_negative


def _positive(parse: Callable[[Any], int], maximum: int) -> Callable[[Any], int]:
    def parse_positive(value: Any) -> int:
        number = parse(value)
        if not 0 < number <= maximum:
            raise ValueError(f"expected an integer in 1..{maximum}")
        return number

    return parse_positive


def _parse_stuck_seconds(value: Any) -> float:
    """A stuck threshold or escalation interval: at least ``MIN_THRESHOLD_S``, at most a week."""
    from otel_training.processors.stuck import MIN_THRESHOLD_S

    expected = (f"expected a number of seconds >= {MIN_THRESHOLD_S} and <= {MAX_SECONDS} (a week; shorter than "
                f"{MIN_THRESHOLD_S} s, a stuck span raises alerts every few milliseconds)")
    try:
        seconds = _parse_seconds(value)
    except ValueError:  # one range, whatever was wrong: -3 and 0 are refused alike
        raise ValueError(expected) from None
    if seconds < MIN_THRESHOLD_S:
        raise ValueError(expected)
    return seconds


def _parse_span_rules(value: Any) -> tuple[str, ...]:
    names = _parse_str_list(value)
    from otel_training.processors.stuck import parse_span_names  # the one grammar of "name=seconds"

    rules = parse_span_names(names)  # raises ValueError naming the bad item
    for name, seconds in rules.items():
        if seconds is not None and seconds > MAX_SECONDS:
            raise ValueError(f"threshold {seconds:g} of {name!r} must be <= {MAX_SECONDS} seconds (a week)")
    return names


def _parse_signal(value: Any) -> str:
    import signal

    text = str(value).strip().upper() if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    try:
        number = int(text) if text.isdigit() else None
        return signal.Signals(number).name if number is not None else signal.Signals[
            text if text.startswith("SIG") else "SIG" + text].name
    except (KeyError, ValueError):
        raise ValueError("expected a signal name or number, e.g. SIGTERM") from None


def _parse_exit_code(value: Any) -> int:
    code = _parse_int(value)
    if not 0 <= code <= 255:
        raise ValueError("expected an exit code in 0..255")
    return code


__all__ = ["MAX_INT64", "MAX_SECONDS", "MAX_SIZE", "ConfigError"]
