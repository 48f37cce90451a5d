"""A tracker that starts dormant in a process an instrumented one started, and claims it once it trains.

Auto-instrumentation follows the processes an instrumented process starts: a rank
started with ``torch.multiprocessing.spawn``, or a DataLoader worker. Most of them
never train (workers), so configuring each at start would cost every worker a
pipeline. A tracker given a ``claim`` callable records nothing and configures
nothing until the process trains (``init_process_group``, a backward pass, an
optimizer step), then calls ``claim(rank, world_size)`` once, which configures the
pipeline with the process's rank. A process configured meanwhile by its own code
wakes the tracker without a claim.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from otel_training._contain import contain, contained
from otel_training.assembly.configure import get_telemetry

#: ``claim(rank, world_size) -> bool``: configure a dormant process that began training.
Claim = Callable[[Any, Any], bool]


class Dormancy:
    """The dormant state of a step tracker (``steps.StepTracker``), and its one claim."""

    def __init__(self, claim: Claim | None) -> None:
        #: Records nothing: dormant until the process trains (``claim`` pending), or the claim was refused.
        self.dormant = claim is not None
        self._claim = claim
        self._claim_lock = threading.Lock()

    def _claimed(self) -> None:
        """The process is ours now: start watching for steps."""

    def _still_dormant(self) -> bool:
        """True while dormant; a dormant tracker claims the process once it got configured by other means."""
        if self._claim is not None and get_telemetry() is not None:
            self.claim_if_dormant()
        return self.dormant

    @contained(default=None)
    def claim_if_dormant(self, rank: int | None = None, world_size: int | None = None) -> None:
        """The process does training work: claim it (once) if dormant, and start recording if it is ours."""
        if self._claim is None:
            return
        with self._claim_lock:
            claim, self._claim = self._claim, None
            if claim is None:
                return
            claimed = False
            if get_telemetry() is not None:
                claimed = True
            else:
                # Stay dormant, never break training.
                with contain("torch-claim", "otel_training: could not configure this training process; "
                             "it runs uninstrumented"):
                    claimed = bool(claim(rank, world_size))
            self.dormant = not claimed
        if claimed:
            self._claimed()
