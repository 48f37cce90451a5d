"""The terminal summary: the answers first (goodput, where the rest went, who is slow), details after.

Everything taken from the traces (job ids, span names, stacks, file names and
what problems quote of them) is printed with its control characters escaped:
a trace is input anyone may have written, and the terminal obeys escape
sequences.
"""

from __future__ import annotations

from otel_training import semconv as sc
from otel_training._text import escape_controls as _safe
from otel_training.analysis import PRODUCTIVE
from otel_training.report.job import JobReport


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1000:.1f} ms"


def render_summary(report: JobReport, *, max_stack_lines: int = 12) -> str:
    lines: list[str] = []
    add = lines.append
    account = report.goodput
    jobs = ", ".join(_safe(job_id) for job_id in report.job_ids) or "(no training.job.id)"
    ranks = sorted({run.key.rank for run in account.runs})
    add(f"job {jobs}: {report.span_count} spans, {len(ranks)} rank(s), {account.restarts} restart(s), "
        f"{len(account.runs)} run(s) of a rank")
    if len(report.job_ids) > 1:
        add("  warning: spans of several jobs are mixed; pass only one job's files for job-level figures")
    if account.goodput is None:
        add("goodput: no trainer spans")
    else:
        add(f"goodput: {account.goodput:.1%} of {_duration(account.total_s)} accelerator time "
            f"({_duration(account.seconds.get(PRODUCTIVE, 0.0))} productive)")
        loop = account.training_goodput
        if loop is not None:  # what the loop itself achieved: a short job's start-up dominates the job's figure
            add(f"training loop goodput: {loop:.1%} (the job's time without program start-up and compilation)")
        add("badput:")
        for bucket, seconds in sorted(account.badput.items(), key=lambda item: -item[1]):
            if seconds > 0:
                add(f"  {bucket:<20} {_duration(seconds):>10}  {seconds / account.total_s:6.1%}")
        if report.data_wait_s > 0:
            # On a device timeline most host waits overlap device work and cost nothing: say both.
            add(f"data: host waits for batches {_duration(report.data_wait_s)}, time lost to them (data_loading) "
                f"{_duration(account.badput.get(sc.BADPUT_DATA_LOADING, 0.0))}")
    if report.job_steps is not None:
        stats = report.job_steps
        ideal = "-" if report.ideal_step_s is None else _ms(report.ideal_step_s)
        # The spread as the median absolute deviation: one stuck step among forty moves the mean by its whole
        # length (a "mean deviation" of 20 ms beside a 20.2 ms median), not the MAD.
        mean = f", mean {_ms(stats.mean)} (pulled by the abnormal steps)" if stats.abnormal else ""
        add(f"steps: {stats.count}, median {_ms(stats.median)}, p90 {_ms(stats.p90)}, MAD {_ms(stats.mad)}, "
            f"ideal {ideal}, {stats.abnormal} abnormal (> median + 3 MAD){mean}")
        add(f"  {'rank':>4} {'steps':>6} {'median':>10} {'p90':>10} {'MAD':>10} "
            f"{'relative':>8} {'individual':>10}")
        scores = {score.rank: score for score in report.stragglers}
        for rank, rank_stats in report.rank_steps.items():
            score = scores.get(rank)
            add(f"  {rank:>4} {rank_stats.count:>6} {_ms(rank_stats.median):>10} {_ms(rank_stats.p90):>10} "
                f"{_ms(rank_stats.mad):>10} {score.relative if score else 1:>8.2f} "
                f"{score.individual if score else 1:>10.2f}{'  straggler' if score and score.straggler else ''}")
    stragglers = report.straggler_ranks
    add("stragglers: " + (", ".join(f"rank {rank}" for rank in stragglers) if stragglers else "none"))
    lines.extend(f"  {line}" for line in report.straggler_lines())
    shared = report.job_slow_window_lines()
    if shared:
        add("slow windows of the whole job (no straggler: most ranks, or the only one, slowed down together):")
        lines.extend(f"  {_safe(line)}" for line in shared)
    lines.extend(_safe(line) for line in report.hang_episode_lines)
    lines.extend(_safe(line) for line in report.hang)
    if report.alerts:
        add(f"alerts: {len(report.alerts)}")
        for alert in report.alerts:
            elapsed = "" if alert.elapsed_s is None else f" after {alert.elapsed_s:.1f} s"
            threshold = "" if alert.threshold_s is None else f" (threshold {alert.threshold_s:.1f} s)"
            add(f"  rank {alert.rank} restart {alert.restart}: {_safe(alert.about)} {_safe(alert.kind)}"
                f"{elapsed}{threshold}")
            stack_lines = alert.stacks.splitlines()
            for stack_line in stack_lines[:max_stack_lines]:
                add(f"    | {_safe(stack_line)}")
            if len(stack_lines) > max_stack_lines:
                add(f"    | ... {len(stack_lines) - max_stack_lines} more lines (see the HTML report)")
    if report.problems:
        add(f"input problems ({len(report.problems)}); everything else was used:")
        lines.extend(f"  {_safe(problem)}" for problem in report.problems)
    return "\n".join(lines)
