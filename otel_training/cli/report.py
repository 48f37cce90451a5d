"""``otel-training report``: a job's goodput, step times, stragglers and alerts from its traces."""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from otel_training.cli.args import fraction, seconds, whole

if TYPE_CHECKING:
    from otel_training.report.job import JobReport


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report", help="goodput, badput, step-time deviation, stragglers and alerts of a job's traces",
        description="Read the OTLP JSON trace files of every rank and restart of a job (files or directories), "
                    "or pull them from Jaeger, then print a summary and write an offline HTML report.")
    parser.add_argument("paths", nargs="*", metavar="PATH", help="trace files or directories (default: ./otel-traces)")
    parser.add_argument("--jaeger", metavar="URL", help="read from Jaeger's query API at URL instead of files")
    parser.add_argument("--service", metavar="NAME", help="service.name to fetch from Jaeger (with --jaeger)")
    parser.add_argument("--limit", type=whole("traces"), default=10_000,
                        help="traces to fetch from Jaeger (default: %(default)s)")
    parser.add_argument("--lookback", type=seconds(), default=None, metavar="SECONDS",
                        help="only Jaeger traces of the last SECONDS")
    parser.add_argument("--html", metavar="FILE", help="HTML report path (default: otel-training-report.html "
                        "next to the first input, or in the current directory)")
    parser.add_argument("--no-html", action="store_true", help="do not write the HTML report")
    parser.add_argument("--chrome", metavar="FILE", help="also write a Chrome trace (Perfetto, chrome://tracing)")
    parser.add_argument("--json", metavar="FILE", help="also write every figure of the summary as JSON (schema: "
                        "docs/report.md); - writes it to standard output instead of the summary")
    parser.add_argument("--job", metavar="ID", help="only spans of this training.job.id (default: of several jobs "
                        "in the input, the one that ran last)")
    parser.add_argument("--all-jobs", action="store_true", help="every job in the input as one report")
    parser.add_argument("--evaluation-is-productive", action="store_true", help="count evaluation as goodput")
    parser.add_argument("--ideal-step-time", type=seconds(), default=None, metavar="SECONDS",
                        help="ideal step time (default: mean of the normal steps)")
    parser.add_argument("--straggler-threshold", type=fraction, default=None, metavar="SCORE",
                        help="name ranks scoring below this (default: 0.75)")
    parser.add_argument("--straggler-window", type=_window, default=None, metavar="STEPS",
                        help="steps per straggler report window: each window of each rank is scored "
                             "(default: 10)")
    parser.add_argument("--workers", type=_workers, default=None, metavar="N",
                        help="processes reading trace files, one file each at a time (default: one per core)")
    progress = parser.add_mutually_exclusive_group()
    progress.add_argument("--progress", dest="progress", action="store_true", default=None,
                          help="always show a progress bar while reading")
    progress.add_argument("--no-progress", dest="progress", action="store_false", help="never show one")
    parser.set_defaults(handler=run)


_window = whole("steps")
_workers = whole("processes")


def default_html_path(paths: list[str]) -> Path:
    first = Path(paths[0]) if paths else Path.cwd()
    directory = first if first.is_dir() else first.parent
    return directory / "otel-training-report.html"


HTML_NEEDS = "the HTML report needs the report extra: pip install 'otel-training[report]'"


def html_available() -> bool:
    """The HTML plots need matplotlib, an extra: the summary never does."""
    return importlib.util.find_spec("matplotlib") is not None


def report_paths(paths: list[str], html_path: Path, *, job_id: str | None = None) -> tuple[str, Path | None]:
    """Summary of the traces under ``paths`` (of one job, if given), and the HTML report's path if written."""
    from otel_training.report import render_html, render_summary
    from otel_training.report.files import report_files
    from otel_training.report.html import prepare_plots

    html = html_available()
    report = report_files(paths, job_id=job_id, progress=False, meanwhile=prepare_plots if html else None)
    if not html:
        return render_summary(report), None
    html_path.parent.mkdir(parents=True, exist_ok=True)
    html_path.write_text(render_html(report), encoding="utf-8")
    return render_summary(report), html_path


def run(args: argparse.Namespace) -> int:
    from otel_training.analysis.stragglers import DEFAULT_THRESHOLD, WINDOW
    from otel_training.report import Problem, build_report
    from otel_training.report.files import report_files
    from otel_training.report.html import prepare_plots

    options: dict[str, Any] = {
        "evaluation_is_productive": args.evaluation_is_productive,
        "ideal_step_time_s": args.ideal_step_time,
        "straggler_threshold": DEFAULT_THRESHOLD if args.straggler_threshold is None else args.straggler_threshold,
        "straggler_window": WINDOW if args.straggler_window is None else args.straggler_window,
    }
    html = not args.no_html and html_available()
    if args.jaeger:
        if not args.service:
            print("otel-training report: --jaeger needs --service NAME", file=sys.stderr)
            return 2
        from otel_training.report.jaeger import spool

        # Jaeger's pages go to OTLP JSON files in end order, one per rank, read as any: bounded memory.
        with tempfile.TemporaryDirectory(prefix="otel-training-jaeger-") as scratch:
            spooled, problems = spool(args.jaeger, args.service, Path(scratch), limit=args.limit,
                                      lookback_s=args.lookback, progress=args.progress)
            if not spooled:
                report = build_report([], problems, **options)
            else:
                report = report_files(spooled, job_id=args.job, progress=args.progress, workers=args.workers,
                                      meanwhile=prepare_plots if html else None, **options)
                # The spooled files are gone once reported: their problems are Jaeger's answer's.
                report.problems[:] = problems + [
                    Problem(args.jaeger, None, problem.message) if problem.path.startswith(scratch) else problem
                    for problem in report.problems]
            return _write(args, report, [], spooled, html)
    # Files are streamed: per-rank aggregates in memory, not the spans (docs/report.md).
    paths = args.paths or ["./otel-traces"]
    report = report_files(paths, job_id=args.job, progress=args.progress, workers=args.workers,
                          meanwhile=prepare_plots if html else None, **options)
    latest = _latest_job(args, report)
    if latest is not None:  # several runs in one directory: the report of the one that ran last
        args.job = latest
        report = report_files(paths, job_id=latest, progress=args.progress, workers=args.workers, **options)
    return _write(args, report, paths, paths, html)


def _latest_job(args: argparse.Namespace, report: JobReport) -> str | None:
    """Of several jobs in the input (runs written into one directory), the one that ran last, said on standard
    error with the others; None when there is one, or ``--job``/``--all-jobs`` said which (issue 30: two runs
    read as one job with a restart, "recovery 19.4%, downtime 6.5%")."""
    if args.job is not None or args.all_jobs or len(report.job_ends) < 2:
        return None
    ordered = sorted(report.job_ends, key=report.job_ends.__getitem__)
    latest, others = ordered[-1], ordered[:-1]
    from otel_training._text import text

    print(f"otel-training report: these files hold {len(ordered)} jobs; this report is the one that ran last, "
          f"{text(latest)!r}; the others: {', '.join(repr(text(job)) for job in reversed(others))} "
          "(--job ID for one of them, --all-jobs for all of them as one)", file=sys.stderr)
    return latest


def _write(args: argparse.Namespace, report: JobReport, paths: list[str], spans_from: Sequence[str | Path],
           html: bool) -> int:
    """Print the summary, write the HTML page and the Chrome trace (of the spans in ``spans_from``)."""
    from otel_training._files import write_private
    from otel_training.report import render_html, render_summary, write_chrome_trace
    from otel_training.report.files import workers_available
    from otel_training.report.machine import render_json
    from otel_training.report.reader import stream_records

    to_stdout = args.json == "-"
    notes = sys.stderr if to_stdout else sys.stdout  # standard output holds the JSON alone
    if not report.span_count and not to_stdout:
        # Nothing read: the reasons, not an empty summary ("0 spans ... stragglers: none") with them last.
        for problem in report.problems:
            print(f"otel-training report: {problem}", file=sys.stderr)
        print("otel-training report: no spans to report on" + (f" in {', '.join(map(str, paths))}" if paths else ""),
              file=sys.stderr)
        return 1
    print(render_json(report) if to_stdout else render_summary(report), end="" if to_stdout else "\n")
    status = 0
    if args.json and not to_stdout:
        json_path = Path(args.json)
        if _written("--json", json_path, lambda: write_private(json_path, render_json(report))):
            print(f"json report: {json_path.resolve()}")
        else:
            status = 1
    if not report.span_count:
        print("otel-training report: no spans to report on", file=sys.stderr)
        return 1
    if not args.no_html and not html:
        print(f"otel-training report: {HTML_NEEDS}; use --no-html to silence this", file=sys.stderr)
    elif html:
        html_path = Path(args.html) if args.html else default_html_path(paths)
        if _written("--html", html_path, lambda: write_private(
                html_path, render_html(report, processes=args.workers or workers_available()))):
            print(f"html report: {html_path.resolve()}", file=notes)
        else:
            status = 1
    if args.chrome:
        spans = (record for record in stream_records(spans_from) if args.job is None or record.run.job_id == args.job)
        chrome_path = Path(args.chrome)
        counted: list[int] = []
        if _written("--chrome", chrome_path, lambda: counted.append(write_chrome_trace(spans, chrome_path))):
            print(f"chrome trace: {chrome_path.resolve()} ({counted[0]} spans; open in ui.perfetto.dev)", file=notes)
        else:
            status = 1
    return status


def _written(option: str, path: Path, write: Callable[[], object]) -> bool:
    """Run ``write``; False, with one line naming the option, the path and why, when the file cannot be written
    (the summary is printed already: the report is not lost, and no traceback reaches the user)."""
    try:
        write()
    except OSError as error:
        print(f"otel-training report: {option} {str(path)!r}: cannot write it: {error.strerror or error}",
              file=sys.stderr)
        return False
    return True
