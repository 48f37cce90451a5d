"""``offload=True``: span records in a shared-memory ring, replayed as the same spans by a drain process."""

from __future__ import annotations

import json
import marshal
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from environ import child_environ
from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags
from otlp_json import read_spans
from waiting import wait_until

import otel_training
from otel_training import _native_loader, _ring
from otel_training import semconv as sc
from otel_training._ring import DRAIN_FIELDS
from otel_training.config.options import ConfigError
from otel_training.pipeline.record_tracer import RecordTracerProvider
from otel_training.pipeline.records import BEGIN, END

SCRIPTS = Path(__file__).resolve().parent / "scripts"
pytestmark = pytest.mark.skipif(_ring.supported() is not None, reason=f"offload unavailable: {_ring.supported()}")


# -- the record tracer -------------------------------------------------------------------------------------
def _provider(**kwargs: Any) -> tuple[RecordTracerProvider, list[tuple[Any, ...]]]:
    records: list[tuple[Any, ...]] = []

    def emit(payload: bytes, begin: bool | None) -> bool:
        records.append(marshal.loads(payload))
        return True

    return RecordTracerProvider(emit, Resource.create({}), **kwargs), records


def test_record_spans_keep_parentage_and_carry_what_was_added_later() -> None:
    provider, records = _provider()
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("parent", attributes={"a": 1}) as parent:
        child = tracer.start_span("child")
        child.set_attribute("b", 2)
        child.add_event("e", {"c": 3}, timestamp=123)
        child.set_status(Status(StatusCode.ERROR, "broken"))
        child.update_name("child.renamed")
        child.end()
        assert trace.get_current_span() is parent
    begins = {record[5]: record for record in records if record[0] == BEGIN}
    ends = [record for record in records if record[0] == END]
    parent_context, child_context = parent.get_span_context(), child.get_span_context()
    assert begins["child"][2] == parent_context.trace_id == child_context.trace_id
    assert begins["child"][3] == parent_context.span_id and begins["parent"][3] == 0
    assert begins["parent"][8] == {"a": 1}
    child_end = next(record for record in ends if record[1] == child_context.span_id)
    assert child_end[3:7] == ({"b": 2}, [("e", 123, {"c": 3})], (StatusCode.ERROR.value, "broken"), "child.renamed")
    parent_end = next(record for record in ends if record[1] == parent_context.span_id)
    assert len(parent_end) == 3  # nothing added: the short end record
    assert not child.is_recording() and child.attributes == {"b": 2}


def test_unsampled_spans_write_nothing() -> None:
    provider, records = _provider(sampler=ALWAYS_OFF)
    span = provider.get_tracer("t").start_span("x")
    assert not span.is_recording() and span.get_span_context().is_valid
    unsampled_parent = NonRecordingSpan(SpanContext(1, 2, True, TraceFlags(TraceFlags.DEFAULT)))
    default, default_records = _provider()
    child = default.get_tracer("t").start_span("y", context=trace.set_span_in_context(unsampled_parent))
    assert not child.is_recording()
    assert [r for r in records + default_records if r[0] in (BEGIN, END)] == []


def test_a_forked_child_writes_no_record_into_its_parents_ring() -> None:
    provider, records = _provider()
    tracer = provider.get_tracer("t")
    open_before = tracer.start_span("open.before.fork")
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its spans, and the parent's span it inherited, must not be written
        before = len(records)
        tracer.start_span("in.child").end()
        open_before.end()
        os.write(write_fd, b"%d %d" % (len(records) - before, provider.forked_spans))
        os._exit(0)
    os.close(write_fd)
    written, counted = os.read(read_fd, 100).split()
    os.waitpid(pid, 0)
    assert (int(written), int(counted)) == (0, 1)
    open_before.end()
    assert records[-1][0] == END  # the parent still writes


# -- the whole path: a drain process ----------------------------------------------------------------------
def _run_workload(directory: Path, mode: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = child_environ()
    return subprocess.run([sys.executable, str(SCRIPTS / "offload_workload.py"), str(directory), mode, *extra],
                          capture_output=True, text=True, env=env, timeout=120, check=True)


def _shape(spans: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    """The spans without their ids and times: names, parents, attributes, events, status, links."""
    by_id = {span["span_id"]: span for span in spans}
    varying = {sc.ALERT_STACKS, "thread.id", "exception.stacktrace"}

    def attributes(values: dict[str, Any]) -> str:
        return json.dumps({key: value for key, value in values.items() if key not in varying}, sort_keys=True)

    return Counter((span["name"], by_id.get(span["parent_id"], {}).get("name", span["parent_id"][:4]),
                    attributes(span["attributes"]), json.dumps(span["status"], sort_keys=True),
                    tuple((event["name"], attributes(event["attributes"])) for event in span["events"]),
                    tuple(attributes(link["attributes"]) for link in span["links"]))
                   for span in spans)


def test_offloaded_spans_are_the_spans_the_process_would_have_exported(tmp_path: Path) -> None:
    _run_workload(tmp_path / "inprocess", "inprocess")
    _run_workload(tmp_path / "offload", "offload")
    before = read_spans(tmp_path / "inprocess" / "traces-r0.jsonl")
    after = read_spans(tmp_path / "offload" / "traces-r0.jsonl")
    assert len(before) > 80 and _shape(after) == _shape(before)
    ids = {span["span_id"] for span in after}
    for span in after:  # every parent and link points at a span of the file, or at the remote caller
        assert span["parent_id"] in ids | {"", "0000000000005678"}
        assert all(link["span_id"] in ids | {"0000000000005678"} for link in span["links"])
    segments = [span for span in after if span["attributes"].get(sc.TRACE_SEGMENT)]
    assert segments, "the trace budget rolled the epoch into segments"
    for key in ("service.name", sc.TRAINING_RANK, "telemetry.sdk.version"):
        assert after[0]["resource"][key] == before[0]["resource"][key]


def test_fast_records_through_the_drain_are_the_spans_the_process_would_have_exported(tmp_path: Path) -> None:
    """The workload after the drain has said it reads the C core's fast records: steps and plain spans go as
    fast records, the rest as marshal, and the file is the in-process one. On the fallback, all marshal."""
    _run_workload(tmp_path / "inprocess", "inprocess")
    result = _run_workload(tmp_path / "offload", "offload-ready")
    native = _native_loader.native(os.environ.get("OTEL_TRAINING_NATIVE", "auto")) is not None
    assert result.stdout.split()[0] == ("fast" if native else "marshal")
    before = read_spans(tmp_path / "inprocess" / "traces-r0.jsonl")
    after = read_spans(tmp_path / "offload" / "traces-r0.jsonl")
    assert len(before) > 80 and _shape(after) == _shape(before)


def test_a_killed_training_process_still_gets_what_it_wrote_exported(tmp_path: Path) -> None:
    result = _run_workload(tmp_path, "offload", "then-exit")
    assert result.stdout.strip() == "ended"
    trace_path = tmp_path / "traces-r0.jsonl"
    # The drain outlives the training process: it exports what was written, then stops by itself.
    assert wait_until(lambda: trace_path.exists() and sum(
        span["name"] == sc.SPAN_STEP for span in read_spans(trace_path)) == 40, timeout_s=60)
    assert any(span["name"] == "user.fails" for span in read_spans(trace_path))


def _exported(telemetry: Any) -> list[dict[str, Any]]:
    """What the drain has exported so far (after a flush): the spans of the trace file, if there is one yet."""
    telemetry.force_flush(timeout_s=30)
    return read_spans(telemetry.trace_path) if telemetry.trace_path.exists() else []


@pytest.fixture
def offloaded(configure: Any) -> Any:
    return lambda **options: configure(exporter="file", offload=True, **options)


def test_flush_returns_once_the_drain_has_exported_and_counts_match_the_file(offloaded: Any, tmp_path: Path) -> None:
    telemetry = offloaded()
    trainer = otel_training.TrainerProcess()
    for step in range(200):
        with trainer.step(global_step=step):
            pass
    result = telemetry.force_flush(timeout_s=30)
    spans = read_spans(telemetry.trace_path)
    assert result.completed and result.pending == 0 and result.dropped == 0
    assert result.exported == len(spans) and sum(span["name"] == sc.SPAN_STEP for span in spans) == 200


def test_a_record_the_drain_cannot_decode_is_counted_as_dropped_and_the_rest_are_exported(
        offloaded: Any) -> None:
    telemetry = offloaded()
    trainer = otel_training.TrainerProcess()
    with trainer.step(global_step=0):
        pass
    # As damaged shared memory would leave them: an end record whose end time is text, and bytes that are no
    # record at all. Written as the training process writes its records, so they count as written ends.
    ring = telemetry._ring
    assert ring.write(marshal.dumps((END, 12345, "later")), False) and ring.write(b"\xff\x00garbage", False)
    with trainer.step(global_step=1):
        pass
    result = telemetry.force_flush(timeout_s=30)
    spans = read_spans(telemetry.trace_path)
    assert sum(span["name"] == sc.SPAN_STEP for span in spans) == 2
    assert result.completed and result.dropped == 2 and result.pending == 0
    assert ring.get(DRAIN_FIELDS["bad"]) == 2


def test_a_dead_drain_costs_training_nothing_and_every_lost_span_is_counted(offloaded: Any) -> None:
    telemetry = offloaded(offload_ring_mb=1, exit_timeout_s=1)
    trainer = otel_training.TrainerProcess()
    with trainer.step(global_step=0):
        pass
    assert telemetry.force_flush(timeout_s=30).exported == 1
    telemetry._drain.kill()
    telemetry._drain.wait(30)
    for step in range(1, 20_001):  # more than the ring holds: no wait (the drain is gone), drops counted
        with trainer.step(global_step=step):
            pass
    assert telemetry.spans_dropped > 0
    started = time.monotonic()
    result = telemetry.shutdown(timeout_s=1)
    assert time.monotonic() - started < 10  # bounded (the budget is 1 s; the margin is for a loaded machine)
    assert not result.completed and result.exported == 1 and result.dropped == 20_000


def test_a_stuck_step_is_alerted_by_the_drain_while_it_is_stuck(offloaded: Any) -> None:
    telemetry = offloaded(stuck_threshold_s=0.2)
    trainer = otel_training.TrainerProcess()

    def alerts(kind: str) -> list[dict[str, Any]]:
        return [span for span in _exported(telemetry)
                if span["name"] == sc.SPAN_ALERT and span["attributes"][sc.ALERT_KIND] == kind]

    def with_stacks() -> list[dict[str, Any]]:
        return [alert for alert in alerts(sc.ALERT_KIND_STUCK) if sc.ALERT_STACKS in alert["attributes"]]

    with trainer.step(global_step=7):
        # Repeats come at 2x, 4x... the threshold while it stays stuck, each asking for the stacks again.
        assert wait_until(with_stacks, timeout_s=30)
    # the first alert (a slow machine, or the sanitizer build, may add repeats)
    (stuck,) = [alert for alert in alerts(sc.ALERT_KIND_STUCK) if not alert["attributes"].get(sc.ALERT_REPEAT)]
    assert stuck["attributes"][sc.STEP] == 7
    # The training process's stacks, asked for by the drain: this test is where the step is stuck. The drain
    # waits ANSWER_WAIT_S for them and then alerts without them, saying why (a heavily loaded machine: the
    # first alert's answer came late, a repeat's in time).
    first = stuck["attributes"]
    assert sc.ALERT_STACKS in first or "did not send its stacks within 500 ms" in first[sc.ALERT_STACKS_ERROR]
    stacks = with_stacks()[0]["attributes"]
    assert stacks[sc.STEP] == 7 and sc.ALERT_STACKS_ERROR not in stacks
    assert "test_a_stuck_step_is_alerted_by_the_drain_while_it_is_stuck" in stacks[sc.ALERT_STACKS]
    assert "wait_until" in stacks[sc.ALERT_STACKS] and "otel-training-responder" not in stacks[sc.ALERT_STACKS]
    assert wait_until(lambda: alerts(sc.ALERT_KIND_RECOVERED), timeout_s=30)


def test_a_signal_ends_the_open_offloaded_spans_and_they_are_exported(tmp_path: Path) -> None:
    env = child_environ()
    env["OTEL_TRAINING_OFFLOAD"] = "true"
    process = subprocess.Popen([sys.executable, str(SCRIPTS / "train_until_step3.py"), str(tmp_path), "sleep"],
                               stdout=subprocess.PIPE, text=True, env=env,
                               preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    assert process.stdout.readline().strip() == "in-step-3"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == -signal.SIGTERM
    spans = read_spans(tmp_path / "traces-r0.jsonl")
    step3 = next(span for span in spans if span["name"] == sc.SPAN_STEP and span["attributes"][sc.STEP] == 3)
    assert step3["status"]["code"] == 2 and [event["name"] for event in step3["events"]] == [sc.EVENT_SIGNAL]
    assert sorted(span["attributes"][sc.STEP] for span in spans if span["name"] == sc.SPAN_STEP) == [0, 1, 2, 3]


def test_native_on_without_the_extension_is_refused_before_training(configure: Any,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_native_loader, "_tried", True)
    monkeypatch.setattr(_native_loader, "_problem", "the C extension otel_training._native is not built")
    with pytest.raises(ConfigError, match=r"option native='on' \(OTEL_TRAINING_NATIVE\): the C extension .* not built"):
        configure(offload=True, native="on")
    assert configure(offload=True, native="auto").force_flush(timeout_s=30).completed  # auto falls back


def test_a_span_processor_added_in_the_training_process_is_refused(offloaded: Any) -> None:
    from opentelemetry.sdk.trace import SpanProcessor

    telemetry = offloaded()
    with pytest.raises(ConfigError, match="drain process"):
        telemetry.add_span_processor(SpanProcessor())


def test_the_drain_reports_back_through_the_ring(offloaded: Any) -> None:
    telemetry = offloaded()
    with otel_training.TrainerProcess().step(global_step=1):
        pass
    telemetry.force_flush(timeout_s=30)
    ring = telemetry._ring
    assert ring.get(DRAIN_FIELDS["pid"]) == telemetry._drain.pid
    assert ring.get(DRAIN_FIELDS["replayed"]) >= 1 and ring.get(DRAIN_FIELDS["exported"]) >= 1
    assert context_api.get_current() == context_api.get_current()  # nothing left attached


def test_otel_training_run_offloads_by_default_and_keeps_its_watchdog(
        tmp_path: Path) -> None:
    import argparse

    from otel_training.cli.run import build_environment

    def args(*options: str) -> argparse.Namespace:
        return argparse.Namespace(exporter="file", output_dir=str(tmp_path), service_name=None, option=list(options),
                                  command=[])

    env = build_environment(args("offload=true"), {})
    assert env["OTEL_TRAINING_OFFLOAD"] == "true" and env["OTEL_TRAINING_WATCHDOG"] == "true"
    assert build_environment(args("offload=true", "watchdog=false"), {})["OTEL_TRAINING_WATCHDOG"] == "false"
    default = build_environment(args(), {})  # offload by default where it runs (this test runs where it does)
    assert default["OTEL_TRAINING_WATCHDOG"] == "true" and default["OTEL_TRAINING_OFFLOAD"] == "true"
    assert build_environment(args("offload=false"), {})["OTEL_TRAINING_OFFLOAD"] == "false"
    assert build_environment(args(), {"OTEL_TRAINING_OFFLOAD": "0"})["OTEL_TRAINING_OFFLOAD"] == "0"


def test_otel_training_run_stays_in_process_where_offload_cannot_run(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from otel_training.cli.run import build_environment
    from otel_training.pipeline import offload as offload_module

    def unsupported(mode: str = "auto") -> str:
        return "no sealed memfd on this platform (Linux only)"

    monkeypatch.setattr(_ring, "supported", unsupported)
    monkeypatch.setattr(offload_module, "supported", unsupported)  # the zero-code launchers' rule (offload_by_default)
    options = argparse.Namespace(exporter="file", output_dir=str(tmp_path), service_name=None, option=[], command=[])
    assert build_environment(options, {})["OTEL_TRAINING_OFFLOAD"] == "false"  # no error: the default adapts


# -- found by the review: each failed before its fix --------------------------------------------------------
def test_a_forked_child_that_reconfigures_and_exits_leaves_the_parents_drain_alone(tmp_path: Path) -> None:
    env = child_environ()
    result = subprocess.run([sys.executable, str(SCRIPTS / "offload_fork.py"), str(tmp_path)], capture_output=True,
                            text=True, env=env, timeout=120, check=True)
    assert "dropped=0" in result.stdout and "completed=True" in result.stdout, result.stdout + result.stderr
    steps = sorted(span["attributes"][sc.STEP] for span in read_spans(tmp_path / "traces-r0.jsonl")
                   if span["name"] == sc.SPAN_STEP)
    assert steps == list(range(15))


def test_values_marshal_cannot_carry_are_kept_as_the_sdk_keeps_them_and_nothing_raises() -> None:
    import enum
    import types

    class Level(enum.IntEnum):
        HIGH = 3

    class Mode(str, enum.Enum):
        TRAIN = "train"

    provider, records = _provider()
    tracer = provider.get_tracer("t")
    span = tracer.start_span("odd", attributes=types.MappingProxyType({"level": Level.HIGH, "mode": Mode.TRAIN,
                                                                      "path": Path("/ckpt"), "ok": 1}))
    span.add_event("e", {"where": Path("/x")})
    span.set_attribute("nested", {"a": Level.HIGH})
    span.end()
    begin, end = records[-2], records[-1]
    assert begin[8] == {"level": 3, "mode": "train", "path": "/ckpt", "ok": 1}
    assert type(begin[8]["level"]) is int
    assert end[3] == {"nested": {"a": 3}} and end[4][0][2] == {"where": "/x"}


def test_a_dead_drain_counts_its_spans_as_dropped_at_once_not_as_pending(offloaded: Any) -> None:
    telemetry = offloaded()
    trainer = otel_training.TrainerProcess()
    telemetry._drain.kill()
    telemetry._drain.wait(30)
    for step in range(1000):
        with trainer.step(global_step=step):
            pass
    result = telemetry.force_flush(timeout_s=5)
    assert (result.dropped, result.pending) == (1000, 0) and telemetry.spans_dropped == 1000


def test_tracers_asked_for_at_once_get_scopes_of_their_own() -> None:
    provider, records = _provider()
    barrier = threading.Barrier(8)

    def get(index: int) -> None:
        barrier.wait()
        provider.get_tracer(f"lib.{index}")

    threads = [threading.Thread(target=get, args=(index,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    scopes = {record[2]: record[1] for record in records if record[0] == 3}
    assert len(scopes) == 8 and len(set(scopes.values())) == 8


def test_start_span_as_a_context_manager_records_the_exception_as_the_sdk_does() -> None:
    class DataError(Exception):
        pass

    provider, records = _provider()
    with pytest.raises(DataError):
        with provider.get_tracer("t").start_span("s"):
            raise DataError("bad")
    _, _, _, _, events, status, _, _ = records[-1]
    assert status == (StatusCode.ERROR.value, "DataError: bad")
    assert events[0][0] == "exception"
    assert events[0][2]["exception.type"] == f"{__name__}.test_start_span_as_a_context_manager_records_the_" \
                                             "exception_as_the_sdk_does.<locals>.DataError"
    assert events[0][2]["exception.escaped"] == "True"


def test_trace_flags_and_record_only_decisions_are_the_sdks() -> None:
    from opentelemetry.sdk.trace.sampling import Decision, SamplingResult, StaticSampler

    provider, records = _provider()
    root = provider.get_tracer("t").start_span("root")
    assert int(root.get_span_context().trace_flags) == 0x03  # sampled, random trace id: as the SDK sets it

    class RecordOnly(StaticSampler):
        def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
            return SamplingResult(Decision.RECORD_ONLY, kwargs.get("attributes") or args[4])

    provider, records = _provider(sampler=RecordOnly(Decision.RECORD_ONLY))
    span = provider.get_tracer("t").start_span("recorded", attributes={"a": 1})
    assert span.is_recording() and not span.get_span_context().trace_flags.sampled
    assert records[-1][0] == BEGIN and records[-1][12] == 0x02  # replayed as recorded, not sampled


def test_shutdown_reaps_the_drain(offloaded: Any) -> None:
    telemetry = offloaded()
    telemetry.shutdown(timeout_s=30)
    assert telemetry._drain.returncode == 0


def test_the_device_timeline_offloaded_times_steps_on_the_device_and_alerts_the_host_between_them(
        offloaded: Any, fake: Any) -> None:
    telemetry = offloaded(stuck_threshold_s=0.2)
    trainer = otel_training.TrainerProcess()
    with trainer.epoch(epoch=3):
        for index in range(6):
            with trainer.step(global_step=index):
                fake.launch(0.002)
            if index == 3:  # the host outside any step, the device idle: alerted while it lasts
                assert wait_until(lambda: any(span["name"] == sc.SPAN_ALERT and span["attributes"][
                    sc.ALERT_SPAN_NAME] == sc.SPAN_BETWEEN_STEPS for span in _exported(telemetry)), timeout_s=30)
    telemetry.shutdown(timeout_s=30)
    exported = read_spans(telemetry.trace_path)
    assert sorted(span["attributes"][sc.STEP] for span in exported if span["name"] == sc.SPAN_DEVICE_STEP) == \
        list(range(6))
    host = {span["span_id"] for span in exported if span["name"] == sc.SPAN_STEP}
    assert all(span["parent_id"] in host for span in exported if span["name"] == sc.SPAN_DEVICE_STEP)
    # the gap after step 3 (a loaded machine, or the sanitizer build, may leave the host out of a step past
    # the 0.3 s threshold elsewhere too: those gaps are true as well)
    gaps = [span for span in exported if span["name"] == sc.SPAN_BETWEEN_STEPS]
    assert [gap["attributes"][sc.STEP] for gap in gaps].count(3) == 1, gaps


def test_otel_training_run_offloads_an_unmodified_torch_loop(tmp_path: Path) -> None:
    from requirements import require

    require("torch")
    env = child_environ()
    result = subprocess.run([str(Path(sys.executable).parent / "otel-training"), "run", "--output-dir", str(tmp_path),
                             "-o", "offload=true", "--", sys.executable, str(SCRIPTS / "torch_tiny_loop.py"), "7"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 7, result.stderr
    spans = read_spans(tmp_path / "traces-r0.jsonl")
    steps = [span for span in spans if span["name"] == sc.SPAN_STEP]
    assert [span["attributes"][sc.STEP] for span in steps] == [0, 1, 2, 3, 4]
    assert all(span["attributes"][sc.STEP_DATA_WAIT_S] > 0 for span in steps)
    assert steps[0]["resource"]["process.pid"] != 0 and (tmp_path / "metrics-r0.drain.jsonl").exists()


def test_the_drain_outlives_a_sigterm_sent_to_every_process_of_the_job(offloaded: Any) -> None:
    telemetry = offloaded()
    trainer = otel_training.TrainerProcess()
    with trainer.step(global_step=0):
        pass
    os.kill(telemetry._drain.pid, signal.SIGTERM)
    for step in range(1, 11):  # the training process handles its own signal: ends and flushes its spans
        with trainer.step(global_step=step):
            pass
    result = telemetry.shutdown(timeout_s=30)
    assert result.completed and result.exported == 11 and telemetry._drain.returncode == 0


def test_lineage_set_in_the_training_process_is_stamped_on_its_offloaded_spans(offloaded: Any) -> None:
    telemetry = offloaded(pipeline_id="pipe-1", trigger_id="trigger-0")
    trainer = otel_training.TrainerProcess()
    otel_training.set_lineage(trigger_id="trigger-7", training_id="t-7-0")
    with trainer.train():
        with trainer.step(global_step=0, loss=0.5):
            pass
    otel_training.set_lineage(trigger_id=None)  # cleared here: the option's trigger-0 must not come back
    with trainer.evaluate():
        pass
    telemetry.shutdown(timeout_s=30)
    spans = {span["name"]: span for span in read_spans(telemetry.trace_path)}
    for name in (sc.SPAN_TRAIN, sc.SPAN_STEP):
        attributes = spans[name]["attributes"]
        assert attributes[sc.TRAINING_PIPELINE_ID] == "pipe-1" and attributes[sc.TRAINING_TRIGGER_ID] == "trigger-7"
        assert attributes[sc.TRAINING_TRIGGER_TRAINING_ID] == "t-7-0"
    assert spans[sc.SPAN_STEP]["attributes"][sc.LOSS] == 0.5
    assert sc.TRAINING_TRIGGER_ID not in spans[sc.SPAN_EVALUATE]["attributes"]
    assert spans[sc.SPAN_EVALUATE]["attributes"][sc.TRAINING_PIPELINE_ID] == "pipe-1"


@pytest.mark.realtime
def test_offloaded_the_job_ends_within_its_exit_budget_when_the_collector_is_gone() -> None:
    """The training process exits within its budget, and the drain, which holds the job's output pipes (a
    launcher's capture, a `| tee`), within one more: a flush the training process asked for lasts no longer
    than it waits (the drain took 15 s, the OTLP exporter's own retry budget, before)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = child_environ()
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{port}"
    env["OTEL_TRAINING_OFFLOAD"] = "true"
    process = subprocess.Popen([sys.executable, str(SCRIPTS / "steps_then_exit.py")], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    assert process.stdout is not None and process.stdout.readline().strip() == "done"
    started = time.monotonic()
    process.wait(timeout=30)
    exited = time.monotonic() - started
    _, stderr = process.communicate(timeout=30)  # until the drain, too, has closed the pipes
    ended = time.monotonic() - started
    assert process.returncode == 0
    assert exited < 1.8, f"the training process exited {exited:.2f} s after its loop (budget 1 s)"
    assert ended < 1.8 + 1.5, f"the drain ended {ended:.2f} s after the loop (budget 1 s after the close)"
    assert "100 span(s) were not delivered" in stderr


def test_configure_offloads_by_default_and_says_how_to_keep_processors_in_process(
        configure: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_training.pipeline.offload import OffloadTelemetry

    telemetry = configure(exporter="file")  # no offload given: "auto"
    assert isinstance(telemetry, OffloadTelemetry) and telemetry.options["offload"] is True
    processor = SimpleSpanProcessor(InMemorySpanExporter())
    for target in (telemetry, telemetry.tracer_provider):  # the handle, and the global provider SDK code calls
        with pytest.raises(ConfigError, match=r"offloaded.*configure\(offload=False\)"):
            target.add_span_processor(processor)
    assert not isinstance(configure(exporter="console"), OffloadTelemetry)  # it prints here
    monkeypatch.setenv("OTEL_TRAINING_OFFLOAD", "false")
    kept = configure(exporter="file")
    assert not isinstance(kept, OffloadTelemetry) and kept.stuck is None
    kept.add_span_processor(processor)  # in-process: yours, as before
