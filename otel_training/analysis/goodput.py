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

import dataclasses
from collections import defaultdict
from collections.abc import Iterable

from otel_training import semconv as sc
from otel_training.analysis.badput import BUCKETS, PRODUCTIVE, STEP_SPAN_NAMES, Timeline, timeline_label
from otel_training.analysis.records import RunKey, SpanRecord
from otel_training.analysis.steps import ideal_step_time, times_step


def normalize_span_id(value: object) -> str:
    """Span ids as lowercase hex, whether they came as an int, hex or ``0x`` hex."""
    if isinstance(value, int):
        return format(value, "016x")
    text = str(value or "").strip().lower()
    return text[2:] if text.startswith("0x") else text


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
        self.checkpointed = False
        #: (start, duration) in ns of the run's first step, on the timeline steps are timed on.
        self.first_step: tuple[int, int] | None = None
        #: The checkpoint step this run restored (its first completed ``training.load_checkpoint``).
        self.restored_step: int | None = None

    def add(self, record: SpanRecord) -> None:
        name = record.name
        if name == sc.SPAN_ALERT:
            self._alert(record)
            return
        label = timeline_label(name, self.evaluation_is_productive)
        if label is not None:
            self.timeline.add(label, record.start_ns, record.end_ns, is_step=name in STEP_SPAN_NAMES)
            if name in STEP_SPAN_NAMES and times_step(name, record.attributes) and (
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

    def _alert(self, record: SpanRecord) -> None:
        attributes = record.attributes
        kind = attributes.get(sc.ALERT_KIND)
        span_id = normalize_span_id(attributes.get(sc.ALERT_SPAN_ID, ""))
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

    def fold(self, until_ns: int) -> None:
        """Settle time up to ``until_ns``, remembering the productive time at each checkpoint."""
        for checkpoint, step in sorted(self._checkpoints, key=lambda item: item[0]):
            if self.timeline.folded_until < checkpoint <= until_ns:
                self.timeline.fold(checkpoint)
            if checkpoint <= until_ns:
                self._snapshots.append((step, self.timeline.totals[PRODUCTIVE]))
                self.checkpointed = True
        self._checkpoints = [item for item in self._checkpoints if item[0] > until_ns]
        self.timeline.fold(until_ns)

    def finish(self, end_ns: int, *, failed: bool, restored_step: int | None = None,
               restored_step_end_ns: int | None = None) -> dict[str, int]:
        """Close the run at ``end_ns``; a failed run loses the progress the next run did not restore.

        ``restored_step``: the checkpoint step the next run restored. The progress kept is that up
        to the end of that step in this run (``restored_step_end_ns``, where this run has it),
        else that of the last save of this run at or before that step (a later save whose persist
        never finished was not restored, so what followed it was lost too); without a restore,
        that of the last completed save.
        """
        for since in self._stuck_since.values():
            self.timeline.add(sc.BADPUT_STUCK, since, end_ns)  # stuck until the run ended
        self._stuck_since.clear()
        if failed and restored_step_end_ns is not None and restored_step_end_ns <= end_ns:
            self.fold(restored_step_end_ns)
            self._snapshots.append((restored_step, self.timeline.totals[PRODUCTIVE]))
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


def _failed(records: list[SpanRecord], followed: bool) -> bool:
    """A run failed when it says so (error status, died alert), or was restarted before it finished training."""
    finished = False
    for record in records:
        if record.error or (record.name == sc.SPAN_ALERT and record.attributes.get(sc.ALERT_KIND) == sc.ALERT_KIND_DIED):
            return True
        finished = finished or record.name == sc.SPAN_TRAIN
    return followed and not finished


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
    by_rank: defaultdict[int, list[tuple[int, int, RunKey]]] = defaultdict(list)
    for key, run_records in by_run.items():
        start = min(record.start_ns for record in run_records)
        if 0 < key.created_ns < start:
            start = key.created_ns  # the process's creation: start-up nobody ended a span for
        end = max(record.end_ns for record in run_records)
        by_rank[key.rank].append((start, end, key))

    seconds: defaultdict[str, float] = defaultdict(float)
    runs: list[RunSummary] = []
    for rank in sorted(by_rank):
        lives = sorted(by_rank[rank], key=lambda life: (life[0], life[2].restart))
        accountants = []
        for index, (start, _end, key) in enumerate(lives):
            accountant = RunAccountant(start, evaluation_is_productive=evaluation_is_productive,
                                       after_restart=index > 0)
            for record in sorted(by_run[key], key=lambda record: record.end_ns):
                accountant.add(record)
            accountants.append(accountant)
        previous_end: int | None = None
        for index, (start, end, key) in enumerate(lives):
            failed = _failed(by_run[key], followed=index + 1 < len(lives))
            accountant = accountants[index]
            restored = accountants[index + 1].restored_step if index + 1 < len(lives) else None
            restored_end = _end_of_step(by_run[key], restored) if failed and restored is not None else None
            ideal = ideal_step_time([record.duration_s for record in by_run[key]
                                     if times_step(record.name, record.attributes)], ideal_step_time_s)
            totals_ns = with_compilation(
                accountant.finish(end, failed=failed, restored_step=restored, restored_step_end_ns=restored_end),
                accountant.first_step, ideal)
            totals = {label: ns / 1e9 for label, ns in totals_ns.items()}
            if previous_end is not None and start > previous_end:
                totals[sc.BADPUT_DOWNTIME] = totals.get(sc.BADPUT_DOWNTIME, 0.0) + (start - previous_end) / 1e9
            for label, value in totals.items():
                seconds[label] += value
            runs.append(RunSummary(key, start, end, failed, totals))
            previous_end = max(end, previous_end or end)
    return GoodputAccount(dict(seconds), runs)
