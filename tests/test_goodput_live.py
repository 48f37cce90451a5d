"""Live goodput through a hang (issue 30, item 13): the ratio falls and ``stuck`` rises at every
collection while a step is stuck, and the recovery (or the end of the life) settles to the report's figures.

The fake-time tests drive one clock: the spans' timestamps (the SDK's ``time_ns``), the stuck
detector's monotonic clock (scans by ``tick()``) and the goodput processor's collections all read
it, so a 90 s hang takes no time and no sleep. The last test runs the real pipelines, in-process
and offloaded, with their own threads and processes, and waits on conditions only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk import trace as sdk_trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from waiting import wait_until

import otel_training
from otel_training import _ring
from otel_training import semconv as sc
from otel_training.analysis import RunKey, SpanRecord, account
from otel_training.processors.goodput import GoodputSpanProcessor
from otel_training.processors.stuck import StuckSpanProcessor
from otel_training.processors.stuck_options import StuckOptions

THRESHOLD_S = 30.0
#: The hung step starts here; the steps before it ran from 2 s to this (10 of 2 s, after 2 s of init).
HUNG_AT = 22.0
CROSSED_AT = HUNG_AT + THRESHOLD_S


class Job:
    """One life on one fake clock: the stuck detector and the live goodput in one SDK pipeline."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        # Wall time an hour ahead of the real clock: the stuck detector judges a span begun more than
        # 50 ms before the real now as replayed, so the fake clock must never lag behind it.
        self.origin_ns = time.time_ns() + 3600 * 10**9
        self.t = 0.0
        monkeypatch.setattr(sdk_trace, "time_ns", self.wall_ns)  # span starts and ends, alert spans too
        self.reader = InMemoryMetricReader()
        self.provider = TracerProvider()
        self.exporter = InMemorySpanExporter()
        # As install_plugins adds them: the detector, then the goodput processor.
        self.stuck = StuckSpanProcessor(THRESHOLD_S, options=StuckOptions(first_threshold_s=THRESHOLD_S, stacks=False),
                                        clock=lambda: self.t, watcher=False, tracer_provider=self.provider,
                                        meter_provider=MeterProvider())
        self.goodput = GoodputSpanProcessor(MeterProvider(metric_readers=[self.reader]), clock=self.wall_ns,
                                            origin_ns=self.origin_ns, settle_in_background=False)
        for processor in (self.stuck, self.goodput, SimpleSpanProcessor(self.exporter)):
            self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer("test")

    def wall_ns(self) -> int:
        return self.origin_ns + round(self.t * 1e9)

    def at(self, t: float) -> Job:
        self.t = t
        self.stuck.tick()  # the watcher's scan, at this time
        return self

    def run_until_the_hang(self) -> Any:
        """2 s of init, 10 steps of 2 s, then a step that hangs at ``HUNG_AT``; returns the hung step."""
        self.tracer.start_span(sc.SPAN_INIT).end(end_time=self.wall_ns() + 2 * 10**9)
        for index in range(10):
            self.at(2.0 + 2 * index)
            step = self.tracer.start_span(sc.SPAN_STEP, attributes={sc.STEP: index})
            self.at(4.0 + 2 * index)
            step.end()
        return self.tracer.start_span(sc.SPAN_STEP, attributes={sc.STEP: 10})

    def collect(self) -> tuple[float, float, float]:
        """One metric collection: (goodput ratio, productive s, stuck s)."""
        metrics = {metric.name: list(metric.data.data_points)
                   for resource_metrics in self.reader.get_metrics_data().resource_metrics
                   for scope_metrics in resource_metrics.scope_metrics for metric in scope_metrics.metrics}
        badput = {point.attributes[sc.BADPUT_BUCKET]: point.value for point in metrics[sc.METRIC_BADPUT]}
        return (metrics[sc.METRIC_GOODPUT][0].value, metrics[sc.METRIC_GOODPUT_TIME][0].value,
                badput[sc.BADPUT_STUCK])

    def live_seconds(self) -> dict[str, float]:
        return {label: ns / 1e9 for label, ns in self.goodput.settle().items() if ns}

    def report(self) -> Any:
        """``otel-training report``'s account of the spans this life exported."""
        key = RunKey("job", 0, 0, "run", "instance", self.origin_ns)
        return account([_record(span, key) for span in self.exporter.get_finished_spans()])


def _record(span: ReadableSpan, key: RunKey) -> SpanRecord:
    return SpanRecord(span.name, span.start_time, span.end_time, key,  # type: ignore[arg-type]
                      attributes=dict(span.attributes or {}), span_id=format(span.context.span_id, "016x"),
                      error=span.status.status_code is StatusCode.ERROR)


@pytest.fixture
def job(monkeypatch: pytest.MonkeyPatch) -> Iterator[Job]:
    made = Job(monkeypatch)
    yield made
    made.provider.shutdown()


def _hang_for_90_s(job: Job) -> list[tuple[float, float, float]]:
    """Collections every 10 s from the threshold crossing to 90 s of stuck time."""
    job.at(CROSSED_AT)  # the scan at the crossing alerts
    assert [span.attributes[sc.ALERT_KIND] for span in job.exporter.get_finished_spans()
            if span.name == sc.SPAN_ALERT] == [sc.ALERT_KIND_STUCK]
    collected = []
    for index in range(1, 10):
        collected.append(job.at(CROSSED_AT + 10 * index).collect())
    return collected


def _assert_falls_and_rises(collected: list[tuple[float, float, float]]) -> None:
    for index, (ratio, productive, stuck) in enumerate(collected, start=1):
        elapsed_s = CROSSED_AT + 10 * index
        assert stuck == pytest.approx(10 * index), index  # the time since the threshold crossing
        assert productive == pytest.approx(20.0)  # the 10 steps before the hang; the hung one is not settled
        # The settled time (up to the hung step's start) plus the stuck stretch: only the hung step's
        # first 30 s, which are productive if it ends and not if it never does, wait.
        assert ratio == pytest.approx(20.0 / (HUNG_AT + elapsed_s - CROSSED_AT)), index
    ratios = [ratio for ratio, _, _ in collected]
    assert ratios == sorted(ratios, reverse=True) and len(set(ratios)) == len(ratios)


def _assert_agrees(live: dict[str, float], report: Any) -> None:
    for label, seconds in report.seconds.items():
        assert live.get(label, 0.0) == pytest.approx(seconds, abs=1e-6), label
    assert set(live) <= set(report.seconds)


def test_a_hang_moves_the_live_metrics_and_its_recovery_settles_to_the_report(job: Job) -> None:
    hung = job.run_until_the_hang()
    assert job.at(HUNG_AT + 20).collect()[2] == 0  # below the threshold: not stuck
    collected = _hang_for_90_s(job)
    _assert_falls_and_rises(collected)
    alerts = [span for span in job.exporter.get_finished_spans() if span.name == sc.SPAN_ALERT]
    assert len(alerts) == 4  # the first at the crossing, repeats every 30 s: counted once

    job.at(CROSSED_AT + 93)
    hung.end()  # recovered: its recovered alert, then the report's accounting
    ratio, productive, stuck = job.collect()
    assert stuck == pytest.approx(93.0) and stuck > collected[-1][2]
    assert productive == pytest.approx(50.0)  # the hung step's 30 s before its threshold now count
    assert ratio == pytest.approx(50.0 / (CROSSED_AT + 93))
    report = job.report()
    _assert_agrees(job.live_seconds(), report)
    assert report.goodput == pytest.approx(ratio)
    assert report.seconds[sc.BADPUT_STUCK] == pytest.approx(93.0)


def test_a_hang_still_open_at_the_end_settles_at_shutdown_as_the_report_counts_it(job: Job) -> None:
    process = job.tracer.start_span(sc.SPAN_PROCESS)
    job.run_until_the_hang()
    _assert_falls_and_rises(_hang_for_90_s(job))

    job.at(CROSSED_AT + 93)
    process.end()  # the lifecycle ends the process span at shutdown; the hung step is never exported
    job.provider.shutdown()  # the goodput processor's shutdown ends the life, before the last collection
    ratio, productive, stuck = job.collect()
    assert stuck == pytest.approx(93.0)
    assert productive == pytest.approx(20.0)
    report = job.report()
    # The hung step's first 30 s: no span covers them in what was exported.
    assert report.seconds[sc.BADPUT_HOST_OUTSIDE_STEPS] == pytest.approx(30.0)
    _assert_agrees(job.live_seconds(), report)
    assert report.goodput == pytest.approx(ratio)
    job.at(CROSSED_AT + 200)
    assert job.collect() == (ratio, productive, stuck)  # the life ended: its figures stay


def test_the_recovery_settles_the_stretch_once_and_later_collections_keep_it(job: Job) -> None:
    """The span's end and its recovered alert both close the stretch: counted once, and no longer open."""
    hung = job.run_until_the_hang()
    assert job.at(CROSSED_AT + 5).collect()[2] == pytest.approx(5.0)  # the first scan after the crossing
    job.at(CROSSED_AT + 8)
    hung.end()
    assert job.collect()[2] == pytest.approx(8.0)
    _assert_agrees(job.live_seconds(), job.report())  # now is the last span's end: the report's end
    for later in (10.0, 20.0):
        assert job.at(CROSSED_AT + later).collect()[2] == pytest.approx(8.0)


def test_a_stuck_span_whose_end_arrives_late_never_takes_back_stuck_time_shown(job: Job) -> None:
    """An offloaded drain replays a span's end a little late: a collection in between counted its stretch
    up to then, past the end. A counter that went down would read as a reset to Prometheus."""
    hung = job.run_until_the_hang()
    assert job.at(CROSSED_AT + 10).collect()[2] == pytest.approx(10.0)
    hung.end(end_time=job.wall_ns() - 2 * 10**9)  # ended at +8, seen at +10
    job.at(CROSSED_AT + 12)
    ratio, productive, stuck = job.collect()
    assert stuck == pytest.approx(10.0)  # not 8: what was shown stays
    assert productive == pytest.approx(50.0)
    assert ratio == pytest.approx(50.0 / (CROSSED_AT + 12 + 2))  # the 2 s shown twice stay in the total


def test_a_stuck_span_no_label_covers_holds_the_settled_time_at_its_crossing(job: Job) -> None:
    """A watched span without a label of its own (here a collective, watched by a rule): time after
    its crossing is not settled as something else before its recovery says it was stuck."""
    job.stuck.rules = StuckSpanProcessor(THRESHOLD_S, ["training.collective"],
                                         StuckOptions(first_threshold_s=THRESHOLD_S)).rules
    job.tracer.start_span(sc.SPAN_INIT).end(end_time=job.wall_ns() + 2 * 10**9)
    job.at(2.0)
    job.tracer.start_span(sc.SPAN_STEP).end(end_time=job.wall_ns() + 2 * 10**9)
    job.at(4.0)
    collective = job.tracer.start_span("training.collective")
    job.at(4.0 + THRESHOLD_S)  # crossed: alerted
    _, _, stuck = job.at(4.0 + THRESHOLD_S + 10).collect()
    assert stuck == pytest.approx(10.0)
    job.at(4.0 + THRESHOLD_S + 12)
    collective.end()
    _, _, stuck = job.collect()
    assert stuck == pytest.approx(12.0)
    _assert_agrees(job.live_seconds(), job.report())


# -- the real pipelines: the collector's threads, the drain process ----------------------------------------


def _exports(path: Path) -> list[tuple[float, float, float]]:
    """(goodput ratio, stuck s, productive s) of every export in a metrics file written by the file exporter."""
    found = []
    if not path.exists():
        return found
    for line in path.read_text().splitlines():
        try:
            batch = json.loads(line)
        except ValueError:
            continue  # a line being written
        metrics = {metric["name"]: metric for resource_metrics in batch["resourceMetrics"]
                   for scope_metrics in resource_metrics["scopeMetrics"] for metric in scope_metrics["metrics"]}
        if sc.METRIC_GOODPUT not in metrics or sc.METRIC_BADPUT not in metrics:
            continue
        ratio = metrics[sc.METRIC_GOODPUT]["gauge"]["dataPoints"][0]["asDouble"]
        stuck = [point.get("asDouble", 0.0) for point in metrics[sc.METRIC_BADPUT]["sum"]["dataPoints"]
                 if {"key": sc.BADPUT_BUCKET, "value": {"stringValue": sc.BADPUT_STUCK}} in point["attributes"]]
        productive = [point.get("asDouble", 0.0) for point in metrics[sc.METRIC_GOODPUT_TIME]["sum"]["dataPoints"]
                      ] if sc.METRIC_GOODPUT_TIME in metrics else []
        found.append((ratio, stuck[0] if stuck else 0.0, sum(productive)))
    return found


def _settled_hung(path: Path) -> list[tuple[float, float, float]]:
    """The exports that saw the hang and the same productive time as the last: the steps before a hang fold in
    at the collection after they end, which on a loaded machine can be one of the first to see the hang."""
    hung = [export for export in _exports(path) if export[1] > 0]
    if not hung or hung[-1][2] <= 0:  # nothing productive folded in yet: a ratio of 0 has nowhere to fall
        return []
    return [export for export in hung if export[2] == hung[-1][2]]


@pytest.mark.parametrize("offload", [False, True], ids=["in-process", "offloaded"])
def test_the_real_pipeline_moves_during_a_hang(configure: Any, monkeypatch: pytest.MonkeyPatch,
                                               offload: bool) -> None:
    if offload and _ring.supported() is not None:
        pytest.skip(f"offload unavailable: {_ring.supported()}")
    from otel_training.report.reader import read_paths

    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "100")  # the drain inherits it
    telemetry = configure(exporter="file", offload=offload, stuck_threshold_s=0.5)
    # A drain still starting replays the first steps late, and its detector may alert on them: not this test.
    assert not offload or telemetry.drain_ready(timeout_s=60)
    output = Path(telemetry.options["output_dir"])
    metrics = output / ("metrics-r0.drain.jsonl" if offload else "metrics-r0.jsonl")
    trainer = otel_training.TrainerProcess()
    with trainer.train():
        for step in range(5):
            with trainer.step(global_step=step):
                pass
        with trainer.step(global_step=5):  # hangs until the stuck time rose between two exports that saw it, the
            # earlier steps folded in (a collection may repeat the last one's figures on a loaded machine)
            assert wait_until(lambda: len({stuck for _, stuck, _ in _settled_hung(metrics)}) >= 2, timeout_s=60)
            during = _exports(metrics)  # before the step ends: its end folds its time in
    hung = [export for export in during if export[1] > 0]
    assert [stuck for _, stuck, _ in hung] == sorted(stuck for _, stuck, _ in hung)  # rising...
    assert hung[-1][1] > hung[0][1]
    settled = [export for export in hung if export[2] == hung[-1][2] > 0]
    # ...and, with no productive time added, the ratio falls wherever the stuck time rose
    rises = [(earlier, later) for earlier, later in zip(settled, settled[1:]) if later[1] > earlier[1]]
    assert rises and all(later[0] < earlier[0] for earlier, later in rises), settled
    telemetry.shutdown(timeout_s=10)
    final_ratio, final_stuck, _ = _exports(metrics)[-1]
    report = account(read_paths([telemetry.trace_path]).records)
    assert final_stuck == pytest.approx(report.seconds[sc.BADPUT_STUCK], abs=1e-3)
    assert final_stuck >= hung[-1][1]
    # The life ends a little after its last span (the process's) in the live view: its shutdown.
    assert final_ratio == pytest.approx(report.goodput, rel=0.2)
