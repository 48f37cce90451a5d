"""Argument types shared by the subcommands: a bad number is refused by argparse, naming the option and value,
before anything runs (``-3`` steps or a ``-1`` s step time used to be accepted and printed back or divided by)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def whole(what: str, minimum: int = 1) -> Callable[[str], int]:
    """A whole number of ``what`` >= ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be a whole number of {what} >= {minimum}, not {text!r}")
        return value

    return parse


def seconds(*, zero: bool = False) -> Callable[[str], float]:
    """A finite number of seconds, > 0 (``zero``: >= 0)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(f"must be a number of seconds {'>= 0' if zero else '> 0'}, "
                                             f"not {text!r}")
        return value

    return parse


def fraction(text: str) -> float:
    """A number in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be a number above 0 and at most 1, not {text!r}")
    return value
