"""Whether a DataLoader iterator has nothing left: its next fetch only raises StopIteration (no wait, no step).

Why a module of its own: the step tracker asks on every fetch, and the answer needs the loader's length,
which goes through the sampler's Python ``__len__`` methods; this keeps the one cached length and the rules
for when to ask again apart from the step state machine.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any


class LoaderLengths:
    """The DataLoader iterator last fetched from (weakly: it owns worker processes) and its length, one tuple:
    read once per fetch, so a thread fetching from another loader never mixes the two."""

    #: A slot: the C core's fetch reads it (native/steps.c), and asks ``exhausted`` only when it cannot answer.
    __slots__ = ("_length_of",)

    def __init__(self) -> None:
        self._length_of: tuple[Callable[[], Any], int | None] = (_dead, None)

    def exhausted(self, iterator: Any) -> bool:
        """True when a sized DataLoader iterator has nothing left (the fetch will raise StopIteration).

        Its length is asked once per iterator and epoch: ``len()`` goes through the sampler's Python
        ``__len__`` methods, several calls a step. A persistent-workers loader reuses its iterator
        every epoch, and a bucketing sampler's length changes with the epoch: asked again whenever
        the iterator starts over.
        """
        try:
            yielded = iterator._num_yielded  # noqa: SLF001 - torch's count of the batches a DataLoader iterator gave, public nowhere
        except Exception:  # noqa: BLE001 - not a DataLoader iterator (an attribute getter may raise anything)
            return False
        reference, length = self._length_of
        if yielded == 0 or reference() is not iterator:
            try:
                length = len(iterator)
            except Exception:  # noqa: BLE001 - iterable datasets have no length
                length = None
            try:
                reference = weakref.ref(iterator)
            except TypeError:  # no weak references: ask every time
                reference = _dead
            self._length_of = (reference, length)
        return length is not None and yielded >= length


def _dead() -> None:
    """A weak reference to nothing."""
    return None
