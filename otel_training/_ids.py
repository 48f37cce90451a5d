"""Trace and span ids from a random generator of our own, never from the ``random`` module's global state.

The SDK's ``RandomIdGenerator`` draws from ``random``'s global generator, which is not ours to rely on in
a training process:

* training scripts seed it for reproducibility (``random.seed(0)``): every rank of a job, and every run of
  the script, would draw the same trace and span ids;
* ``torch.compile`` saves that state before tracing a frame and restores it after, so ids another thread
  of ours drew meanwhile (the device timeline's) come again: two spans with one id, and the drain counts
  one of them lost (found on the pure-Python path, 2026-11-27).

So ids come from a ``random.Random`` seeded from the OS, reseeded in a forked child (which would otherwise
draw its parent's ids). Its methods run in C under the GIL: threads may share it.
"""

from __future__ import annotations

import random

from opentelemetry.sdk.trace.id_generator import IdGenerator

from otel_training._fork import at_fork

_generator = random.Random()  # seeded from os.urandom
getrandbits = _generator.getrandbits

at_fork(after_in_child=_generator.seed)  # a child draws ids of its own


class PrivateIdGenerator(IdGenerator):
    """The SDK's id generator over our own random state (see the module's docstring)."""

    def generate_span_id(self) -> int:
        return getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return getrandbits(128) or 1
