"""Where the time of one run went: each instant gets exactly one badput bucket, or counts as productive.

Spans overlap (a data wait inside a step, a stuck stretch inside a step), so
a span does not simply add its duration to a bucket: a sweep over the span
boundaries gives each stretch of time to the covering label of highest
priority, and time no span covers is start-up (before the first step), the
host's own time outside steps (after it, while training), or "other" (after
the training loop ended). Every nanosecond of the run is counted once, so goodput
and the badput buckets add up to the run's duration.

``Timeline`` folds incrementally: the live processor folds what has settled at
each metric collection, the report folds a whole run at once, with the same
code and the same result.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from otel_training import semconv as sc

#: The label of productive (goodput) time.
PRODUCTIVE = "productive"

#: Badput buckets, in the order reports list them.
BUCKETS: tuple[str, ...] = (
    sc.BADPUT_PROGRAM_STARTUP,
    sc.BADPUT_COMPILATION,
    sc.BADPUT_INITIALIZATION,
    sc.BADPUT_TRAINING_PREP,
    sc.BADPUT_DATA_LOADING,
    sc.BADPUT_CHECKPOINT_SAVE,
    sc.BADPUT_CHECKPOINT_RESTORE,
    sc.BADPUT_EVALUATION,
    sc.BADPUT_STUCK,
    sc.BADPUT_WASTED_PROGRESS,
    sc.BADPUT_RECOVERY,
    sc.BADPUT_DOWNTIME,
    sc.BADPUT_HOST_OUTSIDE_STEPS,
    sc.BADPUT_OTHER,
)

#: Timeline label of a step's device execution (``training.device_step``): productive time that
#: outranks what the host was doing meanwhile. CUDA work is asynchronous: while the device runs
#: earlier steps, a host blocked in the DataLoader's pinned-memory copy or a checkpoint's copy
#: costs nothing. Only where the device is idle does the host's wait become badput.
DEVICE_BUSY = "device_busy"

# Where spans overlap, the higher priority wins: a stuck stretch inside a step
# is stuck time, a data wait inside a host step is data loading unless the
# device was busy with a step meanwhile.
_PRIORITY: dict[str, int] = {
    PRODUCTIVE: 1,
    sc.BADPUT_TRAINING_PREP: 2,
    sc.BADPUT_INITIALIZATION: 3,
    sc.BADPUT_EVALUATION: 4,
    sc.BADPUT_DATA_LOADING: 5,
    sc.BADPUT_CHECKPOINT_SAVE: 6,
    sc.BADPUT_CHECKPOINT_RESTORE: 7,
    DEVICE_BUSY: 8,
    sc.BADPUT_STUCK: 9,
}
#: The bucket each label's time is counted in.
_BUCKET_OF: dict[str, str] = {DEVICE_BUSY: PRODUCTIVE}
_BY_PRIORITY: list[str] = [""] * (max(_PRIORITY.values()) + 1)
for _label, _priority in _PRIORITY.items():
    _BY_PRIORITY[_priority] = _BUCKET_OF.get(_label, _label)

_SPAN_LABELS: dict[str, str] = {
    sc.SPAN_STEP: PRODUCTIVE,
    sc.SPAN_DEVICE_STEP: PRODUCTIVE,
    sc.SPAN_INIT: sc.BADPUT_INITIALIZATION,
    sc.SPAN_LOAD_DATASET: sc.BADPUT_TRAINING_PREP,
    sc.SPAN_DATA_WAIT: sc.BADPUT_DATA_LOADING,
    sc.SPAN_SAVE_CHECKPOINT: sc.BADPUT_CHECKPOINT_SAVE,
    sc.SPAN_LOAD_CHECKPOINT: sc.BADPUT_CHECKPOINT_RESTORE,
    sc.SPAN_EVALUATE: sc.BADPUT_EVALUATION,
    sc.SPAN_PREDICT: sc.BADPUT_EVALUATION,
}

#: Names of the spans whose time gets a label (``span_label`` is not None for exactly these).
LABELLED_SPAN_NAMES: frozenset[str] = frozenset(_SPAN_LABELS)


def span_label(name: str, evaluation_is_productive: bool = False) -> str | None:
    """The label a span's time gets, or None when the span does not classify time (epoch, train, ...).

    ``training.persist_checkpoint`` is absent on purpose: persisting runs in the
    background (only the blocking save is badput, as in ml-goodput-measurement).
    """
    label = _SPAN_LABELS.get(name)
    if label == sc.BADPUT_EVALUATION and evaluation_is_productive:
        return PRODUCTIVE
    return label


def timeline_label(name: str, evaluation_is_productive: bool = False) -> str | None:
    """The label ``Timeline.add`` takes for a span: ``span_label``, but ``DEVICE_BUSY`` for device steps."""
    if name == sc.SPAN_DEVICE_STEP:
        return DEVICE_BUSY
    return span_label(name, evaluation_is_productive)


#: Spans that mark a step for "time before the first step" (start-up) and "time between steps".
STEP_SPAN_NAMES: frozenset[str] = frozenset({sc.SPAN_STEP, sc.SPAN_DEVICE_STEP})


class Timeline:
    """Nanoseconds of one run by label, folded up to a point in time."""

    def __init__(self, start_ns: int, *, after_restart: bool = False) -> None:
        self.folded_until = start_ns
        self.first_step_ns: int | None = None
        #: End of the run's training loop (its ``training.train`` span): uncovered time after it is
        #: "other" (teardown), before it "host_outside_steps".
        self.train_end_ns: int | None = None
        self.totals: defaultdict[str, int] = defaultdict(int)
        # The job's first life starts up; every later one recovers (after a failure or not).
        self._before_first_step = sc.BADPUT_RECOVERY if after_restart else sc.BADPUT_PROGRAM_STARTUP
        self._pending: list[tuple[int, int, int]] = []

    def add(self, label: str, start_ns: int, end_ns: int, *, is_step: bool = False) -> None:
        """Count [start_ns, end_ns) as ``label`` where nothing of higher priority covers it."""
        if is_step:
            if self.first_step_ns is None or start_ns < self.first_step_ns:
                self.first_step_ns = start_ns
            if self.train_end_ns is not None and start_ns >= self.train_end_ns and label != DEVICE_BUSY:
                # Another training loop followed (a device step ending after train does not say so:
                # the device finishes what the host launched before the loop ended).
                self.train_end_ns = None
        if start_ns < self.folded_until:  # time already folded is settled
            start_ns = self.folded_until
        if end_ns > start_ns:
            self._pending.append((start_ns, end_ns, _PRIORITY[label]))

    def fold(self, until_ns: int, marks: Sequence[int] = ()) -> list[int]:
        """Settle the time up to ``until_ns``: intervals ending later keep their remainder.

        ``marks``: ascending times in (folded_until, until_ns]; returns the productive ns counted
        up to each, so that a reader folding as it streams can still answer "how much progress
        had this run made when step N ended" after that time is settled.
        """
        if until_ns <= self.folded_until:
            return []
        boundaries: list[tuple[int, int, int]] = []
        keep: list[tuple[int, int, int]] = []
        for start, end, priority in self._pending:
            if start >= until_ns:
                keep.append((start, end, priority))
                continue
            if end > until_ns:
                keep.append((until_ns, end, priority))
                end = until_ns
            boundaries.append((start, 1, priority))
            boundaries.append((end, -1, priority))
        self._pending = keep
        if self.train_end_ns is not None and self.folded_until < self.train_end_ns < until_ns:
            boundaries.append((self.train_end_ns, 0, 0))  # where uncovered time turns into "other"
        boundaries.sort()
        counts = [0] * len(_BY_PRIORITY)
        totals = self.totals
        cursor = self.folded_until
        top = 0
        found: list[int] = []
        next_mark = marks[0] if marks else until_ns + 1
        labels = _BY_PRIORITY
        for time_ns, delta, priority in boundaries:
            while next_mark <= time_ns:
                found.append(self._productive_at(next_mark, cursor, top))
                next_mark = marks[len(found)] if len(found) < len(marks) else until_ns + 1
            if time_ns > cursor:
                totals[labels[top] if top else self._label(0, cursor)] += time_ns - cursor
                cursor = time_ns
            if delta > 0:
                counts[priority] += 1
                if priority > top:
                    top = priority
            elif delta:
                counts[priority] -= 1
                if priority == top and not counts[priority]:
                    top = priority - 1  # the next label down still covering, if any
                    while top and not counts[top]:
                        top -= 1
        while len(found) < len(marks):  # after the last boundary nothing covers time: none is productive
            found.append(self._productive_at(marks[len(found)], cursor, 0))
        if until_ns > cursor:
            totals[self._label(0, cursor)] += until_ns - cursor
        self.folded_until = until_ns
        return found

    def _productive_at(self, at_ns: int, cursor: int, top: int) -> int:
        """Productive ns up to ``at_ns``, inside the stretch from ``cursor`` labelled by ``top``."""
        productive = self.totals.get(PRODUCTIVE, 0)
        if top and _BY_PRIORITY[top] == PRODUCTIVE:
            productive += at_ns - cursor
        return productive

    def _label(self, top: int, at_ns: int) -> str:
        if top:
            return _BY_PRIORITY[top]
        if self.first_step_ns is None or at_ns < self.first_step_ns:
            return self._before_first_step
        if self.train_end_ns is not None and at_ns >= self.train_end_ns:
            return sc.BADPUT_OTHER
        return sc.BADPUT_HOST_OUTSIDE_STEPS
