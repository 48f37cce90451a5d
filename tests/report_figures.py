"""Every figure a report shows, as JSON: what "the results did not move" compares.

Works on the report of any version of ``otel_training.report`` (it reads only the
fields every version has), so frozen figures can be produced by the code before a
change and compared with the code after it.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def _frozen(stats: Any) -> dict[str, Any]:
    """A StepStats as the frozen file holds it: the fields it had (the MAD came later; test_report_scale checks
    the streamed report's against the in-memory one's)."""
    return {name: value for name, value in dataclasses.asdict(stats).items() if name != "mad"}


def figures(report: Any) -> dict[str, Any]:
    account = report.goodput
    return {
        "job_ids": report.job_ids,
        "services": report.services,
        "span_count": report.span_count,
        "start_ns": report.start_ns,
        "end_ns": report.end_ns,
        "seconds": list(account.seconds.items()),
        "goodput": account.goodput,
        "runs": [[run.key.rank, run.key.restart, run.key.run_id, run.start_ns, run.end_ns, run.failed,
                  list(run.seconds.items())] for run in account.runs],
        "ideal_step_s": report.ideal_step_s,
        "normal_threshold_s": report.normal_threshold_s,
        "rank_steps": [[rank, _frozen(stats)] for rank, stats in report.rank_steps.items()],
        "job_steps": None if report.job_steps is None else _frozen(report.job_steps),
        # Windows as a list of dicts, whether a version keeps them as a tuple or a compact sequence.
        # (``shared_windows``, the job-wide slow windows, came later: test_stragglers covers them.)
        "stragglers": [{field.name: ([dataclasses.asdict(window) for window in getattr(score, field.name)]
                                     if field.name in ("windows", "slow_windows")
                                     else getattr(score, field.name))
                        for field in dataclasses.fields(score) if field.name != "shared_windows"}
                       for score in report.stragglers],
        "straggler_lines": report.straggler_lines(),
        "window_labels": [report.window_label(score.rank, score.worst_window) for score in report.stragglers
                          if score.worst_window is not None],
        # The alerts' fields the frozen file has (the stuck span's id came later).
        "alerts": [{name: value for name, value in dataclasses.asdict(alert).items() if name != "span_id"}
                   for alert in report.alerts],
    }


#: name -> (how to write the traces, report options). Each writes into the directory it is given.
CASES: dict[str, tuple[Any, dict[str, Any]]] = {
    "crafted": (lambda directory: __import__("goodput_traces").write_otlp(directory), {}),
    "job-3-ranks-2-restarts": (lambda directory: _job(directory, 6_000, 3, 2, 1), {}),
    "job-8-ranks-1-restart": (lambda directory: _job(directory, 20_000, 8, 1, 2), {}),
    "job-1-rank": (lambda directory: _job(directory, 3_000, 1, 0, 3), {}),
    "job-options": (lambda directory: _job(directory, 6_000, 4, 1, 4),
                    {"evaluation_is_productive": True, "straggler_window": 7, "straggler_threshold": 0.8}),
    "job-configured-ideal": (lambda directory: _job(directory, 4_000, 2, 1, 5), {"ideal_step_time_s": 0.1}),
}


def _job(directory: Any, spans: int, ranks: int, restarts: int, seed: int) -> None:
    from report_job import generate

    generate(directory, spans, ranks, restarts, seed)


def main() -> None:
    """Freeze the figures of the code on the path: run with the version to compare against first.

    cd /tmp && PYTHONPATH=<that version>:<this checkout>/tests:<this checkout>/bench python <this checkout>/tests/report_figures.py OUT

    (from outside any checkout: the current directory comes first on the path). The frozen file
    tests/fixtures/report_figures.json holds the figures of main before the report streamed.
    """
    import json
    import sys
    import tempfile
    from pathlib import Path

    from otel_training.report import build_report, read_paths

    frozen = {}
    for name, (write, options) in CASES.items():
        with tempfile.TemporaryDirectory() as scratch:
            write(Path(scratch) / "traces")
            result = read_paths([Path(scratch) / "traces"], progress=False)
            assert not result.problems, result.problems
            frozen[name] = figures(build_report(result.records, result.problems, **options))
    Path(sys.argv[1]).write_text(json.dumps(frozen) + "\n")


if __name__ == "__main__":
    main()
