"""Goodput of one run and of a whole job across ranks and restarts.

A job's time is counted in accelerator-seconds: every rank's runs from their
first span to their last, plus the downtime between one run of a rank and the
next. Goodput is the productive share of that time. Within a run the badput
buckets come from ``badput.Timeline``; two of them need the run as a whole:

* stuck time: from the moment a watched span crossed its threshold (alert
  time − (elapsed − threshold)) until it ended, recovered or the run ended;
* wasted progress: when a run failed, the productive time after its last
  completed checkpoint save was lost, so it moves to ``wasted_progress``.

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


def normalize_span_id(value: object) -> str:
    """Span ids as lowercase hex, whether they came as an int, hex or ``0x`` hex."""
    if isinstance(value, int):
        return format(value, "016x")
    text = str(value or "").strip().lower()
    return text[2:] if text.startswith("0x") else text


class RunAccountant:
    """Classifies the time of one run, fed with its spans in the order they end."""

    def __init__(self, start_ns: int, *, evaluation_is_productive: bool = False, after_failure: bool = False) -> None:
        self.start_ns = start_ns
        self.evaluation_is_productive = evaluation_is_productive
        self.timeline = Timeline(start_ns, after_failure=after_failure)
        self._stuck_since: dict[str, int] = {}
        self._checkpoints: list[int] = []
        self._productive_at_checkpoint = 0
        self.checkpointed = False

    def add(self, record: SpanRecord) -> None:
        name = record.name
        if name == sc.SPAN_ALERT:
            self._alert(record)
            return
        label = timeline_label(name, self.evaluation_is_productive)
        if label is not None:
            self.timeline.add(label, record.start_ns, record.end_ns, is_step=name in STEP_SPAN_NAMES)
        elif name == sc.SPAN_TRAIN:
            self.timeline.train_end_ns = record.end_ns
        if name == sc.SPAN_SAVE_CHECKPOINT and not record.error:
            self._checkpoints.append(record.end_ns)
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
        for checkpoint in sorted(self._checkpoints):
            if self.timeline.folded_until < checkpoint <= until_ns:
                self.timeline.fold(checkpoint)
            if checkpoint <= until_ns:
                self._productive_at_checkpoint = self.timeline.totals[PRODUCTIVE]
                self.checkpointed = True
        self._checkpoints = [checkpoint for checkpoint in self._checkpoints if checkpoint > until_ns]
        self.timeline.fold(until_ns)

    def finish(self, end_ns: int, *, failed: bool) -> dict[str, int]:
        """Close the run at ``end_ns``; a failed run loses the progress since its last checkpoint."""
        for since in self._stuck_since.values():
            self.timeline.add(sc.BADPUT_STUCK, since, end_ns)  # stuck until the run ended
        self._stuck_since.clear()
        self.fold(end_ns)
        totals = dict(self.timeline.totals)
        if failed:
            lost = totals.get(PRODUCTIVE, 0) - self._productive_at_checkpoint
            if lost > 0:
                totals[PRODUCTIVE] -= lost
                totals[sc.BADPUT_WASTED_PROGRESS] = totals.get(sc.BADPUT_WASTED_PROGRESS, 0) + lost
        return totals


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
    def badput(self) -> dict[str, float]:
        """Seconds by badput bucket, every bucket present, in report order."""
        return {bucket: self.seconds.get(bucket, 0.0) for bucket in BUCKETS}

    @property
    def restarts(self) -> int:
        return max((run.key.restart for run in self.runs), default=0)


def _failed(records: list[SpanRecord], followed: bool) -> bool:
    """A run failed when it says so (error status, died alert), or was restarted before it finished training."""
    finished = False
    for record in records:
        if record.error or (record.name == sc.SPAN_ALERT and record.attributes.get(sc.ALERT_KIND) == sc.ALERT_KIND_DIED):
            return True
        finished = finished or record.name == sc.SPAN_TRAIN
    return followed and not finished


def account(records: Iterable[SpanRecord], *, evaluation_is_productive: bool = False) -> GoodputAccount:
    """Goodput and badput of the trainer spans in ``records``, across all ranks and restarts."""
    by_run: defaultdict[RunKey, list[SpanRecord]] = defaultdict(list)
    for record in records:
        if record.is_trainer:
            by_run[record.run].append(record)
    by_rank: defaultdict[int, list[tuple[int, int, RunKey]]] = defaultdict(list)
    for key, run_records in by_run.items():
        start = min(record.start_ns for record in run_records)
        end = max(record.end_ns for record in run_records)
        by_rank[key.rank].append((start, end, key))

    seconds: defaultdict[str, float] = defaultdict(float)
    runs: list[RunSummary] = []
    for rank in sorted(by_rank):
        lives = sorted(by_rank[rank], key=lambda life: (life[0], life[2].restart))
        previous_failed = False
        previous_end: int | None = None
        for index, (start, end, key) in enumerate(lives):
            run_records = sorted(by_run[key], key=lambda record: record.end_ns)
            failed = _failed(run_records, followed=index + 1 < len(lives))
            accountant = RunAccountant(
                start, evaluation_is_productive=evaluation_is_productive, after_failure=previous_failed
            )
            for record in run_records:
                accountant.add(record)
            totals = {label: ns / 1e9 for label, ns in accountant.finish(end, failed=failed).items()}
            if previous_end is not None and start > previous_end:
                totals[sc.BADPUT_DOWNTIME] = totals.get(sc.BADPUT_DOWNTIME, 0.0) + (start - previous_end) / 1e9
            for label, value in totals.items():
                seconds[label] += value
            runs.append(RunSummary(key, start, end, failed, totals))
            previous_failed, previous_end = failed, max(end, previous_end or end)
    return GoodputAccount(dict(seconds), runs)
