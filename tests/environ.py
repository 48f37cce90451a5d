"""The environment a test gives the processes it starts: the developer's OTEL_* settings left out.

``OTEL_TRAINING_NATIVE`` stays: it picks the implementation under test (CI runs the suite with the C extension
and again with ``OTEL_TRAINING_NATIVE=off``), and a child must run the same one as its test.
"""

from __future__ import annotations

import os

KEPT = ("OTEL_TRAINING_NATIVE",)


def child_environ(*also: str) -> dict[str, str]:
    """``os.environ`` without ``OTEL_*`` (but ``KEPT``) and without the variables starting with ``also``."""
    prefixes = ("OTEL_", *also)
    return {key: value for key, value in os.environ.items() if key in KEPT or not key.startswith(prefixes)}
