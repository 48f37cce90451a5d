"""The self-contained HTML report: plots as inline SVG, no script, no network, opens anywhere offline.

Plots are drawn with matplotlib (Agg) into inline SVG; the data-heavy ones
(thousands of steps, the per-rank timeline) rasterize their marks inside the
SVG so a million-span job still gives a page of bounded size.
"""

from __future__ import annotations

import html
import io
import multiprocessing
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, cast

from otel_training import semconv as sc
from otel_training.analysis import BUCKETS, PRODUCTIVE, SpanRecord
from otel_training.report.alerts_view import alerts_html as _alerts
from otel_training.report.alerts_view import stuck_intervals
from otel_training.report.digest import TIMELINE_RANKS, merged
from otel_training.report.gpu_plot import gpu_ranks, plot_gpu
from otel_training.report.job import JobReport
from otel_training.report.summary import render_summary

#: Colour of each label, shared by the breakdown and the timeline.
COLORS: dict[str, str] = {
    PRODUCTIVE: "#2ca02c",
    sc.BADPUT_PROGRAM_STARTUP: "#c7c7c7",
    sc.BADPUT_COMPILATION: "#f7b6d2",
    sc.BADPUT_INITIALIZATION: "#9467bd",
    sc.BADPUT_TRAINING_PREP: "#c5b0d5",
    sc.BADPUT_DATA_LOADING: "#ff7f0e",
    sc.BADPUT_CHECKPOINT_SAVE: "#1f77b4",
    sc.BADPUT_CHECKPOINT_RESTORE: "#aec7e8",
    sc.BADPUT_EVALUATION: "#17becf",
    sc.BADPUT_STUCK: "#d62728",
    sc.BADPUT_WASTED_PROGRESS: "#8c564b",
    sc.BADPUT_RECOVERY: "#e377c2",
    sc.BADPUT_DOWNTIME: "#7f7f7f",
    sc.BADPUT_HOST_OUTSIDE_STEPS: "#bcbd22",
    sc.BADPUT_OTHER: "#dbdb8d",
}
#: Marks above which a plot's data are rasterized inside its SVG.
RASTERIZE_ABOVE = 2000
#: Horizontal resolution the timeline merges intervals to.
TIMELINE_BINS = 3000


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def prepare_plots() -> None:
    """Import the plotting library ahead of ``render_html`` (for the reader to run while its workers read)."""
    try:
        _pyplot()
    except Exception:  # noqa: BLE001 - render_html, after the summary is printed, will say what is wrong
        pass


def _svg(figure: Any) -> str:
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight")
    _pyplot().close(figure)
    text = buffer.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog and doctype: inline SVG


def _step_axis_cap_ms(report: JobReport) -> float | None:
    """Upper limit of step-time axes, so that one hung step does not flatten every other."""
    stats = report.job_steps
    if stats is None or stats.maximum <= 3 * stats.p90:
        return None
    return 3 * stats.p90 * 1000


def _plot_step_times(report: JobReport) -> str:
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(11, 3.8))
    by_rank: defaultdict[int, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for step in report.step_sample:
        xs, ys = by_rank[step.rank]
        xs.append((step.start_ns - report.start_ns) / 1e9)
        ys.append(step.duration_s * 1000)
    rasterize = len(report.step_sample) > RASTERIZE_ABOVE
    stragglers = set(report.straggler_ranks)
    for rank, (xs, ys) in sorted(by_rank.items()):
        label = f"rank {rank}" + (" (straggler)" if rank in stragglers else "")
        axes.plot(xs, ys, ".", markersize=3 if rasterize else 5, label=label, rasterized=rasterize)
    if report.ideal_step_s is not None:
        axes.axhline(report.ideal_step_s * 1000, color="black", linestyle="--", linewidth=1, label="ideal")
    for run in report.goodput.runs:
        if run.key.restart > 0:
            axes.axvline((run.start_ns - report.start_ns) / 1e9, color="#d62728", alpha=0.3, linewidth=1)
    cap = _step_axis_cap_ms(report)
    title = "Step time per rank (red lines: restarts)"
    if cap is not None:
        axes.set_ylim(0, cap)
        hidden = sum(1 for durations in report.rank_durations.values() for duration in durations
                     if duration * 1000 > cap)
        title += f"; {hidden} step(s) above {cap:.0f} ms off the chart"
    if len(report.step_sample) < report.step_count:
        title += f" ({len(report.step_sample):,} of {report.step_count:,} steps shown, the longest among them)"
    axes.set_xlabel("time since job start (s)")
    axes.set_ylabel("step time (ms)")
    axes.set_title(title)
    if len(by_rank) <= 16:
        axes.legend(loc="upper right", fontsize="small", ncol=min(4, len(by_rank) + 1))
    return _svg(figure)


def _durations_ms(report: JobReport) -> Any:
    import numpy  # matplotlib's own dependency

    arrays = [numpy.frombuffer(durations, dtype="float64") for durations in report.rank_durations.values()]
    return numpy.concatenate(arrays) * 1000 if arrays else numpy.zeros(0)


def _plot_histogram(report: JobReport) -> str:
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(5.4, 3.6))
    durations = _durations_ms(report)
    cap = _step_axis_cap_ms(report)
    shown = durations if cap is None else durations[durations <= cap]
    axes.hist(shown, bins=min(60, max(5, len(shown) // 5)), color="#1f77b4")
    if report.ideal_step_s is not None:
        axes.axvline(report.ideal_step_s * 1000, color="black", linestyle="--", label="ideal")
    if report.normal_threshold_s is not None:
        axes.axvline(report.normal_threshold_s * 1000, color="#d62728", linestyle=":", label="median + 3 MAD")
    axes.set_xlabel("step time (ms)")
    axes.set_ylabel("steps")
    axes.set_title("Step-time histogram (all ranks)" if cap is None
                   else f"Step-time histogram ({len(durations) - len(shown)} above {cap:.0f} ms not shown)",
                   fontsize="medium")
    if report.ideal_step_s is not None:
        axes.legend(fontsize="small")
    return _svg(figure)


def _plot_breakdown(report: JobReport) -> str:
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(5.4, 3.6))
    seconds = report.goodput.seconds
    labels = [label for label in (PRODUCTIVE, *BUCKETS) if seconds.get(label, 0) > 0]
    labels.sort(key=lambda label: seconds[label])
    total = report.goodput.total_s or 1.0
    bars = axes.barh(labels, [seconds[label] for label in labels], color=[COLORS[label] for label in labels])
    for bar, label in zip(bars, labels):
        axes.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {seconds[label] / total:.1%}",
                  va="center", fontsize="small")
    axes.set_xlabel("accelerator time (s, summed over ranks)")
    goodput = report.goodput.goodput
    axes.set_title("Goodput and badput" + ("" if goodput is None else f": goodput {goodput:.1%}"))
    axes.margins(x=0.15)
    return _svg(figure)


def _plot_timeline(report: JobReport) -> str:
    plt = _pyplot()
    ranks = sorted({run.key.rank for run in report.goodput.runs})
    total_ranks = len(ranks)
    ranks = ranks[:TIMELINE_RANKS]
    figure, axes = plt.subplots(figsize=(11, 0.9 + 0.45 * max(1, len(ranks))))
    span_ns = max(1, report.end_ns - report.start_ns)
    resolution = span_ns // TIMELINE_BINS
    row = {rank: index for index, rank in enumerate(ranks)}
    intervals: defaultdict[tuple[int, str], list[tuple[int, int]]] = defaultdict(list)
    for (rank, label), spans in report.intervals.items():
        if rank in row:
            intervals[(rank, label)].extend(spans)
    for run in report.goodput.runs:
        if run.key.rank in row:
            intervals[(run.key.rank, "_run")].append((run.start_ns, run.end_ns))
    used: set[str] = set()
    merged_spans = {key: merged(spans, resolution) for key, spans in intervals.items()}
    rasterize = sum(len(spans) for spans in merged_spans.values()) > RASTERIZE_ABOVE
    for (rank, label), spans in sorted(merged_spans.items(), key=lambda item: item[0][1] != "_run"):
        bars = [((start - report.start_ns) / 1e9, max(end - start, resolution) / 1e9) for start, end in spans]
        if label == "_run":
            axes.broken_barh(bars, (row[rank] - 0.4, 0.8), facecolors="#f0f0f0", edgecolors="#999999")
            continue
        used.add(label)
        axes.broken_barh(bars, (row[rank] - 0.3, 0.6), facecolors=COLORS[label], rasterized=rasterize)
    stuck = [(rank, (start - report.start_ns) / 1e9, max(end - start, resolution) / 1e9)
             for rank, start, end in stuck_intervals(report) if rank in row]
    for rank, start, width in stuck:  # over the spans: a hung step is stuck, not productive, as the breakdown says
        used.add(sc.BADPUT_STUCK)
        axes.broken_barh([(start, width)], (row[rank] - 0.3, 0.6), facecolors=COLORS[sc.BADPUT_STUCK])
    for alert in report.alerts:
        if alert.rank in row:
            axes.plot((alert.time_ns - report.start_ns) / 1e9, row[alert.rank] + 0.42, "v",
                      color="#d62728" if alert.kind != sc.ALERT_KIND_RECOVERED else "#2ca02c", markersize=7)
    axes.set_yticks(range(len(ranks)), [f"rank {rank}" for rank in ranks])
    axes.set_ylim(-0.6, len(ranks) - 0.4 + 0.3)
    axes.invert_yaxis()
    axes.set_xlabel("time since job start (s)")
    title = "Per-rank timeline (grey: a run of the rank; triangles: stuck/recovered alerts)"
    if len(ranks) < total_ranks:
        title += f"; the {len(ranks)} lowest-numbered of {total_ranks} ranks"
    axes.set_title(title)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[label]) for label in COLORS if label in used]
    axes.legend(handles, [label for label in COLORS if label in used], loc="upper left",
                bbox_to_anchor=(1.0, 1.0), fontsize="small")
    return _svg(figure)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:1.5em;margin-bottom:4px} h2{font-size:1.15em;margin-top:28px;border-bottom:1px solid #ddd}
.cards{display:flex;gap:12px;flex-wrap:wrap;margin:14px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:10px 14px;min-width:130px}
.card b{display:block;font-size:1.5em} .card span{color:#666;font-size:.85em}
.plots{display:flex;flex-wrap:wrap;gap:8px} figure{margin:0} svg{max-width:100%;height:auto}
table{border-collapse:collapse;font-size:.9em} td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f5f5f5} td:first-child,th:first-child{text-align:left}
.straggler{background:#fde0dc} pre{background:#f7f7f7;padding:8px;overflow:auto;font-size:.8em}
.problems li{font-family:monospace;font-size:.85em}
"""


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def _cards(report: JobReport) -> str:
    account = report.goodput
    worst = max(account.badput.items(), key=lambda item: item[1], default=("-", 0.0))
    cards = [
        ("goodput", "-" if account.goodput is None else f"{account.goodput:.1%}"),
        ("training loop goodput (without start-up, compilation)",
         "-" if account.training_goodput is None else f"{account.training_goodput:.1%}"),
        ("accelerator time", f"{account.total_s:,.1f} s"),
        ("largest badput", f"{worst[0]}" if worst[1] > 0 else "-"),
        ("ranks / restarts", f"{len({run.key.rank for run in account.runs})} / {account.restarts}"),
        ("ideal step time", "-" if report.ideal_step_s is None else f"{report.ideal_step_s * 1000:.1f} ms"),
        ("stragglers", ", ".join(f"rank {rank}" for rank in report.straggler_ranks) or "none"),
    ]
    if report.data_wait_s > 0:  # most host waits overlap device work on a device timeline: both figures
        lost = account.badput.get(sc.BADPUT_DATA_LOADING, 0.0)
        cards.append(("host waits for batches / lost to them", f"{report.data_wait_s:,.1f} s / {lost:,.1f} s"))
    return '<div class="cards">' + "".join(
        f'<div class="card"><b>{html.escape(value)}</b><span>{html.escape(name)}</span></div>' for name, value in cards
    ) + "</div>"


def _rank_table(report: JobReport) -> str:
    scores = {score.rank: score for score in report.stragglers}
    rows = []
    for rank, stats in report.rank_steps.items():
        score = scores.get(rank)
        css = ' class="straggler"' if score and score.straggler else ""
        worst = score.worst_window if score else None
        where = "-" if worst is None else html.escape(report.window_label(rank, worst))
        rows.append(
            f"<tr{css}><td>rank {rank}</td><td>{stats.count}</td><td>{_ms(stats.median)}</td><td>{_ms(stats.p90)}</td>"
            f"<td>{_ms(stats.maximum)}</td><td>{_ms(stats.mad)}</td><td>{_ms(stats.mean)}</td><td>{stats.abnormal}</td>"
            f"<td>{score.relative if score else 1:.2f}</td><td>{score.individual if score else 1:.2f}</td>"
            f"<td>{where}</td></tr>"
        )
    named = "".join(f"<li>{html.escape(line)}</li>" for line in report.straggler_lines())
    shared = "".join(f"<li>{html.escape(line)}</li>" for line in report.job_slow_window_lines())
    return ("<table><tr><th>rank</th><th>steps</th><th>median ms</th><th>p90 ms</th><th>max ms</th>"
            "<th>MAD ms</th><th>mean ms</th><th>abnormal</th><th>relative score</th><th>individual score</th>"
            "<th>worst window</th></tr>"
            + "".join(rows) + "</table>"
            + f"<p>Scores are each rank's worst window of {report.straggler_window} steps (relative: against the "
              f"median of its peers; individual: against its own best window). A rank is named when a window "
              f"scores below {report.straggler_threshold:g} by more than the noise of the steps compared, and "
              "not in a window most ranks slowed down in together (the job's slowdown).</p>"
            + (f'<ul class="stragglers">{named}</ul>' if named else "")
            + (f'<p>The job slowed down (no straggler):</p><ul class="slow-windows">{shared}</ul>' if shared else ""))


def _hang(report: JobReport) -> str:
    if not report.hang and not report.hang_episode_lines:
        return ""
    episodes = ('<h2>Hang episodes</h2><pre class="hang">' + html.escape("\n".join(report.hang_episode_lines))
                + "</pre>\n") if report.hang_episode_lines else ""
    verdict = ('<h2>Hang verdict</h2><pre class="hang">' + html.escape("\n".join(report.hang)) + "</pre>\n"
               ) if report.hang else ""
    return (episodes + verdict +
            # Text, not a link: the page loads nothing and links nowhere (it may be read offline, or behind a
            # proxy that must not see the job's names in a referrer).
            "<p>How to read it: docs/hang-diagnosis.md in otel-training's documentation.</p>\n")


def _plot_gpu(report: JobReport) -> str:
    return plot_gpu(report, _pyplot(), _svg)


#: The page's plots, in its order: (element id, drawing function, drawn only for a job with steps).
_PLOTS = (("step-time", "_plot_step_times", True), ("breakdown", "_plot_breakdown", False),
          ("histogram", "_plot_histogram", True), ("timeline", "_plot_timeline", False),
          ("gpu", "_plot_gpu", True))
#: The report the forked plot processes draw from (inherited, never pickled).
_drawing: JobReport | None = None


def _draw(function: str) -> str:
    assert _drawing is not None
    return cast("str", globals()[function](_drawing))


def _svgs(report: JobReport, functions: list[str], processes: int) -> Callable[[], list[str]]:
    """``() -> [svg, ...]`` of the plot functions: drawn by forked processes while the caller goes on,
    where asked for and available; else drawn when called."""
    global _drawing
    if processes > 1 and len(functions) > 1 and "fork" in multiprocessing.get_all_start_methods():
        try:
            _drawing = report
            pool = multiprocessing.get_context("fork").Pool(min(processes, len(functions)))
        except OSError:
            pool = None
        finally:
            _drawing = None
        if pool is not None:
            pending = pool.map_async(_draw, functions, chunksize=1)

            def collect() -> list[str]:
                try:
                    return pending.get()
                finally:
                    pool.close()
                    pool.join()

            return collect
    return lambda: [globals()[function](report) for function in functions]


def render_html(report: JobReport, records: Sequence[SpanRecord] | None = None, *,
                evaluation_is_productive: bool = False, processes: int = 1) -> str:
    """The report page.

    ``records`` and ``evaluation_is_productive`` are unused: the timeline's intervals were
    kept when the report was built (from records in memory or from files streamed), labelled
    as its goodput was. They stay for callers written when the page redrew them from the spans.
    ``processes``: draw the plots in that many forked processes while this one writes the
    tables (matplotlib draws on one core; the CLI passes its worker count).
    """
    title = "otel-training report: " + (", ".join(report.job_ids) or "job")
    shown = [(element, function) for element, function, needs_steps in _PLOTS if (report.step_count or not needs_steps)
             and (element != "gpu" or gpu_ranks(report))]  # the GPU plot: only where the GPU's state was sampled
    drawn = _svgs(report, [function for _, function in shown], processes)
    tables = _cards(report), _rank_table(report), _hang(report), _alerts(report), render_summary(report)
    plots = [f'<figure class="plot" id="{element}">{svg}</figure>' for (element, _), svg in zip(shown, drawn())]
    cards, ranks, hang, alerts, summary = tables
    problems = ""
    if report.problems:
        problems = ("<h2>Input problems</h2><ul class=\"problems\">"
                    + "".join(f"<li>{html.escape(str(problem))}</li>" for problem in report.problems) + "</ul>")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>{_CSS}</style></head>
<body>
<h1>{html.escape(title)}</h1>
<p>{report.span_count:,} spans from {html.escape(", ".join(report.services) or "unknown services")}.</p>
{cards}
<h2>Plots</h2>
<div class="plots">{"".join(plots)}</div>
<h2>Ranks</h2>
{ranks}
{hang}<h2>Alerts</h2>
{alerts}
{problems}
<h2>Summary</h2>
<pre>{html.escape(summary)}</pre>
</body></html>
"""
