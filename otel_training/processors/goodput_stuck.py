"""The live goodput's stuck time while a hang lasts (issue 30, item 13).

A hang ends no span, and the live processor settles time as spans end, so through
a hang its ratio and buckets stood still: 0.165 and no stuck time for 90 s of a
step stuck past its threshold. The report counts a stuck stretch from the
threshold crossing (the stuck alert's time − (elapsed − threshold)) to the
recovered alert, the span's end or the run's end, above every other label. So
from the crossing on, every nanosecond up to now is stuck whatever follows: each
collection can count it, in ``stuck`` and in the total, before the stretch is
settled.
"""

from __future__ import annotations

from otel_training import semconv as sc
from otel_training.analysis import RunAccountant


class LiveStuck:
    """Adds the open stuck stretch to a settling's totals; stuck time shown never goes back."""

    def __init__(self) -> None:
        #: Stuck ns the last settling counted beyond the settled ones (the open stretch, or what stays shown).
        self.open_ns = 0
        #: The most stuck ns a settling returned.
        self.shown_ns = 0

    def add_open(self, totals: dict[str, int], accountant: RunAccountant, now: int) -> dict[str, int]:
        """``totals`` with the open stuck stretch up to ``now``: from the earliest threshold crossing
        with no recovery yet (or from the settled time, if later), in ``stuck`` and the total.

        The recovery settles the same stretch in the timeline, which folds no further than the
        crossing meanwhile (``GoodputSpanProcessor._take_in``): nothing counts twice.
        """
        since = accountant.stuck_since_ns
        open_ns = 0 if since is None else now - max(since, accountant.timeline.folded_until)
        return self.never_back(totals, max(0, open_ns))

    def never_back(self, totals: dict[str, int], open_ns: int = 0) -> dict[str, int]:
        """``totals`` with ``open_ns`` more stuck, and never less stuck than a settling showed.

        The end of a stuck span can reach the processor after a collection that counted its
        stretch up to then: an offloaded drain replays it a few ms late (its detector may even
        alert on a step it replays late). The stretch then settles shorter than it was shown, and
        a counter that goes down reads as a reset to Prometheus (``increase()`` counts all of it
        again); so what was shown stays, in the ratio's total too.
        """
        stuck = totals.get(sc.BADPUT_STUCK, 0)
        shown = max(stuck + open_ns, self.shown_ns)
        self.open_ns = shown - stuck
        self.shown_ns = shown
        if shown:
            totals[sc.BADPUT_STUCK] = shown
        return totals
