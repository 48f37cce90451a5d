"""The stuck alerts as the HTML report shows them: their stretches on the timeline and their list.

Why apart from ``html.py``: what a stuck episode is (a stuck span's first alert, its repeats, its recovery)
is decided here once, for the timeline's stuck colour and for folding the repeats.
"""

from __future__ import annotations

import html
from datetime import datetime, timezone
from typing import Any

from otel_training import semconv as sc
from otel_training.report.job import JobReport


def _episode(alert: Any) -> tuple[Any, ...]:
    """The stuck span an alert is about: its repeats and its recovery name the same span id."""
    return alert.rank, alert.restart, alert.span_id or (alert.span_name, alert.step, alert.device)


def stuck_intervals(report: JobReport) -> list[tuple[int, int, int]]:
    """(rank, start ns, end ns) of each stuck stretch, as the goodput account counts it: from the threshold
    (the first alert's time less what it was past it) to the recovery, or to the end of the rank's run."""
    run_end: dict[tuple[int, int], int] = {}
    for run in report.goodput.runs:
        key = (run.key.rank, run.key.restart)
        run_end[key] = max(run_end.get(key, 0), run.end_ns)
    open_since: dict[tuple[Any, ...], int] = {}
    found: list[tuple[int, int, int]] = []
    for alert in sorted(report.alerts, key=lambda item: item.time_ns):
        key = _episode(alert)
        if alert.kind == sc.ALERT_KIND_STUCK and key not in open_since:
            past = 0.0
            if alert.elapsed_s is not None and alert.threshold_s is not None:
                past = max(0.0, alert.elapsed_s - alert.threshold_s)
            open_since[key] = alert.time_ns - int(past * 1e9)
        elif alert.kind == sc.ALERT_KIND_RECOVERED and key in open_since:
            found.append((alert.rank, open_since.pop(key), alert.time_ns))
    for key, since in open_since.items():
        found.append((key[0], since, max(since, run_end.get((key[0], key[1]), report.end_ns))))
    return found


def alerts_html(report: JobReport) -> str:
    """The alerts section: each stuck span's first alert open with its stacks, its repeats folded."""
    if not report.alerts:
        return "<p>No stuck or recovered alerts.</p>"
    items = []
    alerted: set[tuple[Any, ...]] = set()
    for alert in report.alerts:
        when = datetime.fromtimestamp(alert.time_ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        elapsed = "" if alert.elapsed_s is None else f" after {alert.elapsed_s:.1f} s"
        key = _episode(alert)
        # The first alert of a stuck span shows its stacks; its repeats (every escalation, the same stacks as
        # often as not) are folded, so a long hang is one open entry, not thirty.
        repeat = alert.kind == sc.ALERT_KIND_STUCK and key in alerted
        if alert.kind == sc.ALERT_KIND_STUCK:
            alerted.add(key)
        elif alert.kind == sc.ALERT_KIND_RECOVERED:
            alerted.discard(key)
        title = (f"{when} — rank {alert.rank}, restart {alert.restart}: {alert.about} {alert.kind}{elapsed}"
                 + (" (repeat)" if repeat else ""))
        stacks = f"<pre>{html.escape(alert.stacks)}</pre>" if alert.stacks else ""
        opened = " open" if stacks and not repeat else ""
        items.append(f"<details{opened}><summary>{html.escape(title)}</summary>{stacks}</details>")
    return "".join(items)
