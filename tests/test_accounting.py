"""Issue 9's timelines: wasted progress from the restored checkpoint, a hard-killed life's start-up,
restarts' start-up as recovery, the live ideal step time, two lives under one run id, and the first
step's compilation; live metrics and the report on the same spans agree.

Every timeline is built with explicit timestamps (seconds from a fixed origin).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from environ import child_environ
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from otel_training import semconv as sc
from otel_training.analysis import RunKey, SpanRecord, account, ideal_step_time
from otel_training.analysis.records import iso_ns
from otel_training.config.resource import build_resource
from otel_training.processors.goodput import GoodputSpanProcessor

ORIGIN_NS = 1_700_000_000 * 10**9


def s(seconds: float) -> int:
    return ORIGIN_NS + int(round(seconds * 1e9))


class Life:
    """Records of one life of one rank, built in time order."""

    def __init__(self, restart: int, instance: str, *, run_id: str = "", created: float | None = None) -> None:
        self.key = RunKey("job", 0, restart, run_id or f"job-{restart}", instance,
                          s(created) if created is not None else 0)
        self.records: list[SpanRecord] = []

    def span(self, name: str, start: float, end: float, error: bool = False, **attributes) -> SpanRecord:
        record = SpanRecord(name, s(start), s(end), self.key, attributes=dict(attributes),
                            span_id=f"{len(self.records) + 1:016x}", error=error)
        self.records.append(record)
        return record

    def steps(self, first_step: int, start: float, count: int, length: float) -> float:
        for index in range(count):
            self.span(sc.SPAN_STEP, start + index * length, start + (index + 1) * length, **{sc.STEP: first_step + index})
        return start + count * length


# -- 1. wasted progress counts from the checkpoint the next life restored --------------------------------


def test_wasted_progress_counts_from_the_restored_checkpoint() -> None:
    # Life 0 saves at step 9 and at step 19 (whose persist never finished), runs 4 more steps and
    # crashes; life 1 restores step 9. Steps 10-23 (28 s) were lost, not just 20-23 (8 s).
    crashed = Life(0, "a")
    crashed.span(sc.SPAN_PROCESS, 0, 50, error=True)
    t = crashed.steps(0, 0, 10, 2.0)
    crashed.span(sc.SPAN_SAVE_CHECKPOINT, t, t + 1, **{sc.CHECKPOINT_STEP: 9})
    t = crashed.steps(10, t + 1, 10, 2.0)
    crashed.span(sc.SPAN_SAVE_CHECKPOINT, t, t + 1, **{sc.CHECKPOINT_STEP: 19})
    crashed.steps(20, t + 1, 4, 2.0)
    restarted = Life(1, "b")
    restarted.span(sc.SPAN_TRAIN, 60, 82)
    restarted.span(sc.SPAN_LOAD_CHECKPOINT, 60, 62, **{sc.CHECKPOINT_STEP: 9})
    restarted.steps(10, 62, 10, 2.0)
    result = account(crashed.records + restarted.records)
    assert result.seconds[sc.BADPUT_WASTED_PROGRESS] == pytest.approx(28.0)
    assert result.runs[0].seconds["productive"] == pytest.approx(20.0)  # steps 0-9 survived


def test_a_restored_step_without_a_save_in_the_crashed_life_keeps_up_to_that_step() -> None:
    # The crashed life's save spans are missing (saved by a framework we do not see): the step the
    # next life restored still says how far progress was kept.
    crashed = Life(0, "a")
    crashed.span(sc.SPAN_PROCESS, 0, 30, error=True)
    crashed.steps(0, 0, 15, 2.0)
    restarted = Life(1, "b")
    restarted.span(sc.SPAN_LOAD_CHECKPOINT, 40, 41, **{sc.CHECKPOINT_STEP: 9})
    restarted.steps(10, 41, 5, 2.0)
    result = account(crashed.records + restarted.records)
    assert result.seconds[sc.BADPUT_WASTED_PROGRESS] == pytest.approx(10.0)  # steps 10-14


def test_without_a_restore_the_last_save_is_kept() -> None:
    crashed = Life(0, "a")
    crashed.span(sc.SPAN_PROCESS, 0, 30, error=True)
    t = crashed.steps(0, 0, 10, 2.0)
    crashed.span(sc.SPAN_SAVE_CHECKPOINT, t, t + 1, **{sc.CHECKPOINT_STEP: 9})
    crashed.steps(10, t + 1, 4, 2.0)
    fresh = Life(1, "b")
    fresh.steps(0, 40, 5, 2.0)
    assert account(crashed.records + fresh.records).seconds[sc.BADPUT_WASTED_PROGRESS] == pytest.approx(8.0)


# -- 2. a hard-killed life keeps its start-up ------------------------------------------------------------


def test_a_life_killed_without_warning_keeps_its_start_up() -> None:
    # SIGKILLed: its training.process span never ended, so nothing covers 0-3 s but the process's
    # creation time on the resource says the life began at 0.
    killed = Life(0, "a", created=0.0)
    killed.span(sc.SPAN_INIT, 3, 5)
    killed.steps(0, 5, 5, 2.0)
    result = account(killed.records)
    assert result.runs[0].start_ns == s(0)
    assert result.seconds[sc.BADPUT_PROGRAM_STARTUP] == pytest.approx(3.0)
    assert result.total_s == pytest.approx(15.0)


def test_the_resource_carries_the_creation_time() -> None:
    import time

    # A process started now says it was created now: between the spawn and its answer (10 ms ticks).
    # (Not this process: under `.ci/run` pytest is exec'd by the set-up script, so its creation
    # is the set-up's start, which on a loaded machine is many minutes ago.)
    program = ("from otel_training.analysis import RunKey; from otel_training.config.resource import build_resource; "
               "print(RunKey.from_resource(dict(build_resource({}, {}).attributes)).created_ns)")
    before = time.time_ns()
    created_ns = int(subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                                    check=True, timeout=120).stdout)
    after = time.time_ns()
    assert before - 10_000_000 <= created_ns <= after
    resource = build_resource({}, {})
    key = RunKey.from_resource(dict(resource.attributes))
    assert key.created_ns <= time.time_ns()
    assert resource.attributes[sc.PROCESS_CREATION_TIME] == iso_ns(key.created_ns)


# -- 3. start-up after any restart is recovery, live and in the report -----------------------------------


def test_start_up_after_a_clean_restart_is_recovery_as_live_says() -> None:
    first = Life(0, "a")
    first.span(sc.SPAN_TRAIN, 0, 10)
    first.steps(0, 0, 5, 2.0)  # finished cleanly
    second = Life(1, "b")
    second.span(sc.SPAN_INIT, 20, 23)
    second.steps(5, 25, 5, 2.0)
    result = account(first.records + second.records)
    assert result.runs[1].seconds.get(sc.BADPUT_RECOVERY) == pytest.approx(2.0)  # 23-25
    assert sc.BADPUT_PROGRAM_STARTUP not in result.runs[1].seconds
    live = Live(origin=20, after_restart=True).replay(second.records, until=35)
    assert live.totals()[sc.BADPUT_RECOVERY] == pytest.approx(2.0)


# -- 4 and 7. the live ideal is the report's; compilation --------------------------------------------------


class Live:
    """The live processor on one life's spans, replayed with their own timestamps."""

    def __init__(self, origin: float, *, after_restart: bool = False) -> None:
        self.now = s(origin)
        self.reader = InMemoryMetricReader()
        self.processor = GoodputSpanProcessor(MeterProvider(metric_readers=[self.reader]), origin_ns=s(origin),
                                              clock=lambda: self.now, after_restart=after_restart)
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(self.processor)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("test")

    def replay(self, records: list[SpanRecord], until: float) -> Live:
        spans = {}
        for record in sorted(records, key=lambda r: r.start_ns):
            spans[id(record)] = self.tracer.start_span(record.name, attributes=record.attributes,
                                                       start_time=record.start_ns)
        for record in sorted(records, key=lambda r: r.end_ns):
            if record.error:
                spans[id(record)].set_status(Status(StatusCode.ERROR))
            spans[id(record)].end(end_time=record.end_ns)
        self.now = s(until)
        return self

    def totals(self) -> dict[str, float]:
        return {label: ns / 1e9 for label, ns in self.processor.settle().items()}


def test_live_ideal_and_every_bucket_agree_with_the_report() -> None:
    life = Life(0, "a")
    t = 0.0
    life.span(sc.SPAN_INIT, 0, 1)
    lengths = [10.0] + [1.9 + (index % 7) * 0.03 for index in range(1, 150)]  # a compiling first step
    for index, length in enumerate(lengths):
        life.span(sc.SPAN_STEP, 1 + t, 1 + t + length, **{sc.STEP: index})
        t += length
    end = 1 + t
    live = Live(origin=0).replay(life.records, until=end)
    totals = live.totals()
    report_ideal = ideal_step_time(lengths)
    assert live.processor.ideal_step_time_s == pytest.approx(report_ideal, abs=1e-3)
    result = account(life.records)
    for label, seconds in result.seconds.items():
        assert totals.get(label, 0.0) == pytest.approx(seconds, abs=1e-3), label
    # Compilation: the first step's excess over the ideal, out of productive time.
    assert result.seconds[sc.BADPUT_COMPILATION] == pytest.approx(10.0 - report_ideal, abs=1e-6)
    assert result.seconds["productive"] == pytest.approx(sum(lengths) - (10.0 - report_ideal), abs=1e-6)


# -- 5. two lives under one run id are two lives ----------------------------------------------------------


def test_two_lives_with_one_run_id_are_not_merged() -> None:
    # Kubernetes re-created the pod: restart count 0 both times, the same run id; only the process differs.
    first = Life(0, "pod-a", run_id="job-0")
    first.span(sc.SPAN_PROCESS, 0, 30)
    t = first.steps(0, 0, 5, 2.0)
    first.span(sc.SPAN_SAVE_CHECKPOINT, t, t + 1, **{sc.CHECKPOINT_STEP: 4})
    first.steps(5, t + 1, 5, 2.0)  # lost: the pod died at 30
    second = Life(0, "pod-b", run_id="job-0")
    second.span(sc.SPAN_TRAIN, 40, 60)
    second.span(sc.SPAN_LOAD_CHECKPOINT, 40, 41, **{sc.CHECKPOINT_STEP: 4})
    second.steps(5, 41, 5, 2.0)
    result = account(first.records + second.records)
    assert len(result.runs) == 2
    assert result.runs[0].failed
    assert result.seconds[sc.BADPUT_WASTED_PROGRESS] == pytest.approx(10.0)
    assert result.seconds[sc.BADPUT_DOWNTIME] == pytest.approx(10.0)


def test_two_torchrun_launches_without_rdzv_id_are_two_jobs(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "job.py"
    script.write_text(
        "import otel_training\n"
        "trainer = otel_training.TrainerProcess()\n"
        "with trainer.train():\n"
        "    for i in range(3):\n"
        "        with trainer.step(global_step=i):\n"
        "            pass\n"
    )
    out = tmp_path / "traces"
    env = child_environ("TORCHELASTIC_")
    env.update(OTEL_TRAINING_OUTPUT_DIR=str(out), OTEL_TRAINING_METRICS="false")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--master-port"]
    for port in ("29611", "29612"):
        done = subprocess.run([*torchrun, port, str(script)], env=env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
    from otel_training.report.reader import read_paths

    records = read_paths([out]).records
    jobs = {record.run.job_id for record in records}
    assert len(jobs) == 2, jobs
    assert all(job.startswith("torchrun-") for job in jobs)


def test_the_live_straggler_gauge_shows_a_rank_slower_than_it_was() -> None:
    life = Life(0, "a")
    t = life.steps(0, 0, 40, 1.0)
    life.steps(40, t, 20, 1.5)  # 1.5x slower for the last 20 steps
    live = Live(origin=0).replay(life.records, until=t + 30)
    live.totals()
    metrics = {m.name: m for rm in live.reader.get_metrics_data().resource_metrics
               for sm in rm.scope_metrics for m in sm.metrics}
    (point,) = metrics[sc.METRIC_STEP_STRAGGLER_INDIVIDUAL].data.data_points
    assert point.value == pytest.approx(1 / 1.5)
