"""The sidecar watchdog, with real processes: frozen with the GIL held, killed mid-step, clean exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from environ import child_environ
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otlp_json import read_spans
from waiting import first_value, wait_until

from otel_training import semconv as sc
from otel_training.watchdog import monitor
from otel_training.watchdog.slot import STATE_CLOSED, SlotReader, SlotWriter

REPO = Path(__file__).resolve().parent.parent


#: Step 2 frozen for 6 s with the GIL held (libc's sleep through PyDLL), its span id printed first.
FROZEN = """
    import ctypes, otel_training
    otel_training.configure(exporter="file", output_dir="traces", stuck_threshold_s=0.5, watchdog=True,
                            offload={offload}, signal_hooks=False)
    trainer = otel_training.TrainerProcess()
    with trainer.epoch(epoch=3):
        with trainer.step(global_step=1):
            pass
        with trainer.step(global_step=2) as step:
            print(f"{{step.span.get_span_context().span_id:016x}}", flush=True)
            ctypes.PyDLL(None).sleep(6)
    """
#: Step 7 sleeping for a minute, its span id printed first: the test kills it.
KILLED = """
    import time, otel_training
    otel_training.configure(exporter="file", output_dir="traces", stuck_threshold_s=60, watchdog=True,
                            offload={offload}, signal_hooks=False)
    trainer = otel_training.TrainerProcess()
    with trainer.epoch(epoch=0):
        with trainer.step(global_step=7) as step:
            print(f"{{step.span.get_span_context().span_id:016x}}", flush=True)
            time.sleep(60)
    """


#: 1.5 s of start-up before ``configure()`` (imports, data, NCCL), three 50 ms steps, then the fourth never ends.
KILLED_AFTER_STARTUP = """
    import time
    time.sleep(1.5)
    import otel_training
    telemetry = otel_training.configure(exporter="file", output_dir="traces", watchdog={watchdog},
                                        offload={offload}, signal_hooks=False)
    trainer = otel_training.TrainerProcess()
    with trainer.epoch(epoch=0):
        for index in range(3):
            with trainer.step(global_step=index):
                time.sleep(0.05)
        telemetry.force_flush(10)  # what a periodic export had sent by then
        with trainer.step(global_step=3) as step:
            print(f"{{step.span.get_span_context().span_id:016x}}", flush=True)
            time.sleep(60)
    """


def start_script(script: str, tmp_path: Path) -> subprocess.Popen[str]:
    env = child_environ()
    env["PYTHONPATH"] = str(REPO)
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(script))
    return subprocess.Popen([sys.executable, str(path)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:
        return True


def alerts(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [span for span in read_spans(path) if span["name"] == sc.SPAN_ALERT]


def wait_for_alert(path: Path, kind: str, source: str, timeout_s: float = 15.0) -> dict:
    def wanted() -> dict | None:
        return next((alert for alert in alerts(path) if alert["attributes"][sc.ALERT_KIND] == kind
                     and alert["attributes"][sc.ALERT_SOURCE] == source), None)

    try:
        return first_value(wanted, timeout_s, interval_s=0.02)
    except AssertionError:
        raise AssertionError(f"no {kind} alert from the {source} in {path}: {alerts(path)}") from None


@pytest.mark.realtime
def test_a_process_frozen_with_the_gil_held_is_reported_while_frozen(tmp_path: Path) -> None:
    process = start_script(FROZEN.format(offload=False), tmp_path)
    try:
        span_id = process.stdout.readline().strip()  # type: ignore[union-attr]
        started = time.monotonic()
        trace = tmp_path / "traces" / "traces-r0.jsonl"
        alert = wait_for_alert(trace, sc.ALERT_KIND_STUCK, sc.ALERT_SOURCE_WATCHDOG)
        # Reported while the process was still frozen (the in-process detector could not run).
        assert time.monotonic() - started < 4.0
        assert process.poll() is None
        assert not [a for a in alerts(trace) if a["attributes"][sc.ALERT_SOURCE] == sc.ALERT_SOURCE_PROCESSOR]
    finally:
        out, err = process.communicate(timeout=30)
    attributes = alert["attributes"]
    assert attributes[sc.ALERT_SPAN_ID] == span_id and alert["parent_id"] == span_id
    assert alert["links"][0]["span_id"] == span_id
    assert attributes[sc.STEP] == 2 and attributes[sc.EPOCH] == 3
    assert attributes[sc.ALERT_SPAN_NAME] == sc.SPAN_STEP
    assert attributes[sc.ALERT_THRESHOLD_S] == 0.5
    assert attributes[sc.ALERT_ELAPSED_S] >= 0.5 + 1.0  # threshold + grace
    assert attributes[sc.ALERT_PID] == process.pid
    # The training process's resource, not the watchdog's.
    assert alert["resource"][sc.PROCESS_PID] == process.pid
    # py-spy is installed in the test environment: the frozen process's stack, seen from outside.
    assert attributes.get(sc.ALERT_STACKS_SOURCE) == "py-spy", attributes.get(sc.ALERT_STACKS_ERROR)
    assert "train.py" in attributes[sc.ALERT_STACKS]
    assert process.returncode == 0, err


@pytest.mark.realtime
@pytest.mark.parametrize("offload", [False, True], ids=["in-process", "offload"])
def test_a_rank_frozen_with_the_gil_held_then_back_is_one_episode_and_one_recovery(tmp_path: Path,
                                                                                    offload: bool) -> None:
    """Issue 29: the watchdog speaks while the process is frozen; the process, once back, continues the same
    episode. The rules count first alerts (no ``training.alert.repeat``) against recoveries, so any second
    first alert kept the rank's page on after it recovered."""
    process = start_script(FROZEN.format(offload=offload), tmp_path)
    span_id = process.stdout.readline().strip()  # type: ignore[union-attr]
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    on_step = [a["attributes"] for a in alerts(tmp_path / "traces" / "traces-r0.jsonl")
               if a["attributes"].get(sc.ALERT_SPAN_ID) == span_id]
    stuck = [a for a in on_step if a[sc.ALERT_KIND] == sc.ALERT_KIND_STUCK]
    first = [a for a in stuck if not a.get(sc.ALERT_REPEAT)]
    recovered = [a for a in on_step if a[sc.ALERT_KIND] == sc.ALERT_KIND_RECOVERED]
    assert len(first) == 1 and len(recovered) == 1, on_step
    assert all(a[sc.ALERT_COUNT] > 1 for a in stuck if a is not first[0])
    assert len(stuck) >= 2  # repeated while frozen (6 s on a 0.5 s threshold)
    if not offload:  # the watchdog spoke first: the detector could not run
        assert first[0][sc.ALERT_SOURCE] == sc.ALERT_SOURCE_WATCHDOG


def test_a_process_killed_mid_step_is_reported_as_died(tmp_path: Path) -> None:
    process = start_script(KILLED.format(offload=False), tmp_path)
    span_id = process.stdout.readline().strip()  # type: ignore[union-attr]
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=10)
    alert = wait_for_alert(tmp_path / "traces" / "traces-r0.jsonl", sc.ALERT_KIND_DIED, sc.ALERT_SOURCE_WATCHDOG)
    assert alert["parent_id"] == span_id
    assert alert["attributes"][sc.STEP] == 7 and alert["attributes"][sc.EPOCH] == 0
    assert alert["attributes"][sc.ALERT_COUNT] == 1
    assert alert["resource"][sc.PROCESS_PID] == process.pid
    # The step the process died in, which it could never end, is exported by the watchdog.
    (dead_step,) = [span for span in read_spans(tmp_path / "traces" / "traces-r0.jsonl")
                    if span["span_id"] == span_id]
    assert dead_step["name"] == sc.SPAN_STEP and dead_step["attributes"][sc.STEP] == 7
    assert dead_step["status"]["code"] == 2 and dead_step["trace_id"] == alert["trace_id"]
    assert dead_step["end"] - dead_step["start"] > 0


@pytest.mark.parametrize(("offload", "watchdog"), [(True, False), (True, True), (False, True)],
                         ids=["offload", "offload+watchdog", "in-process+watchdog"])
def test_a_life_killed_by_sigkill_keeps_its_start_up_its_last_step_and_its_failure(
        tmp_path: Path, offload: bool, watchdog: bool) -> None:
    """Issue 29: a life killed without a catchable signal never ends its own spans. What survives is used:
    the resource's ``process.creation.time`` (its start-up, before ``configure()`` too), and the spans it
    could not end, exported ended ERROR by the drain (offloaded, with or without the watchdog: they were
    counted lost before) or the sidecar. The report then has the start-up, the life's end at its death and
    its failure."""
    from otel_training.report import build_report, read_paths

    process = start_script(KILLED_AFTER_STARTUP.format(offload=offload, watchdog=watchdog), tmp_path)
    span_id = process.stdout.readline().strip()  # type: ignore[union-attr]
    killed_ns = time.time_ns()
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=10)
    trace = tmp_path / "traces" / "traces-r0.jsonl"
    assert wait_until(lambda: any(span["span_id"] == span_id for span in read_spans(trace)), timeout_s=15), \
        "the step the process died in never reached the file"
    spans = read_spans(trace)
    (dead_step,) = [span for span in spans if span["span_id"] == span_id]
    assert dead_step["status"]["code"] == 2 and sc.ALERT_KIND_DIED in [e["name"] for e in dead_step["events"]]
    assert bool([span for span in spans if span["name"] == sc.SPAN_ALERT]) == watchdog  # the alert is opt-in
    result = read_paths([tmp_path / "traces"])
    report = build_report(result.records, result.problems)
    seconds = report.goodput.seconds
    assert seconds[sc.BADPUT_PROGRAM_STARTUP] >= 1.5  # from the process's creation, not from its first span
    assert report.end_ns >= killed_ns - 50_000_000  # the life lasted until it was killed
    assert seconds.get(sc.BADPUT_WASTED_PROGRESS, 0) > 0  # it failed: nothing checkpointed survives it


@pytest.mark.realtime
def test_offloaded_a_process_frozen_with_the_gil_held_is_alerted_by_the_drain_with_py_spy_stacks(
        tmp_path: Path) -> None:
    """With offload=True the drain is the watchdog: it alerts on time (another process, it needs no GIL of the
    training process), and the responder cannot answer, so py-spy reads the stacks, as the sidecar would."""
    process = start_script(FROZEN.format(offload=True), tmp_path)
    try:
        span_id = process.stdout.readline().strip()  # type: ignore[union-attr]
        started = time.monotonic()
        trace = tmp_path / "traces" / "traces-r0.jsonl"
        alert = wait_for_alert(trace, sc.ALERT_KIND_STUCK, sc.ALERT_SOURCE_PROCESSOR)
        assert time.monotonic() - started < 4.0 and process.poll() is None  # while it was still frozen
    finally:
        out, err = process.communicate(timeout=30)
    attributes = alert["attributes"]
    assert attributes[sc.ALERT_SPAN_ID] == span_id and alert["parent_id"] == span_id
    assert attributes[sc.STEP] == 2 and attributes[sc.EPOCH] == 3 and attributes[sc.ALERT_ELAPSED_S] >= 0.5
    assert alert["resource"][sc.PROCESS_PID] == process.pid
    assert attributes.get(sc.ALERT_STACKS_SOURCE) == "py-spy", attributes.get(sc.ALERT_STACKS_ERROR)
    assert "train.py" in attributes[sc.ALERT_STACKS]
    assert process.returncode == 0, err


def test_offloaded_a_process_killed_mid_step_gets_a_died_alert_and_its_open_spans_from_the_drain(
        tmp_path: Path) -> None:
    process = start_script(KILLED.format(offload=True), tmp_path)
    span_id = process.stdout.readline().strip()  # type: ignore[union-attr]
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=10)
    trace = tmp_path / "traces" / "traces-r0.jsonl"
    alert = wait_for_alert(trace, sc.ALERT_KIND_DIED, sc.ALERT_SOURCE_WATCHDOG)
    assert alert["parent_id"] == span_id
    assert alert["attributes"][sc.STEP] == 7 and alert["attributes"][sc.EPOCH] == 0
    assert alert["attributes"][sc.ALERT_COUNT] == 1 and alert["attributes"][sc.ALERT_PID] == process.pid
    assert alert["resource"][sc.PROCESS_PID] == process.pid
    # Every span it could not end is exported, ended ERROR: the step it died in, and the epoch around it.
    assert wait_until(lambda: {span["name"] for span in read_spans(trace)} >= {sc.SPAN_STEP, sc.SPAN_EPOCH},
                      timeout_s=15)
    spans = read_spans(trace)
    (dead_step,) = [span for span in spans if span["span_id"] == span_id]
    assert dead_step["name"] == sc.SPAN_STEP and dead_step["attributes"][sc.STEP] == 7
    assert dead_step["status"]["code"] == 2 and dead_step["trace_id"] == alert["trace_id"]
    assert [event["name"] for event in dead_step["events"]] == [sc.ALERT_KIND_DIED]
    (epoch,) = [span for span in spans if span["name"] == sc.SPAN_EPOCH]
    assert epoch["status"]["code"] == 2 and dead_step["parent_id"] == epoch["span_id"]


def test_a_clean_exit_raises_nothing_and_the_watchdog_leaves(tmp_path: Path) -> None:
    process = start_script(
        """
        import otel_training
        telemetry = otel_training.configure(exporter="file", output_dir="traces", stuck_threshold_s=5,
                                            watchdog=True, offload=False)  # the sidecar: in-process only
        trainer = otel_training.TrainerProcess()
        for step in range(20):
            with trainer.step(global_step=step):
                pass
        print(telemetry.stuck._slot.process.pid, flush=True)
        """,
        tmp_path,
    )
    out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    watchdog_pid = int(out.strip())
    assert wait_until(lambda: gone(watchdog_pid), timeout_s=5, interval_s=0.02), "the watchdog outlived a clean exit"
    assert alerts(tmp_path / "traces" / "traces-r0.jsonl") == []


def test_slot_round_trip_and_alerted_marker(tmp_path: Path) -> None:
    provider = TracerProvider()
    tracer = provider.get_tracer("t")
    writer = SlotWriter(tmp_path / "slot")
    reader = SlotReader(tmp_path / "slot")
    with tracer.start_as_current_span(sc.SPAN_EPOCH, attributes={sc.EPOCH: 4}):
        from opentelemetry.context import get_current

        span = tracer.start_span(sc.SPAN_STEP, attributes={sc.STEP: 99})
        writer.begin(span, get_current(), time.monotonic(), 2.5)
    state = reader.read()
    context = span.get_span_context()
    assert state.open and state.pid == os.getpid()
    assert (state.trace_id, state.span_id, state.name) == (context.trace_id, context.span_id, sc.SPAN_STEP)
    assert (state.step, state.epoch, state.threshold_ns) == (99, 4, 2_500_000_000)
    writer.alerted(context.span_id)
    assert reader.read().alerted_span_id == context.span_id
    # The watchdog's own words: how many alerts it raised on which span, for the process to continue.
    assert writer.watchdog_alerts(context.span_id) == 0
    reader.reported(context.span_id, 3)
    assert writer.watchdog_alerts(context.span_id) == 3 and writer.watchdog_alerts(context.span_id + 1) == 0
    writer.end(context.span_id)
    assert not reader.read().open
    writer.close()
    assert reader.read().state == STATE_CLOSED


def test_missing_py_spy_is_said_in_the_alert(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(monitor, "find_py_spy", lambda: None)
    stacks, error = monitor.py_spy_stacks(os.getpid())
    assert stacks is None and "py-spy not found" in error


def test_a_process_that_comes_back_and_exits_between_two_polls_still_gets_its_recovery(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CI once: the watchdog was still taking py-spy's stacks when the frozen process came back, ended the
    step and exited cleanly; its next poll saw the process gone and left without the recovery, so the
    rank's page stayed on. A clean exit (the slot closed) after the reported span ended is its recovery."""
    monkeypatch.setattr(monitor, "py_spy_stacks", lambda pid: (None, "not taken in this test"))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    writer = SlotWriter(tmp_path / "slot")
    span = provider.get_tracer("t").start_span(sc.SPAN_STEP, attributes={sc.STEP: 2})
    writer.begin(span, None, time.monotonic() - 10, 0.5)
    gone_process = subprocess.Popen([sys.executable, "-c", "pass"])
    watchdog = monitor.Watchdog(SlotReader(tmp_path / "slot"), gone_process.pid, provider, grace_s=0, poll_s=0.01)
    watchdog._check(watchdog.slot.read())
    writer.end(span.get_span_context().span_id)  # back: the step ends, then the process exits cleanly
    writer.close()
    gone_process.wait(timeout=30)
    assert watchdog.run() == 0
    kinds = [alert.attributes[sc.ALERT_KIND] for alert in exporter.get_finished_spans()]
    assert kinds == [sc.ALERT_KIND_STUCK, sc.ALERT_KIND_RECOVERED]
