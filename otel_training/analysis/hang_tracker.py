"""The hang verdict's input, read from a run's spans in bounded memory: the last views and every stuck span.

Why a module of its own: ``hang.py`` is the rules (a pure function over views), ``hang_episodes.py`` the
episodes; this one reads the records for both, span by span, in parallel parts that merge.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Iterable, Mapping
from typing import Any

from otel_training import semconv as sc
from otel_training.analysis.gpu import GpuErrors
from otel_training.analysis.hang import GroupView, RankView, Verdict, explain_gpu, group_view, render, verdict
from otel_training.analysis.hang_episodes import (
    MAX_PER_RANK,
    Episode,
    StuckSpan,
    episodes,
    gpu_views,
    prune,
    render_episodes,
    stuck_span,
)
from otel_training.analysis.records import RunKey, SpanRecord

#: Steps of each rank shown in the timeline around the hang.
TIMELINE_STEPS = 3


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
    #: Its stuck spans by the alerted span's id, for the episodes (``hang_episodes.py``).
    stuck_spans: dict[str, StuckSpan] = dataclasses.field(default_factory=dict)

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
        for key, span in other.stuck_spans.items():
            self.add_stuck(key, span)

    def add_stuck(self, key: str, span: StuckSpan) -> None:
        mine = self.stuck_spans.get(key)
        if mine is None:
            self.stuck_spans[key] = dataclasses.replace(span)
        else:
            mine.merge(span)
        if len(self.stuck_spans) > 2 * MAX_PER_RANK:
            prune(self.stuck_spans, max(s.alert_ns for s in self.stuck_spans.values()))


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
        #: Per run, the latest time any of its spans ended: where a stuck span not recovered stops counting.
        self._horizon: dict[tuple[str, str], int] = {}

    def _rank(self, key: RunKey) -> _Rank:
        by_rank = self._runs.setdefault((key.job_id, key.run_id), {})
        rank = by_rank.get(key.rank)
        if rank is None:
            rank = by_rank[key.rank] = _Rank()
        return rank

    def seen(self, key: RunKey, end_ns: int) -> None:
        """A training rank of the run, whose spans go as far as ``end_ns`` (the streamed report says it once a
        batch): a rank silent during a hang is named, and a span still stuck counts up to the run's end."""
        run = (key.job_id, key.run_id)
        if end_ns > self._horizon.get(run, 0):
            self._horizon[run] = end_ns
        self._rank(key)

    def step(self, key: RunKey, end_ns: int, attributes: Mapping[str, Any]) -> None:
        """A step span (only those with ``training.collective.*`` attributes count)."""
        self.seen(key, end_ns)
        view = group_view(attributes)
        rank = self._rank(key)
        if view is not None:
            step = attributes.get(sc.STEP)
            rank.add_step(
                end_ns, step if type(step) is int else -1, view)

    def alert(self, key: RunKey, start_ns: int, attributes: Mapping[str, Any]) -> None:
        kind = attributes.get(sc.ALERT_KIND)
        if kind not in _ALERT_KINDS:
            return
        rank = self._rank(key)
        run = (key.job_id, key.run_id)
        if start_ns > self._horizon.get(run, 0):
            self._horizon[run] = start_ns
        span_id = attributes.get(sc.ALERT_SPAN_ID)
        rank.add_stuck(str(span_id) if span_id is not None else f"{kind}@{start_ns}", stuck_span(start_ns, attributes))
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
        for run, horizon in other._horizon.items():
            self._horizon[run] = max(horizon, self._horizon.get(run, 0))
        for run, by_rank in other._runs.items():
            mine = self._runs.setdefault(run, {})
            for number, rank in by_rank.items():
                mine.setdefault(number, _Rank()).update(rank)

    def results(self, errors: GpuErrors | None = None) -> dict[tuple[str, str], tuple[Verdict, dict[int, list[str]]]]:
        """Per (job id, run id): the verdict, and each rank's timeline of its last collectives (``errors``: the
        GPU errors the ranks' steps counted, for what their GPUs did since the hang began)."""
        result = {}
        for key, by_rank in sorted(self._runs.items()):
            views = []
            for number, r in sorted(by_rank.items()):
                view = r.view
                views.append(RankView(number, {view.group: view} if view is not None else {}, died=r.died,
                                      stuck=r.stuck_open))
            found = verdict(views)
            if found.hung:
                open_spans = {number: min((s for s in r.stuck_spans.values() if s.end_ns is None),
                                          key=lambda s: s.begin_ns, default=None) for number, r in by_rank.items()}
                first = {number: span for number, span in open_spans.items() if span is not None}
                begin = min((span.begin_ns for span in first.values()), default=self._horizon.get(key, 0))
                found = explain_gpu(found, gpu_views(first, sorted(by_rank), begin, None, errors))
            result[key] = (found, {number: _timeline(r) for number, r in sorted(by_rank.items())})
        return result

    def episodes(self, errors: GpuErrors | None = None) -> dict[tuple[str, str], list[Episode]]:
        """Per (job id, run id) that had any: every episode of stuck ranks, with its verdict, oldest first."""
        found = {}
        for key, by_rank in sorted(self._runs.items()):
            horizon = self._horizon.get(key, 0)
            spans = {}
            for number, rank in by_rank.items():
                prune(rank.stuck_spans, horizon)
                spans[number] = list(rank.stuck_spans.values())
            run_episodes = episodes(spans, horizon, errors)
            if run_episodes:
                found[key] = run_episodes
        return found

    def episode_lines(self, errors: GpuErrors | None = None) -> list[str]:
        """The report's lines for every episode of every run, headed by its run where there are several."""
        found = self.episodes(errors)
        lines = []
        for (job_id, run_id), run_episodes in found.items():
            if len(found) > 1:
                lines.append(f"job {job_id} run {run_id}:")
            lines.extend(render_episodes(run_episodes, self._horizon.get((job_id, run_id), 0)))
        return lines

    def lines(self, errors: GpuErrors | None = None) -> list[str]:
        """The report's lines: ``render`` of each run that hung, headed by its run where there are several."""
        hung = [(key, found) for key, found in self.results(errors).items() if found[0].hung]
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
    view: GroupView | None  # each step's in the loop; then the rank's latest, if it has one
    for _end, step, _, view in sorted(rank.timeline):
        lines.append(f"step {step}: last entered {view.op or '?'} #{view.entered}, completed #{view.completed}")
    view = rank.view
    if view is not None and rank.stuck_open and view.pending:
        lines.append(f"stuck: inside {view.op or 'a collective'} #{view.entered} on group {view.group} for {view.wait_s:.1f} s")
    elif rank.stuck_open:
        lines.append("stuck: outside any collective")
    if rank.died:
        lines.append("died")
    return lines
