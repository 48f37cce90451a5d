"""The job-level hang verdict: which rank is the culprit, and in which collective.

When a distributed job hangs, every rank stops and every rank's stuck detector
fires. Each rank knows only its own side: the last collective it entered on
each process group and the last it knows completed (``training.collective.*``
on its step spans, stuck alerts and gauges). Compared across the ranks of one
job, they answer the question on call:

* a rank that has **not entered** the collective the others wait in (its
  sequence number lags theirs) is the culprit, stuck in data loading or
  compute (its stuck alert carries the stacks);
* a rank that entered a **different** collective at the same sequence number
  (another op, another step) skipped or added one: an unmatched collective;
* a rank with **no heartbeat** (dead or frozen) is the culprit of the ranks
  waiting for it;
* when every rank waits in the same collective, or every rank is stuck at the
  same point outside one, there is **no single culprit** (network, switch,
  shared storage).

The same rules run live as Prometheus rules (collector-config/alert-rules.yml);
this module is the offline one, a pure function over records, used by the
report. ``render`` turns a verdict into the lines the report prints.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from otel_training import semconv as sc
from otel_training.analysis.records import RunKey, SpanRecord

#: Steps of each rank shown in the timeline around the hang.
TIMELINE_STEPS = 3


@dataclasses.dataclass(frozen=True)
class GroupView:
    """One rank's view of one process group."""

    group: str
    entered: int
    completed: int
    op: str = ""
    step: int | None = None
    wait_s: float = 0.0

    @property
    def pending(self) -> bool:
        return self.entered > self.completed


@dataclasses.dataclass(frozen=True)
class RankView:
    """One rank at the moment of the verdict."""

    rank: int
    groups: Mapping[str, GroupView] = dataclasses.field(default_factory=dict)
    #: Its heartbeat is fresh (live), or it has not been reported dead (offline).
    alive: bool = True
    #: The watchdog reported it died.
    died: bool = False
    #: Its stuck detector reported a step past its threshold that has not recovered.
    stuck: bool = False


@dataclasses.dataclass(frozen=True)
class Culprit:
    rank: int
    reason: str
    group: str = ""
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class Verdict:
    """``hung`` False: nothing to say. Else ``culprits``, or ``no_single_culprit``."""

    hung: bool
    culprits: tuple[Culprit, ...] = ()
    no_single_culprit: bool = False
    #: The collective the others wait in (group, sequence number, op), when there is one.
    group: str | None = None
    seq: int | None = None
    op: str | None = None
    #: Waiting rank -> the culprit ranks it waits on.
    waiting: Mapping[int, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    summary: str = ""


def verdict(ranks: Iterable[RankView]) -> Verdict:
    """The verdict over the ranks of one job (one launch attempt)."""
    ranks = sorted(ranks, key=lambda r: r.rank)
    silent = [r for r in ranks if r.died or not r.alive]
    live = [r for r in ranks if not (r.died or not r.alive)]
    waiting_anywhere = any(g.pending for r in live for g in r.groups.values())
    if not (any(r.stuck for r in ranks) or any(r.died for r in ranks) or (silent and waiting_anywhere)):
        return Verdict(hung=False, summary="no hang: no rank is stuck or dead")
    culprits: list[Culprit] = [
        Culprit(r.rank, sc.HANG_REASON_NO_HEARTBEAT, detail="died" if r.died else "no heartbeat (dead or frozen)")
        for r in silent
    ]
    best: tuple[int, str, int, str] | None = None  # (waiters, group, seq, op)
    for group in sorted({name for r in live for name in r.groups}):
        views = {r.rank: r.groups[group] for r in live if group in r.groups}
        top = max(v.entered for v in views.values())
        at_top = {rank: v for rank, v in views.items() if v.entered == top}
        waiters = [rank for rank, v in at_top.items() if v.pending]
        if not waiters:
            continue
        ops = Counter(v.op for v in at_top.values())
        majority = _majority(ops, at_top)
        if best is None or len(waiters) > best[0]:
            best = (len(waiters), group, top, majority)
        for rank, v in views.items():
            if v.entered < top:
                culprits.append(Culprit(rank, sc.HANG_REASON_NOT_ENTERED, group, (
                    f"last entered {v.op or '?'} #{v.entered}{_at_step(v)}, completed #{v.completed}; has not entered "
                    f"{majority} #{top} on group {group}")))
            elif v.op != majority:
                others = sorted(r for r, o in at_top.items() if o.op == majority)
                culprits.append(Culprit(rank, sc.HANG_REASON_MISMATCH, group, (
                    f"entered {v.op or '?'} #{top}{_at_step(v)} where rank(s) {_ranks(others)} entered {majority} "
                    f"#{top}{_at_step(at_top[others[0]])} on group {group}")))
    culprit_ranks = tuple(sorted({c.rank for c in culprits}))
    group, seq, op = (best[1], best[2], best[3]) if best is not None else (None, None, None)
    if culprit_ranks:
        waiting = {r.rank: culprit_ranks for r in live
                   if r.rank not in culprit_ranks and any(g.pending for g in r.groups.values())}
        summary = "; ".join(f"rank {c.rank} ({c.reason}: {c.detail})" for c in culprits)
        return Verdict(True, tuple(culprits), False, group, seq, op, waiting, f"culprit {summary}")
    if best is not None:
        summary = (f"no single culprit: every rank waits in {op} #{seq} on group {group} "
                   "(the network or a switch, or a collective every rank entered)")
    else:
        summary = ("no single culprit: every rank is stuck outside collectives at the same point "
                   "(a shared cause: storage, the data pipeline, a checkpoint)")
    return Verdict(True, (), True, group, seq, op, {}, summary)


def _majority(ops: Counter[str], at_top: Mapping[int, GroupView]) -> str:
    """The op most ranks entered; a tie goes to the ranks behind in steps (the one ahead skipped)."""
    def key(op: str) -> tuple[int, float]:
        steps = [v.step for v in at_top.values() if v.op == op and v.step is not None]
        return (-ops[op], min(steps) if steps else float("inf"))

    return min(ops, key=key)


def _at_step(view: GroupView) -> str:
    return f" (step {view.step})" if view.step is not None else ""


def _ranks(ranks: Iterable[int]) -> str:
    return ", ".join(str(r) for r in ranks)


# --------------------------------------------------------------------------
# From records (the report) and from attributes
# --------------------------------------------------------------------------
def group_view(attributes: Mapping[str, Any]) -> GroupView | None:
    """The collective attributes of a step span or a stuck alert, if it has them."""
    if sc.COLLECTIVE_SEQ not in attributes:
        return None
    step = attributes.get(sc.COLLECTIVE_STEP)
    return GroupView(
        group=str(attributes.get(sc.COLLECTIVE_GROUP, "")),
        entered=int(attributes[sc.COLLECTIVE_SEQ]),
        completed=int(attributes.get(sc.COLLECTIVE_COMPLETED_SEQ, 0) or 0),
        op=str(attributes.get(sc.COLLECTIVE_OP, "")),
        step=int(step) if isinstance(step, (int, float)) and not isinstance(step, bool) else None,
        wait_s=float(attributes.get(sc.COLLECTIVE_WAIT_S, 0.0) or 0.0),
    )


@dataclasses.dataclass
class _Rank:
    """What one rank's spans say, kept small: its last steps, not all of them."""

    #: The latest step span's view, and the latest first stuck alert's, each with its time.
    step_view: GroupView | None = None
    step_ns: int = -1
    alert_view: GroupView | None = None
    alert_ns: int = -1
    stuck: int = 0
    recovered: int = 0
    died: bool = False
    #: A min-heap of its last ``TIMELINE_STEPS`` step spans with collective attributes: (end, step, n, view),
    #: ``n`` numbering them as added so that views are never compared.
    timeline: list[tuple[int, int, int, GroupView]] = dataclasses.field(default_factory=list)
    added: int = 0

    @property
    def stuck_open(self) -> bool:
        return self.stuck > self.recovered

    @property
    def view(self) -> GroupView | None:
        """Its view at the hang: the stuck alert's (taken while stuck) while one is open, else the latest."""
        if self.stuck_open and self.alert_view is not None:
            return self.alert_view
        return self.alert_view if self.alert_ns > self.step_ns else self.step_view

    def add_step(self, end_ns: int, step: int, view: GroupView) -> None:
        if end_ns > self.step_ns:
            self.step_view, self.step_ns = view, end_ns
        self.added += 1
        item = (end_ns, step, -self.added, view)
        if len(self.timeline) < TIMELINE_STEPS:
            heapq.heappush(self.timeline, item)
        elif item[:2] > self.timeline[0][:2]:
            heapq.heapreplace(self.timeline, item)

    def update(self, other: _Rank) -> None:
        if other.step_view is not None:
            for end_ns, step, _, view in other.timeline:
                self.add_step(end_ns, step, view)
            if other.step_ns > self.step_ns:
                self.step_view, self.step_ns = other.step_view, other.step_ns
        if other.alert_view is not None and other.alert_ns > self.alert_ns:
            self.alert_view, self.alert_ns = other.alert_view, other.alert_ns
        self.stuck += other.stuck
        self.recovered += other.recovered
        self.died = self.died or other.died


class HangTracker:
    """The verdict's input, read span by span in bounded memory and mergeable across files.

    The report streams millions of spans through it: per rank it keeps a few
    views and its last ``TIMELINE_STEPS`` steps with collective attributes,
    whatever the order the spans arrive in, so parts read in parallel merge
    to the result of one pass.
    """

    def __init__(self) -> None:
        # Plain dicts, no lambdas: a part is pickled from the report's worker processes.
        self._runs: dict[tuple[str, str], dict[int, _Rank]] = {}

    def _rank(self, key: RunKey) -> _Rank:
        by_rank = self._runs.setdefault((key.job_id, key.run_id), {})
        rank = by_rank.get(key.rank)
        if rank is None:
            rank = by_rank[key.rank] = _Rank()
        return rank

    def step(self, key: RunKey, end_ns: int, attributes: Mapping[str, Any]) -> None:
        """A step span (only those with ``training.collective.*`` attributes count)."""
        view = group_view(attributes)
        if view is not None:
            step = attributes.get(sc.STEP)
            self._rank(key).add_step(
                end_ns, step if type(step) is int else -1, view)

    def alert(self, key: RunKey, start_ns: int, attributes: Mapping[str, Any]) -> None:
        kind = attributes.get(sc.ALERT_KIND)
        if kind not in _ALERT_KINDS:
            return
        rank = self._rank(key)
        if kind == sc.ALERT_KIND_DIED:
            rank.died = True
        elif kind == sc.ALERT_KIND_RECOVERED:
            rank.recovered += 1
        elif not attributes.get(sc.ALERT_REPEAT):
            rank.stuck += 1
            view = group_view(attributes)
            if view is not None and start_ns >= rank.alert_ns:
                rank.alert_view, rank.alert_ns = view, start_ns

    def add(self, record: SpanRecord) -> None:
        if record.name == sc.SPAN_STEP:
            self.step(record.run, record.end_ns, record.attributes)
        elif record.name == sc.SPAN_ALERT:
            self.alert(record.run, record.start_ns, record.attributes)

    def update(self, other: HangTracker) -> None:
        for run, by_rank in other._runs.items():
            mine = self._runs.setdefault(run, {})
            for number, rank in by_rank.items():
                mine.setdefault(number, _Rank()).update(rank)

    def results(self) -> dict[tuple[str, str], tuple[Verdict, dict[int, list[str]]]]:
        """Per (job id, run id): the verdict, and each rank's timeline of its last collectives."""
        result = {}
        for key, by_rank in sorted(self._runs.items()):
            views = []
            for number, r in sorted(by_rank.items()):
                view = r.view
                views.append(RankView(number, {view.group: view} if view is not None else {}, died=r.died,
                                      stuck=r.stuck_open))
            result[key] = (verdict(views), {number: _timeline(r) for number, r in sorted(by_rank.items())})
        return result

    def lines(self) -> list[str]:
        """The report's lines: ``render`` of each run that hung, headed by its run where there are several."""
        hung = [(key, found) for key, found in self.results().items() if found[0].hung]
        lines = []
        for (job_id, run_id), (result, timelines) in hung:
            if len(hung) > 1:
                lines.append(f"job {job_id} run {run_id}:")
            lines.extend(render(result, timelines))
        return lines


_ALERT_KINDS = frozenset({sc.ALERT_KIND_STUCK, sc.ALERT_KIND_RECOVERED, sc.ALERT_KIND_DIED})


def verdicts_from_records(records: Iterable[SpanRecord]) -> dict[tuple[str, str], tuple[Verdict, dict[int, list[str]]]]:
    """Per (job id, run id): the verdict, and each rank's timeline of its last collectives.

    Reads step spans and alert spans only (their ``training.collective.*``
    attributes). A stuck alert's view (taken while the rank was stuck) wins
    over the last step's while the alert is open.
    """
    tracker = HangTracker()
    for record in records:
        tracker.add(record)
    return tracker.results()


def _timeline(rank: _Rank) -> list[str]:
    lines = []
    for _end, step, _, view in sorted(rank.timeline):
        lines.append(f"step {step}: last entered {view.op} #{view.entered}, completed #{view.completed}")
    view = rank.view
    if view is not None and rank.stuck_open and view.pending:
        lines.append(f"stuck: inside {view.op} #{view.entered} on group {view.group} for {view.wait_s:.1f} s")
    elif rank.stuck_open:
        lines.append("stuck: outside any collective")
    if rank.died:
        lines.append("died")
    return lines


def render(result: Verdict, timelines: Mapping[int, list[str]] | None = None) -> list[str]:
    """The report's lines for one job: the verdict, who waits on whom, each rank's timeline."""
    if not result.hung:
        return []
    lines = [f"Hang verdict: {result.summary}"]
    waits: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for rank, culprits in sorted(result.waiting.items()):
        waits[culprits].append(rank)
    for culprits, ranks in waits.items():
        lines.append(f"  rank(s) {_ranks(ranks)} waiting on rank {_ranks(culprits)}")
    for rank, timeline in sorted((timelines or {}).items()):
        if timeline:
            lines.append(f"  rank {rank}: " + "; ".join(timeline))
    return lines
