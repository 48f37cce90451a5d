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
report. ``render`` turns a verdict into the lines the report prints; ``hang_tracker.py`` reads the records
for it, and ``hang_episodes.py`` gives every hang of a run its own verdict.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from otel_training import semconv as sc
from otel_training.analysis.gpu import GpuView, explain


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
    #: Its GPU meanwhile (the stuck alert's device state, the errors its steps' events counted), if known.
    gpu: GpuView | None = None


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
    #: Rank -> how its GPU differed from the other ranks' (``analysis/gpu.py``): each culprit's, or with no
    #: single culprit, any rank's whose GPU differed (a likely cause the collectives cannot see).
    gpu: Mapping[int, str] = dataclasses.field(default_factory=dict)


def verdict(ranks: Iterable[RankView]) -> Verdict:
    """The verdict over the ranks of one job (one launch attempt), with what the culprits' GPUs did."""
    ranks = sorted(ranks, key=lambda r: r.rank)
    return explain_gpu(_verdict(ranks), {r.rank: r.gpu for r in ranks})


def explain_gpu(result: Verdict, gpus: Mapping[int, GpuView | None]) -> Verdict:
    """``result`` with ``gpu``: each culprit's GPU against the other ranks' (or, with no single culprit, each
    rank's against the rest), where it differed."""
    if not result.hung or not any(view is not None for view in gpus.values()):
        return result
    culprits = {c.rank for c in result.culprits}
    named = sorted(culprits) if culprits else sorted(gpus)
    found = {}
    for rank in named:
        peers = [view for other, view in gpus.items() if other != rank and other not in culprits]
        text = explain(gpus.get(rank), peers)
        if text:
            found[rank] = text
    if not culprits and len(found) * 2 > len(gpus):
        found = {}  # most ranks differ from the rest: nothing tells one apart
    return dataclasses.replace(result, gpu=found) if found != result.gpu else result


def _verdict(ranks: list[RankView]) -> Verdict:
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
    group: str | None  # each group's name in the loop; the verdict's group (if any) after it
    for group in sorted({name for r in live for name in r.groups}):
        views = {r.rank: r.groups[group] for r in live if group in r.groups}
        top = max(v.entered for v in views.values())
        at_top = {rank: v for rank, v in views.items() if v.entered == top}
        waiters = [rank for rank, v in at_top.items() if v.pending]
        if not waiters:
            continue
        # An op nobody named ("": the sequence route without the flight recorder, a step the way out ended)
        # matches any: it is no evidence of an unmatched collective.
        ops = Counter(v.op for v in at_top.values() if v.op)
        majority = _majority(ops, at_top) if ops else ""
        if best is None or len(waiters) > best[0]:
            best = (len(waiters), group, top, majority)
        for rank, v in views.items():
            if v.entered < top:
                culprits.append(Culprit(rank, sc.HANG_REASON_NOT_ENTERED, group, (
                    f"last entered {v.op or '?'} #{v.entered}{_at_step(v)}, completed #{v.completed}; has not entered "
                    f"{majority or 'collective'} #{top} on group {group}")))
            elif v.op and v.op != majority:
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
        summary = (f"no single culprit: every rank waits in {op or 'a collective'} #{seq} on group {group} "
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


def render(result: Verdict, timelines: Mapping[int, list[str]] | None = None) -> list[str]:
    """The report's lines for one job: the verdict, who waits on whom, each rank's timeline."""
    if not result.hung:
        return []
    lines = [f"Hang verdict: {result.summary}"]
    culprits: set[int] | tuple[int, ...]  # the culprits' ranks; then, in the loops, one waiting rank's culprits
    culprits = {c.rank for c in result.culprits}
    for rank, text in sorted(result.gpu.items()):
        lines.append(f"  rank {rank} GPU: {text}" + ("" if rank in culprits else
                                                    " (its GPU differed from the other ranks': a likely cause)"))
    waits: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for rank, culprits in sorted(result.waiting.items()):
        waits[culprits].append(rank)
    for culprits, ranks in waits.items():
        lines.append(f"  rank(s) {_ranks(ranks)} waiting on rank {_ranks(culprits)}")
    for rank, timeline in sorted((timelines or {}).items()):
        if timeline:
            lines.append(f"  rank {rank}: " + "; ".join(timeline))
    return lines
