"""``otel-training report --json``: every figure the terminal summary prints, for CI dashboards and notebooks.

Why a module of its own: the summary (``summary.py``) is for people and may change its wording; this is a
contract, versioned by ``SCHEMA`` and documented field by field in docs/report.md. Times are seconds,
shares are fractions (0.546, not "54.6%"), timestamps are nanoseconds since the epoch, and a figure that
does not exist (no steps, no ideal step time) is null, never omitted.
"""

from __future__ import annotations

import json
import math
from typing import Any

from otel_training import semconv as sc
from otel_training.analysis import PRODUCTIVE
from otel_training.analysis.hang_episodes import Episode
from otel_training.analysis.steps import StepStats
from otel_training.report.job import JobReport

#: Bumped when a field changes meaning or goes; new fields may be added within a version.
SCHEMA = "otel-training.report/1"


def _steps(stats: StepStats | None) -> dict[str, Any] | None:
    if stats is None:
        return None
    return {"count": stats.count, "median_s": stats.median, "p90_s": stats.p90, "mad_s": stats.mad,
            "mean_s": stats.mean, "min_s": stats.minimum, "max_s": stats.maximum, "abnormal": stats.abnormal}


def report_json(report: JobReport) -> dict[str, Any]:
    """The report as plain JSON values (``SCHEMA``)."""
    account = report.goodput
    scores = {score.rank: score for score in report.stragglers}
    ranks = []
    for rank, stats in report.rank_steps.items():
        score = scores.get(rank)
        ranks.append({"rank": rank, "steps": _steps(stats), "relative_score": score.relative if score else 1.0,
                      "individual_score": score.individual if score else 1.0,
                      "straggler": bool(score and score.straggler)})
    return {
        "schema": SCHEMA,
        "job_ids": list(report.job_ids),
        "services": list(report.services),
        "span_count": report.span_count,
        "duplicate_spans": report.duplicate_spans,
        "start_ns": report.start_ns,
        "end_ns": report.end_ns,
        "ranks": sorted({run.key.rank for run in account.runs}),
        "restarts": account.restarts,
        "runs": len(account.runs),
        "goodput": {
            "job": account.goodput,
            "training_loop": account.training_goodput,
            "accelerator_s": account.total_s,
            "productive_s": account.seconds.get(PRODUCTIVE, 0.0),
            "badput_s": dict(account.badput),
        },
        "data": {"host_wait_s": report.data_wait_s,
                 "lost_s": account.badput.get(sc.BADPUT_DATA_LOADING, 0.0)},
        "steps": {
            "job": _steps(report.job_steps),
            "ideal_s": report.ideal_step_s,
            "normal_threshold_s": report.normal_threshold_s,
            "ranks": ranks,
        },
        "stragglers": {"ranks": report.straggler_ranks, "window_steps": report.straggler_window,
                       "threshold": report.straggler_threshold, "lines": report.straggler_lines(),
                       "job_slow_windows": report.job_slow_window_lines(),
                       "gpu": [{"rank": rank, "window": index + 1, "explanation": text}
                               for rank, (index, text) in sorted(report.straggler_gpu().items())]},
        "hang": list(report.hang),
        "hang_episodes": [_episode(job_id, run_id, episode, report.end_ns)
                          for (job_id, run_id), episodes in report.hang_episodes.items() for episode in episodes],
        "alerts": [{"rank": alert.rank, "restart": alert.restart, "time_ns": alert.time_ns, "kind": alert.kind,
                    "span_name": alert.span_name, "step": alert.step, "device": alert.device or None,
                    "elapsed_s": alert.elapsed_s, "threshold_s": alert.threshold_s, "stacks": alert.stacks}
                   for alert in report.alerts],
        "problems": [{"path": problem.path, "line": problem.line, "message": problem.message}
                     for problem in report.problems],
    }


def _episode(job_id: str, run_id: str, episode: Episode, end_ns: int) -> dict[str, Any]:
    result = episode.verdict
    return {"job_id": job_id, "run_id": run_id, "begin_ns": episode.begin_ns, "end_ns": episode.end_ns,
            "seconds": episode.seconds(end_ns), "recovered": episode.recovered, "ranks": list(episode.ranks),
            "steps": list(episode.steps), "verdict": result.summary,
            "culprits": [{"rank": culprit.rank, "reason": culprit.reason, "group": culprit.group or None,
                          "detail": culprit.detail} for culprit in result.culprits],
            "no_single_culprit": result.no_single_culprit,
            "collective": {"group": result.group, "seq": result.seq, "op": result.op} if result.group else None,
            "waiting": {str(rank): list(culprits) for rank, culprits in result.waiting.items()},
            "gpu": {str(rank): text for rank, text in sorted(result.gpu.items())}}


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


def render_json(report: JobReport) -> str:
    """``report_json`` as text: strict JSON (a NaN or infinity, which no figure should be, becomes null)."""
    return json.dumps(_finite(report_json(report)), indent=2, allow_nan=False) + "\n"
