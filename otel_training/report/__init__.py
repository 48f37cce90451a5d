"""``otel-training report``: goodput, step times, stragglers and alerts of a job, from its spans.

Reads OTLP JSON trace files (or Jaeger's query API), runs the shared
``otel_training.analysis`` computations, and renders a terminal summary, an
offline HTML page and a Chrome trace for Perfetto.
"""

from otel_training.report.chrome import write_chrome_trace
from otel_training.report.html import render_html
from otel_training.report.job import JobReport, assemble, build_report
from otel_training.report.reader import Problem, ReadResult, read_paths
from otel_training.report.summary import render_summary

__all__ = [
    "JobReport",
    "Problem",
    "ReadResult",
    "assemble",
    "build_report",
    "read_paths",
    "render_html",
    "render_summary",
    "write_chrome_trace",
]
