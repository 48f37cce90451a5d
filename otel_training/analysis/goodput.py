"""Goodput of one run and of a whole job across ranks and restarts.

A job's time is counted in accelerator-seconds: every rank's runs from their
first span to their last, plus the downtime between one run of a rank and the
next. Goodput is the productive share of that time. Within a run the badput
buckets come from ``badput.Timeline``; three of them need more than a sweep:

* stuck time: from the moment a watched span crossed its threshold (alert
  time − (elapsed − threshold)) until it ended, recovered or the run ended;
* wasted progress: when a run failed, the productive time after the
  checkpoint the next run *restored* (its ``training.load_checkpoint`` says
  which step) was lost; without a restore, after its last completed save;
* compilation: the first step's excess over the ideal step time (compilation,
  warm-up, autotuning), moved out of productive time, as ml-goodput-measurement
  moves it into start-up.

``RunAccountant`` consumes records in the order spans end (the order a live
span processor sees them), which is what lets the live processor and the
report share it.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Sequence

from otel_training import semconv as sc
from otel_training.analysis.badput import (
    BUCKETS,
    LABELLED_SPAN_NAMES,
    PRODUCTIVE,
    STEP_SPAN_NAMES,
    Timeline,
    timeline_label,
)
from otel_training.analysis.records import RunKey, SpanRecord
from otel_training.analysis.steps import ideal_step_time, times_step


def normalize_span_id(value: object) -> str:
    """Span ids as lowercase hex, whether they came as an int, hex or ``0x`` hex."""
    if isinstance(value, int):
        return format(value, "016x")
    text = str(value or "").strip().lower()
    return text[2:] if text.startswith("0x") else text


#: ``timeline_label`` of every labelled span name, without and with evaluation counted as productive.
_LABELS: dict[bool, dict[str, str]] = {
    productive: {name: label for name in LABELLED_SPAN_NAMES
                 if (label := timeline_label(name, productive)) is not None}
    for productive in (False, True)
}


class RunAccountant:
    """Classifies the time of one run, fed with its spans in the order they end."""

    def __init__(self, start_ns: int, *, evaluation_is_productive: bool = False, after_restart: bool = False) -> None:
        self.start_ns = start_ns
        self.evaluation_is_productive = evaluation_is_productive
        self.timeline = Timeline(start_ns, after_restart=after_restart)
        self._stuck_since: dict[str, int] = {}
        # Completed saves not yet folded: (end, checkpoint step); then the productive time at each.
        self._checkpoints: list[tuple[int, int | None]] = []
        self._snapshots: list[tuple[int | None, int]] = []
        self._snapshot_times: list[int] = []
        self.checkpointed = False
        #: (start, duration) in ns of the run's first step, on the timeline steps are timed on.
        self.first_step: tuple[int, int] | None = None
        #: The checkpoint step this run restored (its first completed ``training.load_checkpoint``).
        self.restored_step: int | None = None
        #: A span name's timeline label (a report feeds millions of spans: one lookup each).
        self._labels = _LABELS[bool(evaluation_is_productive)]

    def add(self, record: SpanRecord) -> None:
        name = record.name
        if name == sc.SPAN_ALERT:
            self._alert(record)
            return
        label = self._labels.get(name)
        if label is not None:
            is_step = name in STEP_SPAN_NAMES
            self.timeline.add(label, record.start_ns, record.end_ns, is_step=is_step)
            if is_step and times_step(name, record.attributes) and (
                    self.first_step is None or record.start_ns < self.first_step[0]):
                self.first_step = (record.start_ns, record.end_ns - record.start_ns)
        elif name == sc.SPAN_TRAIN:
            self.timeline.train_end_ns = record.end_ns
        if name == sc.SPAN_SAVE_CHECKPOINT and not record.error:
            self._checkpoints.append((record.end_ns, _step_of(record)))
        elif name == sc.SPAN_LOAD_CHECKPOINT and not record.error and self.restored_step is None:
            self.restored_step = _step_of(record)
        if self._stuck_since and record.span_id:
            since = self._stuck_since.pop(normalize_span_id(record.span_id), None)
            if since is not None:
                self.timeline.add(sc.BADPUT_STUCK, since, record.end_ns)

    @property
    def stuck_since_ns(self) -> int | None:
        """The earliest start of a stuck stretch not yet ended: time from there on is not settled."""
        return min(self._stuck_since.values(), default=None)

    def _alert(self, record: SpanRecord) -> None:
        attributes = record.attributes
        kind = attributes.get(sc.ALERT_KIND)
        span_id = normalize_span_id(attributes.get(sc.ALERT_SPAN_ID, ""))
        since: int | None  # a start here; below, the start a recovery pops, if any
        if kind == sc.ALERT_KIND_STUCK:
            since = record.start_ns
            try:
                past_threshold = float(attributes[sc.ALERT_ELAPSED_S]) - float(attributes[sc.ALERT_THRESHOLD_S])
                since -= int(max(0.0, past_threshold) * 1e9)
            except (KeyError, TypeError, ValueError):
                pass
            # Repeated (escalated) alerts for one span keep the earliest start.
            self._stuck_since[span_id] = min(since, self._stuck_since.get(span_id, since))
        elif kind == sc.ALERT_KIND_RECOVERED:
            since = self._stuck_since.pop(span_id, None)
            if since is not None:
                self.timeline.add(sc.BADPUT_STUCK, since, record.start_ns)

    def fold(self, until_ns: int, marks: Sequence[int] = ()) -> list[int]:
        """Settle time up to ``until_ns``, remembering the productive time at each checkpoint.

        ``marks`` (ascending, after the time already settled): returns the productive ns at each.
        """
        found: list[int] = []
        for checkpoint, step in sorted(self._checkpoints, key=lambda item: item[0]):
            if self.timeline.folded_until < checkpoint <= until_ns:
                upto = bisect.bisect_right(marks, checkpoint, len(found))
                found += self.timeline.fold(checkpoint, marks[len(found):upto])
            if checkpoint <= until_ns:
                self._snapshots.append((step, self.timeline.totals[PRODUCTIVE]))
                self._snapshot_times.append(checkpoint)
                self.checkpointed = True
        self._checkpoints = [item for item in self._checkpoints if item[0] > until_ns]
        found += self.timeline.fold(until_ns, marks[len(found):])
        return found

    def finish(self, end_ns: int, *, failed: bool, restored_step: int | None = None,
               restored_step_end_ns: int | None = None, restored_productive_ns: int | None = None) -> dict[str, int]:
        """Close the run at ``end_ns``; a failed run loses the progress the next run did not restore.

        ``restored_step``: the checkpoint step the next run restored. The progress kept is that up
        to the end of that step in this run (``restored_step_end_ns``, where this run has it),
        else that of the last save of this run at or before that step (a later save whose persist
        never finished was not restored, so what followed it was lost too); without a restore,
        that of the last completed save.

        ``restored_productive_ns``: the productive ns at ``restored_step_end_ns`` where this run was
        already folded past it (a reader that folds as it streams marks every step's end).
        """
        for since in self._stuck_since.values():
            self.timeline.add(sc.BADPUT_STUCK, since, end_ns)  # stuck until the run ended
        self._stuck_since.clear()
        if failed and restored_step_end_ns is not None and restored_step_end_ns <= end_ns:
            if restored_productive_ns is not None and restored_step_end_ns < self.timeline.folded_until:
                at = bisect.bisect_right(self._snapshot_times, restored_step_end_ns)
                self._snapshots.insert(at, (restored_step, restored_productive_ns))
                self._snapshot_times.insert(at, restored_step_end_ns)
            else:
                self.fold(restored_step_end_ns)
                self._snapshots.append((restored_step, self.timeline.totals[PRODUCTIVE]))
                self._snapshot_times.append(restored_step_end_ns)
        self.fold(end_ns)
        totals = dict(self.timeline.totals)
        if failed:
            lost = totals.get(PRODUCTIVE, 0) - self._kept(restored_step)
            if lost > 0:
                totals[PRODUCTIVE] -= lost
                totals[sc.BADPUT_WASTED_PROGRESS] = totals.get(sc.BADPUT_WASTED_PROGRESS, 0) + lost
        return totals

    def _kept(self, restored_step: int | None) -> int:
        """Productive ns of this run that a restart kept."""
        if restored_step is None:
            return self._snapshots[-1][1] if self._snapshots else 0
        kept = [productive for step, productive in self._snapshots if step is not None and step <= restored_step]
        return kept[-1] if kept else 0


@dataclasses.dataclass
class RunSummary:
    """One run of one rank: when it ran, whether it failed, and its time by label (seconds)."""

    key: RunKey
    start_ns: int
    end_ns: int
    failed: bool
    seconds: dict[str, float]


@dataclasses.dataclass
class GoodputAccount:
    """A job's accelerator time by label, summed over ranks and runs, in seconds."""

    seconds: dict[str, float]
    runs: list[RunSummary]

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())

    @property
    def productive_s(self) -> float:
        return self.seconds.get(PRODUCTIVE, 0.0)

    @property
    def goodput(self) -> float | None:
        """Productive share of the job's accelerator time, or None for an empty job."""
        total = self.total_s
        return self.productive_s / total if total > 0 else None

    @property
    def training_goodput(self) -> float | None:
        """Goodput of the time after start-up: without ``program_startup`` and ``compilation``.

        What a loop itself achieves (the figure to compare with a step-time benchmark); the
        job's ``goodput`` also pays for starting up.
        """
        total = self.total_s - self.seconds.get(sc.BADPUT_PROGRAM_STARTUP, 0.0) - self.seconds.get(
            sc.BADPUT_COMPILATION, 0.0)
        return self.productive_s / total if total > 0 else None

    @property
    def badput(self) -> dict[str, float]:
        """Seconds by badput bucket, every bucket present, in report order."""
        return {bucket: self.seconds.get(bucket, 0.0) for bucket in BUCKETS}

    @property
    def restarts(self) -> int:
        return max((run.key.restart for run in self.runs), default=0)


def _step_of(record: SpanRecord) -> int | None:
    step = record.attributes.get(sc.CHECKPOINT_STEP)
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _end_of_step(records: list[SpanRecord], step: int) -> int | None:
    """When step ``step`` ended in these records (its timed span), or None if they do not have it."""
    ends = [record.end_ns for record in records
            if record.attributes.get(sc.STEP) == step and times_step(record.name, record.attributes)]
    return max(ends) if ends else None


def with_compilation(totals: dict[str, int], first_step: tuple[int, int] | None,
                     ideal_s: float | None) -> dict[str, int]:
    """``totals`` (ns by label) with the first step's excess over the ideal moved to compilation."""
    if first_step is None or ideal_s is None:
        return totals
    excess = min(max(0, first_step[1] - int(ideal_s * 1e9)), totals.get(PRODUCTIVE, 0))
    if excess <= 0:
        return totals
    moved = dict(totals)
    moved[PRODUCTIVE] -= excess
    moved[sc.BADPUT_COMPILATION] = moved.get(sc.BADPUT_COMPILATION, 0) + excess
    return moved


class Life:
    """One life of a rank as finishing it needs it, however its spans were read.

    Whether a life failed, which checkpoint the next one restored and how much of its
    progress that kept are only known once all lives of the rank are: ``rank_runs`` settles
    them, for the in-memory ``account`` and for a reader that streams alike.
    """

    def __init__(self, key: RunKey, start_ns: int, end_ns: int, accountant: RunAccountant, *,
                 failed_itself: bool, trained: bool, step_durations: Sequence[float]) -> None:
        self.key = key
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.accountant = accountant
        #: An error status or a died alert.
        self.failed_itself = failed_itself
        #: Its training loop ended (a ``training.train`` span).
        self.trained = trained
        self.step_durations = step_durations

    def end_of_step(self, step: int) -> tuple[int | None, int | None]:
        """When step ``step`` ended in this life (its timed span), and the productive ns then if already folded."""
        return None, None

    def finish(self, *, after_restart: bool, failed: bool, restored_step: int | None) -> dict[str, int]:
        """Ns by label of this life (``restored_step``: the checkpoint step the next life restored)."""
        restored_end, productive = (None, None) if not failed or restored_step is None \
            else self.end_of_step(restored_step)
        totals = self.accountant.finish(self.end_ns, failed=failed, restored_step=restored_step,
                                        restored_step_end_ns=restored_end, restored_productive_ns=productive)
        if after_restart:  # time before its first step is recovery, not start-up (same place in the dict)
            totals = {sc.BADPUT_RECOVERY if label == sc.BADPUT_PROGRAM_STARTUP else label: ns
                      for label, ns in totals.items()}
        return totals


class _RecordsLife(Life):
    def __init__(self, key: RunKey, records: list[SpanRecord], evaluation_is_productive: bool) -> None:
        start = min(record.start_ns for record in records)
        if 0 < key.created_ns < start:
            start = key.created_ns  # the process's creation: start-up nobody ended a span for
        accountant = RunAccountant(start, evaluation_is_productive=evaluation_is_productive)
        failed_itself = trained = False
        for record in sorted(records, key=lambda record: record.end_ns):
            accountant.add(record)
            failed_itself = failed_itself or record.error or (
                record.name == sc.SPAN_ALERT and record.attributes.get(sc.ALERT_KIND) == sc.ALERT_KIND_DIED)
            trained = trained or record.name == sc.SPAN_TRAIN
        super().__init__(key, start, max(record.end_ns for record in records), accountant,
                         failed_itself=failed_itself, trained=trained,
                         step_durations=[record.duration_s for record in records
                                         if times_step(record.name, record.attributes)])
        self._records = records

    def end_of_step(self, step: int) -> tuple[int | None, int | None]:
        return _end_of_step(self._records, step), None


def rank_runs(lives: Iterable[Life], ideal_step_time_s: float | None = None) -> list[RunSummary]:
    """The runs of one rank, its lives in the order they ran, each finished knowing the next.

    Compilation is each life's first step's excess over that life's own ideal step time
    (``ideal_step_time_s`` when given).
    """
    ordered = sorted(lives, key=lambda life: (life.start_ns, life.key.restart))
    runs: list[RunSummary] = []
    previous_end: int | None = None
    for index, life in enumerate(ordered):
        following = ordered[index + 1] if index + 1 < len(ordered) else None
        # A run failed when it says so, or was restarted before it finished training.
        failed = life.failed_itself or (following is not None and not life.trained)
        restored = following.accountant.restored_step if following is not None else None
        ideal = ideal_step_time(life.step_durations, ideal_step_time_s)
        totals_ns = with_compilation(life.finish(after_restart=index > 0, failed=failed, restored_step=restored),
                                     life.accountant.first_step, ideal)
        totals = {label: ns / 1e9 for label, ns in totals_ns.items()}
        if previous_end is not None and life.start_ns > previous_end:
            totals[sc.BADPUT_DOWNTIME] = totals.get(sc.BADPUT_DOWNTIME, 0.0) + (life.start_ns - previous_end) / 1e9
        runs.append(RunSummary(life.key, life.start_ns, life.end_ns, failed, totals))
        previous_end = max(life.end_ns, previous_end or life.end_ns)
    return runs


def job_account(runs_by_rank: Iterable[Sequence[RunSummary]]) -> GoodputAccount:
    """The job's account from each rank's runs, summed rank by rank in the order given."""
    seconds: defaultdict[str, float] = defaultdict(float)
    runs: list[RunSummary] = []
    for rank_runs_ in runs_by_rank:
        for run in rank_runs_:
            for label, value in run.seconds.items():
                seconds[label] += value
            runs.append(run)
    return GoodputAccount(dict(seconds), runs)


def account(records: Iterable[SpanRecord], *, evaluation_is_productive: bool = False,
            ideal_step_time_s: float | None = None) -> GoodputAccount:
    """Goodput and badput of the trainer spans in ``records``, across all ranks and restarts.

    Compilation is each life's first step's excess over that life's own ideal step time
    (``ideal_step_time_s`` when given): the same steps the live processor of that life sees, and
    a rank that is slow throughout is a straggler, not compiling.
    """
    by_run: defaultdict[RunKey, list[SpanRecord]] = defaultdict(list)
    for record in records:
        if record.is_trainer:
            by_run[record.run].append(record)
    by_rank: defaultdict[int, list[Life]] = defaultdict(list)
    for key, run_records in by_run.items():
        by_rank[key.rank].append(_RecordsLife(key, run_records, evaluation_is_productive))
    return job_account(rank_runs(by_rank[rank], ideal_step_time_s) for rank in sorted(by_rank))
