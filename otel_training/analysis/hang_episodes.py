"""Every hang in a run, with its verdict: not only the ranks still stuck when the files end.

Why: the hangs people investigate afterwards are the ones that stalled a job for minutes and then went on
(slow storage, a network flap, a preempted neighbour): "why did we lose 12 minutes at step 25,000?". The
traces hold what the verdict needs, per stuck span: its first stuck alert (with the collective state the rank
was in, ``training.collective.*``), its recovery (the ``recovered`` alert), or a ``died`` alert.

An *episode* is a stretch of time in which at least one rank of a run was stuck: each stuck span counts from
its start (the alert's time less its ``training.alert.elapsed_s``) to its recovery (or the end of the files),
and overlapping ones, across ranks, are one episode. One stuck span is one interval whoever reported it (the
in-process detector and the watchdog sidecar alike), so repeats and duplicates change nothing. Each episode
gets ``hang.verdict`` over the views its ranks' first alerts carried. A rank of the run that reported nothing
during an episode while others waited in a collective was outside its steps (between steps, in a checkpoint
or an evaluation, or its step was not watched): it is named as the likely culprit, and said to be inferred.

Bounded: at most ``MAX_PER_RANK`` stuck spans are kept per rank (the longest), whatever the files hold.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from otel_training import semconv as sc
from otel_training.analysis.gpu import GpuErrors, GpuView, alert_view
from otel_training.analysis.hang import Culprit, GroupView, RankView, Verdict, explain_gpu, group_view, render, verdict

#: Stuck spans kept per rank: the longest, so the episodes that cost the most are never the ones left out.
MAX_PER_RANK = 500
#: A reason of a culprit inferred from silence (no alert of its own during the episode).
REASON_SILENT = "silent_during_hang"
#: A reason of ranks stuck outside collectives while the others were not (or a one-rank run's only rank).
REASON_ALONE = "stuck_alone"
#: A GPU error this long before a stuck stretch began still explains it (the fault comes before the step that
#: never ends crosses its stuck threshold).
LOOKBACK_NS = 60 * 10**9


@dataclasses.dataclass
class StuckSpan:
    """One stuck span of one rank: from its start to its recovery (None: not recovered in the files)."""

    begin_ns: int
    alert_ns: int
    end_ns: int | None = None
    view: GroupView | None = None
    step: int | None = None
    died: bool = False
    #: The GPU's state its first stuck alert carried (``analysis/gpu.py``), if any.
    gpu: GpuView | None = None

    def merge(self, other: StuckSpan) -> None:
        """The same span seen in another part or from another reporter (the watchdog's, the detector's)."""
        if (other.alert_ns < self.alert_ns and other.view is not None) or self.view is None:
            self.view = other.view or self.view
        if (other.alert_ns < self.alert_ns and other.gpu is not None) or self.gpu is None:
            self.gpu = other.gpu or self.gpu
        self.begin_ns = min(self.begin_ns, other.begin_ns)
        self.alert_ns = min(self.alert_ns, other.alert_ns)
        if other.end_ns is not None:
            self.end_ns = other.end_ns if self.end_ns is None else max(self.end_ns, other.end_ns)
        self.step = self.step if self.step is not None else other.step
        self.died = self.died or other.died

    def length_ns(self, horizon_ns: int) -> int:
        return (self.end_ns if self.end_ns is not None else horizon_ns) - self.begin_ns


@dataclasses.dataclass(frozen=True)
class Episode:
    """A stretch of a run with at least one rank stuck, and its verdict."""

    begin_ns: int
    #: When the last of its ranks recovered; None while one was still stuck when the files end.
    end_ns: int | None
    ranks: tuple[int, ...]
    steps: tuple[int, ...]
    verdict: Verdict

    @property
    def recovered(self) -> bool:
        return self.end_ns is not None

    def seconds(self, horizon_ns: int) -> float:
        return ((self.end_ns if self.end_ns is not None else horizon_ns) - self.begin_ns) / 1e9


def stuck_span(alert_ns: int, attributes: Mapping[str, object]) -> StuckSpan:
    """The interval a stuck, recovered or died alert speaks of."""
    elapsed = attributes.get(sc.ALERT_ELAPSED_S)
    elapsed_ns = int(float(elapsed) * 1e9) if isinstance(elapsed, (int, float)) and not isinstance(elapsed, bool) else 0
    step = attributes.get(sc.STEP)
    kind = attributes.get(sc.ALERT_KIND)
    return StuckSpan(begin_ns=alert_ns - max(0, elapsed_ns), alert_ns=alert_ns,
                     end_ns=alert_ns if kind == sc.ALERT_KIND_RECOVERED else None,
                     view=group_view(attributes) if kind == sc.ALERT_KIND_STUCK else None,
                     step=step if type(step) is int else None, died=kind == sc.ALERT_KIND_DIED,
                     gpu=alert_view(alert_ns, attributes) if kind == sc.ALERT_KIND_STUCK else None)


def prune(spans: dict[str, StuckSpan], horizon_ns: int) -> None:
    """Keep the ``MAX_PER_RANK`` longest (the rest cost the least)."""
    if len(spans) <= MAX_PER_RANK:
        return
    keep = sorted(spans, key=lambda key: (-spans[key].length_ns(horizon_ns), key))[:MAX_PER_RANK]
    for key in set(spans) - set(keep):
        del spans[key]


def episodes(by_rank: Mapping[int, Iterable[StuckSpan]], horizon_ns: int,
             errors: GpuErrors | None = None) -> list[Episode]:
    """The run's episodes, oldest first (``horizon_ns``: the end of the files, for spans still stuck;
    ``errors``: the GPU errors the ranks' steps counted, for what their GPUs did meanwhile)."""
    intervals = sorted(((span.begin_ns, span.end_ns if span.end_ns is not None else None, rank, span)
                        for rank, spans in by_rank.items() for span in spans), key=lambda item: item[0])
    found: list[Episode] = []
    group: list[tuple[int, StuckSpan]] = []
    group_end: int | None = -1
    for begin, end, rank, span in intervals:
        if group and group_end is not None and begin > group_end:
            found.append(_episode(group, sorted(by_rank), errors))
            group = []
        if not group:
            group_end = end
        elif group_end is not None:
            group_end = None if end is None else max(group_end, end)
        group.append((rank, span))
    if group:
        found.append(_episode(group, sorted(by_rank), errors))
    return found


def gpu_views(first: Mapping[int, StuckSpan], run_ranks: Iterable[int], begin_ns: int, end_ns: int | None,
              errors: GpuErrors | None) -> dict[int, GpuView | None]:
    """Each rank's GPU over a stuck stretch: its first alert's device state, with the errors counted from
    ``LOOKBACK_NS`` before the stretch to its end (older ones explain nothing here)."""
    views: dict[int, GpuView | None] = {}
    for rank in run_ranks:
        span = first.get(rank)
        view = span.gpu if span is not None else None
        found = [error for error in (view.errors if view is not None else ())
                 if begin_ns - LOOKBACK_NS <= error.time_ns and (end_ns is None or error.time_ns <= end_ns)]
        if errors is not None:
            found.extend(errors.between(rank, begin_ns - LOOKBACK_NS, end_ns))
        if view is not None or found:
            view = dataclasses.replace(view or GpuView(), errors=()).with_errors(found)
        views[rank] = view
    return views


def _episode(group: list[tuple[int, StuckSpan]], run_ranks: list[int], errors: GpuErrors | None = None) -> Episode:
    first: dict[int, StuckSpan] = {}
    for rank, span in sorted(group, key=lambda item: item[1].alert_ns):
        first.setdefault(rank, span)
    views = [RankView(rank, {span.view.group: span.view} if span.view is not None else {},
                      died=any(s.died for r, s in group if r == rank), stuck=any(not s.died for r, s in group
                                                                                   if r == rank))
             for rank, span in sorted(first.items())]
    result = verdict(views)
    silent = [rank for rank in run_ranks if rank not in first]
    if silent and not result.culprits:
        result = _silent_culprits(result, views, silent)
    if result.no_single_culprit and result.seq is None and (silent or len(run_ranks) <= 1):
        result = _alone(result, views, bool(silent))
    ends = [span.end_ns for _, span in group]
    begin_ns = min(span.begin_ns for _, span in group)
    ended = [end for end in ends if end is not None]
    end_ns = max(ended) if len(ended) == len(ends) else None  # open while any is
    result = explain_gpu(result, gpu_views(first, run_ranks, begin_ns, end_ns, errors))
    return Episode(begin_ns=begin_ns, end_ns=end_ns,
                   ranks=tuple(sorted(first)), steps=tuple(sorted({s.step for _, s in group if s.step is not None})),
                   verdict=result)


def _silent_culprits(result: Verdict, views: list[RankView], silent: list[int]) -> Verdict:
    """Ranks that all wait in one collective, and ranks that said nothing meanwhile: those kept them waiting."""
    waiting = [view for view in views if any(group.pending for group in view.groups.values())]
    if not waiting or len(waiting) != len(views):
        return result
    group = result.group or next(iter(waiting[0].groups))
    culprits = tuple(Culprit(rank, REASON_SILENT, group, (
        f"no stuck alert of its own while the others waited in {result.op or 'a collective'} #{result.seq} on group "
        f"{group}: it was outside its steps (between steps, a checkpoint, an evaluation) or its step was not "
        "watched (inferred)")) for rank in silent)
    names = ", ".join(str(rank) for rank in silent)
    return dataclasses.replace(result, culprits=culprits, no_single_culprit=False,
                               waiting={view.rank: tuple(silent) for view in waiting},
                               summary=f"culprit rank(s) {names} ({REASON_SILENT}: {culprits[0].detail})")


def _alone(result: Verdict, views: list[RankView], others: bool) -> Verdict:
    """Ranks stuck outside collectives while the others were not (or in a one-rank run): their own work, not
    a cause they share with the job."""
    stuck = [view.rank for view in views if view.stuck]
    detail = ("stuck outside collectives while the other ranks were not" if others
              else "stuck outside collectives (the run's only rank)")
    culprits = tuple(Culprit(rank, REASON_ALONE, "", detail) for rank in stuck)
    names = ", ".join(str(rank) for rank in stuck)
    return dataclasses.replace(result, culprits=culprits, no_single_culprit=False,
                               summary=f"rank(s) {names} {detail}: its own work (data, a checkpoint, compute)")


def render_episodes(found: list[Episode], horizon_ns: int) -> list[str]:
    """The report's lines: one block per episode."""
    lines: list[str] = []
    for number, episode in enumerate(found, 1):
        steps = episode.steps
        where = f", step {steps[0]}" if len(steps) == 1 else f", steps {steps[0]}-{steps[-1]}" if steps else ""
        state = "recovered" if episode.recovered else "still stuck when the files end"
        ranks = ", ".join(str(rank) for rank in episode.ranks)
        lines.append(f"Hang episode {number}: {episode.seconds(horizon_ns):.1f} s{where}, rank(s) {ranks} stuck, "
                     f"{state}")
        lines.extend("  " + line for line in render(episode.verdict))
    return lines
