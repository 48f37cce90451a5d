"""One trace file into a ``Part`` in a single pass, holding what is still open, not what was read.

The in-memory path sorts each life's spans by end and folds its timeline once.
Here each life's spans go through a small buffer sorted by end (files are
written nearly in that order: a batch processor exports spans as they end),
are fed to the same ``RunAccountant`` in the same order, and its timeline is
folded up to a point no span still to come can reach back to: ``LAG_NS``
before the latest end fed, and never past a span buffered or a stuck stretch
still open. The productive time at the end of every numbered step is marked
as it is folded, which is what a failed life's wasted progress needs once the
next life says which checkpoint it restored.

Should a life break those assumptions (a span written further out of order
than ``REORDER_NS``, a labelled span longer than ``LAG_NS`` ending after its
start was folded), the result would no longer be exact: its rank is returned
unfinished, and the caller recomputes that rank from its spans in memory.

A span read before (the same trace and span id: a batch exported twice, a spool
replayed) is dropped as it is read, before it counts anywhere (``dedupe.py``).
"""

from __future__ import annotations

import bisect
import gc
from array import array
from collections import defaultdict
from collections.abc import Iterator, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any

from otel_training import semconv as sc
from otel_training.analysis import LABELLED_SPAN_NAMES, RunKey, SpanRecord, span_label
from otel_training.analysis.goodput import Life, RunAccountant
from otel_training.analysis.gpu import ERRORS_KEY, step_errors, step_state
from otel_training.report.dedupe import SeenSpans
from otel_training.report.digest import Part, StepColumns, alert_of, rank_part
from otel_training.report.gpu_steps import GpuSteps
from otel_training.report.reader import FileScan, Problem
from otel_training.report.spans import Span, convert, json_loads

#: How far out of end order spans may be written (one batch of a slow thread, an alert after its step).
REORDER_NS = 60 * 10**9
#: How long before the latest end a labelled span may have started and still be counted exactly.
LAG_NS = 30 * 60 * 10**9
#: Spans a life buffers before they are sorted, fed and folded.
SETTLE_EVERY = 4096
#: Spans the accounting reads in end order; the others only count, and set a life's start and end.
ACCOUNTED = LABELLED_SPAN_NAMES | {sc.SPAN_TRAIN, sc.SPAN_ALERT}
_START, _END = itemgetter(1), itemgetter(2)
#: ``spans.convert`` by the name ``bench/bench_report_engines.py`` imports.
_convert = convert


class _Life(Life):
    """A life read as a stream: its steps' ends, and the productive time at each once folded."""

    def __init__(self, run: _Run) -> None:
        accountant = run.accountant
        assert accountant is not None
        super().__init__(run.key, run.start_ns(), run.max_end, accountant, failed_itself=run.failed_itself,
                         trained=run.trained, step_durations=run.durations)
        self._run = run

    def end_of_step(self, step: int) -> tuple[int | None, int | None]:
        run = self._run
        best = None
        for index, number in enumerate(run.mark_steps):
            if number == step and (best is None or run.mark_ends[index] >= run.mark_ends[best]):
                best = index
        if best is None:
            return None, None
        return run.mark_ends[best], run.mark_productive[best] if best < len(run.mark_productive) else None


class _Run:
    """One life of a rank being read."""

    def __init__(self, key: RunKey, evaluation_is_productive: bool) -> None:
        self.key = key
        self.evaluation_is_productive = evaluation_is_productive
        self.buffer: list[tuple[int, int, SpanRecord]] = []
        self.seq = 0
        self.min_start = 2**63
        self.max_end = 0
        self.accountant: RunAccountant | None = None
        self.fed_end = 0
        #: The latest end among the spans buffered so far (spans ending REORDER_NS before it are fed).
        self.pushed_end = 0
        self.settle_at = SETTLE_EVERY
        self.broken: str | None = None
        self.failed_itself = False
        self.trained = False
        self.durations = array("d")
        self.mark_steps = array("q")
        self.mark_ends = array("q")
        self.mark_productive = array("q")
        #: Names of spans not accounted that were read, and those a stuck alert made accounted.
        self.skipped_names: set[str] = set()
        self.watched_names: set[str] = set()

    def start_ns(self) -> int:
        created = self.key.created_ns
        return created if 0 < created < self.min_start else self.min_start

    def push(self, record: SpanRecord) -> None:
        end = record.end_ns
        self.buffer.append((end, self.seq, record))
        self.seq += 1
        if end > self.pushed_end:
            self.pushed_end = end
        if len(self.buffer) >= self.settle_at:
            self.settle(final=False)
            # Spans less than REORDER_NS older than the newest stay: past SETTLE_EVERY of them (fast steps), the
            # next settle waits for the buffer to double, or every push would sort it again (130-230 us a span).
            self.settle_at = max(SETTLE_EVERY, 2 * len(self.buffer))

    def settle(self, *, final: bool) -> None:
        buffer = self.buffer
        buffer.sort()  # by end, then as read (no two share a sequence number)
        release = len(buffer) if final else bisect.bisect_right(buffer, self.pushed_end - REORDER_NS,
                                                                 key=lambda item: item[0])
        for _, _, record in buffer[:release]:
            self._feed(record)
        del buffer[:release]
        if not final and self.accountant is not None and not self.broken:
            self._fold()

    def _feed(self, record: SpanRecord) -> None:
        if self.broken:
            return
        end, name = record.end_ns, record.name
        if end < self.fed_end:
            self.broken = "spans further out of order than the reorder window"
            return
        self.fed_end = end
        accountant = self.accountant
        if accountant is None:
            accountant = self.accountant = RunAccountant(self.start_ns(),
                                                         evaluation_is_productive=self.evaluation_is_productive)
        timeline = accountant.timeline
        folded = timeline.folded_until
        if record.start_ns < folded and name in LABELLED_SPAN_NAMES:
            self.broken = f"a {name} span started before the time already settled"
            return
        train_end = timeline.train_end_ns
        accountant.add(record)
        if (train_end is not None or name == sc.SPAN_TRAIN) and timeline.train_end_ns != train_end and min(
                value for value in (train_end, timeline.train_end_ns, 2**63) if value is not None) < folded:
            self.broken = "the end of training moved into the time already settled"
        if name == sc.SPAN_ALERT:
            stuck = accountant.stuck_since_ns
            if stuck is not None and stuck < folded:
                self.broken = "a stuck stretch starts in the time already settled"
        elif (name == sc.SPAN_DEVICE_STEP or name == sc.SPAN_STEP) and _timed(name, record.attributes):
            number = _step_number(record.attributes.get(sc.STEP))
            if number is not None:
                self.mark_steps.append(number)
                self.mark_ends.append(end)

    def _fold(self) -> None:
        accountant = self.accountant
        assert accountant is not None
        until = self.fed_end - LAG_NS
        if self.buffer:
            until = min(until, *(record.start_ns for _, _, record in self.buffer))
        stuck = accountant.stuck_since_ns
        if stuck is not None:
            until = min(until, stuck)
        if until <= accountant.timeline.folded_until:
            return
        done = len(self.mark_productive)
        upto = bisect.bisect_right(self.mark_ends, until, done)
        self.mark_productive.extend(accountant.fold(until, self.mark_ends[done:upto]))

    def finish(self) -> _Life | None:
        """The life, or None where it could not be read exactly as a stream (``broken`` says why)."""
        self.settle(final=True)
        if self.accountant is None:
            self.accountant = RunAccountant(self.start_ns(), evaluation_is_productive=self.evaluation_is_productive)
        if self.accountant.start_ns != self.start_ns():
            self.broken = self.broken or "a span started before the time already settled"
        return None if self.broken else _Life(self)


def _timed(name: str, attributes: dict[str, Any]) -> bool:
    return name == sc.SPAN_DEVICE_STEP or (name == sc.SPAN_STEP and not attributes.get(sc.STEP_DEVICE_TIMED))


def _step_number(value: object) -> int | None:
    """A step attribute as the int it equals (``==`` is how a restored step is looked up), if any."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and -(2**63) < value < 2**63:
        return int(value)
    return None


def digest_file(path: Path, **options: Any) -> tuple[Part, list[Problem]]:
    """What one file contributes to the report, and its problems (``options``: ``digest_files``'s)."""
    return digest_files([path], **options)


def digest_files(paths: Sequence[Path], *, window: int, evaluation_is_productive: bool = False,
                 job_id: str | None = None, progress: Any = None) -> tuple[Part, list[Problem]]:
    """What files read as one stream, in this order, contribute to the report, and their problems: a span
    read in an earlier file is dropped from a later one, a life split over them is read in one piece."""
    collecting = gc.isenabled()
    gc.disable()  # millions of short-lived objects, no cycles: collections would only cost time
    try:
        return _digest(paths, window, evaluation_is_productive, job_id, progress)
    finally:
        if collecting:
            gc.enable()


def _digest(paths: Sequence[Path], window: int, evaluation_is_productive: bool, job_id: str | None,
            progress: Any) -> tuple[Part, list[Problem]]:
    part = Part()
    runs: dict[RunKey, _Run] = {}
    steps: defaultdict[int, StepColumns] = defaultdict(StepColumns)
    gpu: defaultdict[int, GpuSteps] = defaultdict(GpuSteps)
    loads = json_loads()
    scans: list[FileScan[list[tuple[RunKey, str, str, list[Span]]]]] = []

    def history() -> Iterator[tuple[RunKey, list[Span]]]:
        """What was read before the line being read: the files before its file, and its file up to it."""
        for earlier in scans:
            until = earlier.offset if earlier is scans[-1] else None
            for resources in FileScan(earlier.path, lambda request: convert(request, None, job_id), loads=loads,
                                      until=until):
                yield from ((key, spans) for key, _, _, spans in resources)

    seen = SeenSpans(history)
    problems: list[Problem] = []
    for path in paths:
        dropped = seen.dropped
        scan = FileScan(path, lambda request: convert(request, seen, job_id), progress, loads=loads)
        scans.append(scan)
        _read(scan, part, runs, steps, gpu, evaluation_is_productive)
        problems.extend(scan.problems)
        if seen.dropped > dropped:
            part.duplicates[str(path)] = seen.dropped - dropped
    lives: defaultdict[int, list[Life]] = defaultdict(list)
    for run in runs.values():
        life = run.finish()
        if life is None:
            part.unfinished.add(run.key.rank)
        else:
            lives[run.key.rank].append(life)
    for rank, rank_lives in lives.items():
        if rank not in part.unfinished:
            part.ranks[rank] = rank_part(rank, rank_lives, steps[rank], window, gpu.get(rank))
    return part, problems


def _read(scan: FileScan[list[tuple[RunKey, str, str, list[Span]]]], part: Part, runs: dict[RunKey, _Run],
          steps: defaultdict[int, StepColumns], gpu: defaultdict[int, GpuSteps], evaluation_is_productive: bool) -> None:
    """Every span of a file into ``part``, its lives (``runs``), its ranks' ``steps`` and their ``gpu`` states."""
    intervals = part.intervals
    labels = {name: span_label(name, evaluation_is_productive) for name in LABELLED_SPAN_NAMES}
    accounted, alert_name, step, device_step = ACCOUNTED, sc.SPAN_ALERT, sc.SPAN_STEP, sc.SPAN_DEVICE_STEP
    device_timed, collective_seq, hang = sc.STEP_DEVICE_TIMED, sc.COLLECTIVE_SEQ, part.hang
    gpu_clock, gpu_throttled = sc.GPU_SM_CLOCK_MIN_MHZ, sc.GPU_THROTTLED
    for resources in scan:
        for key, service, role, spans in resources:
            part.resources.add(key)
            if key.job_id:
                part.job_ids.add(key.job_id)
            if service:
                part.services.add(service)
            rank, restart = key.rank, key.restart
            run = None
            if role == sc.ROLE_TRAINER:
                run = runs.get(key)
                if run is None:
                    run = runs[key] = _Run(key, evaluation_is_productive)
            if not spans:
                continue
            lo, hi = min(map(_START, spans)), max(map(_END, spans))
            if key.job_id:
                part.job_ends[key.job_id] = max(hi, part.job_ends.get(key.job_id, 0))
            part.span_count += len(spans) - 1
            part.span(lo, hi)
            if role == sc.ROLE_TRAINER:
                hang.seen(key, hi)  # a rank of its run (one silent during a hang is named), and how far it goes
            if run is not None:  # before any span is fed: its life's start is the earliest read
                run.min_start = min(run.min_start, lo)
                run.max_end = max(run.max_end, hi)
            labelled: defaultdict[str, list[tuple[int, int]]] = defaultdict(list)
            for name, start, end, span_id, error, values, _ in spans:
                label = labels.get(name)
                # Most spans of a job (substeps, phases, the user's own) only count: of them, only a
                # failure and a stuck alert's watched name are read.
                read = label is not None or values is not None or name in accounted
                if read:
                    if label is not None:
                        labelled[label].append((start, end))
                    if name == alert_name:
                        part.alerts.append(alert_of(rank, restart, start, values or {}))
                        hang.alert(key, start, values or {})
                    elif name == step and values and collective_seq in values:
                        hang.step(key, end, values)
                if run is None:
                    continue
                if error:
                    run.failed_itself = True
                if read:
                    if name == step and values:
                        part.data_wait(values.get(sc.STEP_DATA_WAIT_S))
                    if values is not None and (name == device_step or
                                               (name == step and not values.get(device_timed))):
                        rank_steps = steps[rank]
                        rank_steps.add(start, end, values.get(sc.STEP), restart)
                        run.durations.append((end - start) / 1e9 if end > start else 0.0)
                        if gpu_clock in values or gpu_throttled in values:  # the drain sampled the GPU
                            state = step_state(values)
                            if state is not None:
                                gpu[rank].add(len(rank_steps) - 1, state)
                    if values and ERRORS_KEY in values:
                        part.gpu_errors.add(rank, step_errors(values))
                if name in accounted or name in run.watched_names:
                    run.push(SpanRecord(name, start, end, key, values or {}, "", span_id, "", error, service, role))
                    if name == alert_name:
                        _alert_read(run, values or {})
                else:
                    run.skipped_names.add(name)
            for label, items in labelled.items():
                intervals.extend(rank, label, items)


def _alert_read(run: _Run, values: dict[str, Any]) -> None:
    kind = values.get(sc.ALERT_KIND)
    if kind == sc.ALERT_KIND_DIED:
        run.failed_itself = True
    watched = values.get(sc.ALERT_SPAN_NAME)
    if kind == sc.ALERT_KIND_STUCK and watched not in ACCOUNTED:
        # The span it watches ends its stuck stretch: from now on it is read in end order too.
        if watched in run.skipped_names or not isinstance(watched, str):
            run.broken = run.broken or "a stuck alert on a span of a name read before it"
        else:
            run.watched_names.add(watched)
