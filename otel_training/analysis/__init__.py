"""Pure computations over spans, shared by the live goodput processor and the offline report.

No I/O and no OpenTelemetry SDK here: records in, numbers out, so the figure a
running job exports and the figure its report prints come from one
implementation.
"""

from otel_training.analysis.badput import BUCKETS, LABELLED_SPAN_NAMES, PRODUCTIVE, Timeline, span_label
from otel_training.analysis.goodput import GoodputAccount, RunAccountant, RunSummary, account
from otel_training.analysis.records import RunKey, SpanRecord
from otel_training.analysis.steps import MIN_STEPS, StepStats, ideal_step_time, normal_threshold, step_stats, times_step
from otel_training.analysis.stragglers import (
    LiveIndividual,
    StragglerScore,
    WindowScore,
    current_individual,
    straggler_scores,
)

__all__ = [
    "BUCKETS",
    "LABELLED_SPAN_NAMES",
    "MIN_STEPS",
    "PRODUCTIVE",
    "GoodputAccount",
    "LiveIndividual",
    "RunAccountant",
    "RunKey",
    "RunSummary",
    "SpanRecord",
    "StepStats",
    "StragglerScore",
    "Timeline",
    "WindowScore",
    "account",
    "current_individual",
    "ideal_step_time",
    "normal_threshold",
    "span_label",
    "step_stats",
    "straggler_scores",
    "times_step",
]
