"""``otel_training.compat.dlrover``: DLRover's training_event API, its event log, and our spans beside it.

The expectations are DLRover's documented semantics: the line grammar
``[time] [pid] [event_id] [target] [name] [type] {content}``, event names,
instants against BEGIN/END pairs, ``<parent>#<stage>`` stages, ``success`` /
``error`` on END, and safe calls.
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from otlp_json import read_spans
from waiting import wait_until

from otel_training import semconv as sc
from otel_training.compat import dlrover

#: DLRover's text line: six bracketed fields, then the content as one JSON object.
GRAMMAR = re.compile(r"^\[(?P<time>[^\]]*)\] \[(?P<pid>[^\]]*)\] \[(?P<id>[^\]]*)\] \[(?P<target>[^\]]*)\] "
                     r"\[(?P<name>[^\]]*)\] \[(?P<type>BEGIN|END|INSTANT)\] (?P<content>\{.*\})$")
STATUS_OK, STATUS_ERROR = 1, 2


def parse(line: str) -> dict[str, Any]:
    """A reader written from DLRover's line grammar alone."""
    match = GRAMMAR.match(line)
    assert match, f"not a DLRover line: {line!r}"
    record = match.groupdict()
    record["time"] = datetime.fromisoformat(record["time"])
    record["pid"] = int(record["pid"])
    record["content"] = json.loads(record["content"])
    return record


class Log:
    """The rank's log file, read back without sleeping a fixed time."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self) -> list[str]:
        exporter = dlrover.get_default_exporter()
        assert exporter is not None and exporter.force_flush(5)
        return self.path.read_text(encoding="utf-8").splitlines() if self.path.exists() else []

    def records(self) -> list[dict[str, Any]]:
        return [parse(line) for line in self.lines()]

    def wait_for(self, count: int, timeout_s: float) -> list[str]:
        """Lines as they are on disk (no flush asked), once there are ``count`` of them."""
        def on_disk() -> list[str]:
            return self.path.read_text(encoding="utf-8").splitlines() if self.path.exists() else []

        wait_until(lambda: len(on_disk()) >= count, timeout_s)
        return on_disk()


@pytest.fixture(autouse=True)
def no_spans(configure: Callable[..., Any]) -> None:
    """Spans go nowhere unless a test configures otherwise (not to the embedded default's ./otel-traces)."""
    configure(exporter="none")


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Log]:
    """DLRover's configuration pointed at a temporary directory, rank 3."""
    for name in list(os.environ):
        if name.startswith("DLROVER_EVENT_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("DLROVER_EVENT_FILE_DIR", str(tmp_path / "events"))
    monkeypatch.setenv("RANK", "3")
    dlrover._reset()
    yield Log(tmp_path / "events" / "events_3.log")
    monkeypatch.undo()
    dlrover._reset()
    dlrover.close_default_exporter()


# -- the line formats ---------------------------------------------------------
def test_text_lines_follow_dlrovers_grammar_with_pid_local_time_and_its_own_keys(log: Log) -> None:
    before = datetime.now()
    trainer = dlrover.TrainerProcess("AtorchTrainerV2")
    with trainer.step(global_step=7, batch_size=4, step_type="train"):
        pass
    begin, end = log.records()
    for record in (begin, record_end := end):
        assert record["pid"] == os.getpid()
        assert record["target"] == "AtorchTrainerV2" and record["name"] == "#step"
        assert record["time"].tzinfo is None  # local time, as datetime.now() writes it
        assert before - timedelta(seconds=1) <= record["time"] <= datetime.now()
    assert re.fullmatch(r"[0-9a-f]{8}", begin["id"]) and begin["id"] == record_end["id"]
    assert (begin["type"], end["type"]) == ("BEGIN", "END")
    # DLRover's content keys, not our attribute names.
    assert begin["content"] == {"global_step": 7, "batch_size": 4, "step_type": "train"}
    assert end["content"] == {"global_step": 7, "batch_size": 4, "step_type": "train", "success": True}


def test_formatters_write_exactly_dlrovers_text_and_json() -> None:
    event = dlrover.Event(pid=12, event_id="ab12cd34", event_time=datetime(2025, 1, 2, 3, 4, 5, 600),
                          target="AtorchTrainerV2", name="#step", event_type=dlrover.EventType.BEGIN,
                          content={"global_step": 1, "名": "值"})
    assert dlrover.LogFormatter().format(event) == (
        '[2025-01-02T03:04:05.000600] [12] [ab12cd34] [AtorchTrainerV2] [#step] [BEGIN] '
        '{"global_step": 1, "名": "值"}')
    assert json.loads(dlrover.JsonFormatter().format(event)) == {
        "pid": 12, "event_id": "ab12cd34", "event_time": "2025-01-02T03:04:05.000600",
        "target": "AtorchTrainerV2", "name": "#step", "event_type": "BEGIN",
        "content": {"global_step": 1, "名": "值"}}


def test_json_lines_when_dlrover_is_told_so(log: Log, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLROVER_EVENT_TEXT_FORMATTER", "JSON")
    dlrover._reset()
    dlrover.DLRoverAgentEvent().process_restart(node_rank=2, restart_count=1)
    (record,) = [json.loads(line) for line in log.lines()]
    assert record["pid"] == os.getpid() and record["event_type"] == "INSTANT"
    assert (record["target"], record["name"]) == ("dlrover-agent", "#process_restart")
    assert record["content"] == {"node_rank": 2, "restart_count": 1}
    datetime.fromisoformat(record["event_time"])


@pytest.mark.realtime
def test_instants_are_in_the_file_within_a_second_with_nothing_open(log: Log) -> None:
    trainer = dlrover.TrainerProcess("AtorchTrainerV2")
    started = time.monotonic()
    trainer.substep(global_step=3)
    lines = log.wait_for(1, timeout_s=5)
    elapsed = time.monotonic() - started
    assert len(lines) == 1 and elapsed < 1.0, (lines, elapsed)
    assert parse(lines[0])["type"] == "INSTANT" and parse(lines[0])["name"] == "#substep"
    step = trainer.step(global_step=4).begin()  # a BEGIN is there while the step is still open
    assert len(log.wait_for(2, timeout_s=5)) == 2
    step.end()


@pytest.mark.realtime
def test_the_writer_never_holds_up_training_it_drops_and_counts(tmp_path: Path) -> None:
    fifo = tmp_path / "events"
    fifo.mkdir()
    os.mkfifo(fifo / "events_0.log")  # opening it blocks until a reader comes: a stuck disk
    exporter = dlrover.AsyncExporter(dlrover.TextFileExporter(fifo), max_queue_size=4)
    exporter.start()
    process = dlrover.Process("t", exporter)
    started = time.monotonic()
    for index in range(50):
        process.instant("tick", {"i": index})
    assert time.monotonic() - started < 1.0
    assert exporter.dropped >= 50 - 4 - 1 and exporter.written == 0
    reader = os.open(fifo / "events_0.log", os.O_RDONLY | os.O_NONBLOCK)  # let the writer finish
    try:
        exporter.close(timeout=2)
    finally:
        os.close(reader)


def test_a_forked_child_writes_its_own_lines_with_its_pid_and_never_the_parents(log: Log) -> None:
    process = dlrover.Process("worker")
    process.instant("parent")
    log.lines()  # written and flushed
    exporter = dlrover.get_default_exporter()
    # A line still in the parent's buffer at the fork (the writer had not caught up).
    exporter._inner_exporter.write('[pending] line of the parent', flush=False)  # type: ignore[union-attr]
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's outcome is read from the file below
        try:
            process.instant("child")
            exporter.close(timeout=5)
        finally:
            os._exit(0)
    _, status = os.waitpid(child, 0)
    assert status == 0
    lines = log.lines()
    assert lines.count("[pending] line of the parent") == 1
    records = [parse(line) for line in lines if not line.startswith("[pending]")]
    assert [(r["name"], r["pid"] == os.getpid()) for r in records] == [("parent", True), ("child", False)]


# -- Durations ---------------------------------------------------------------
def test_success_and_fail_put_dlrovers_outcome_on_end(log: Log) -> None:
    process = dlrover.Process("worker")
    process.duration("ok", {"a": 1}).begin().success(b=2)
    process.duration("bad", {"a": 1}).begin().fail(error="disk full", c=3)
    records = log.records()
    assert [(r["name"], r["type"]) for r in records] == [("ok", "BEGIN"), ("ok", "END"), ("bad", "BEGIN"),
                                                         ("bad", "END")]
    assert records[1]["content"] == {"a": 1, "success": True, "b": 2}
    assert records[3]["content"] == {"a": 1, "success": False, "error": "disk full", "c": 3}


def test_an_exception_fails_the_duration_and_goes_on_without_an_extra_record(log: Log) -> None:
    process = dlrover.Process("worker")
    with pytest.raises(KeyError):
        with process.duration("load"):
            raise KeyError("shard-7")
    records = log.records()
    assert [r["type"] for r in records] == ["BEGIN", "END"]
    end = records[1]["content"]
    assert end["success"] is False
    assert end["error"].startswith("'shard-7'\n") and "test_compat_dlrover.py" in end["error"]


def test_begin_and_end_emit_once_and_end_without_begin_emits_nothing(log: Log) -> None:
    process = dlrover.Process("worker")
    never = process.duration("never")
    never.end()
    never.success()
    twice = process.duration("twice").begin()
    twice.begin()
    twice.end()
    twice.end()
    twice.fail("late")
    assert [(r["name"], r["type"]) for r in log.records()] == [("twice", "BEGIN"), ("twice", "END")]


def test_extra_content_goes_to_the_next_line_and_not_after_the_end(log: Log) -> None:
    duration = dlrover.Process("worker").duration("job", {"a": 1})
    duration.extra_args(b=2)
    duration.begin()
    duration.extra_dict({"c": 3})
    duration.end()
    duration.extra_dict({"d": 4}).extra_args(e=5)
    begin, end = log.records()
    assert begin["content"] == {"a": 1, "b": 2}
    assert end["content"] == {"a": 1, "b": 2, "c": 3}


def test_stages_are_named_after_the_parent_and_inherit_its_content(log: Log) -> None:
    trainer = dlrover.TrainerProcess("AtorchTrainerV2")
    with trainer.init(model="m") as init:
        with init.load_ckpt():
            pass
        with init.stage("compile", {"backend": "inductor"}):
            pass
    assert [(r["name"], r["type"]) for r in log.records()] == [
        ("#init", "BEGIN"), ("#init##load_ckpt", "BEGIN"), ("#init##load_ckpt", "END"),
        ("#init#compile", "BEGIN"), ("#init#compile", "END"), ("#init", "END")]
    assert log.records()[3]["content"] == {"model": "m", "backend": "inductor"}


def test_a_stage_of_an_unbegun_or_ended_duration_emits_nothing(log: Log) -> None:
    process = dlrover.Process("worker")
    unbegun = process.duration("job")
    with unbegun.stage("early"):
        pass
    ended = process.duration("job2").begin()
    ended.end()
    with ended.stage("late") as stage:
        stage.extra_args(x=1)
    assert [(r["name"], r["type"]) for r in log.records()] == [("job2", "BEGIN"), ("job2", "END")]


# -- event names, instants and durations -------------------------------------
def _trainer(trainer: dlrover.TrainerProcess) -> None:
    trainer.start(params={"lr": 0.1})
    trainer.init_end()
    trainer.substep(global_step=1)
    trainer.predict_step(global_step=1)
    trainer.log(1, {"loss": 0.5})
    trainer.warning(dlrover.WarningType.DEPRECATED, "old")
    trainer.finish()
    for duration in (trainer.train(), trainer.epoch(), trainer.step(1), trainer.evaluate(1), trainer.predict(1),
                     trainer.save(1), trainer.persist_ckpt(1, path="/c", size=9), trainer.init()):
        duration.begin().end()


def _agent(agent: dlrover.DLRoverAgentEvent) -> None:
    agent.start(args={"nproc_per_node": 8})
    agent.exit(success=True)
    for method in (agent.process_succeeded, agent.process_restart, agent.process_fail,
                   agent.process_restart_membership):
        method(node_rank=1)
    agent.job_abortion(node_rank=1, reason="r")
    agent.job_restart(node_rank=1, reason="r")
    agent.warning(dlrover.WarningType.DEPRECATED, "old")
    agent.rendezvous("elastic-train", "node-0", 0, 30).begin().end()
    agent.network_check(round=1, node_rank=0).begin().end()


def _master(master: dlrover.DLRoverMasterEvent) -> None:
    master.start(args={"job": "j"})
    master.exit(exit_code=0)
    master.node_join("n1", "1", "10.0.0.1", "2")
    master.worker_event("pod-1", "Pending", "Running", "")
    master.worker_relaunch("pod-1", "pod-2")
    master.worker_create("pod-1", True)
    master.worker_no_heartbeat("pod-1", 60)
    master.fault_detect("nccl timeout")
    master.process_restart(pod_name="pod-1")
    master.warning(dlrover.WarningType.DEPRECATED, "old")
    master.rendezvous("elastic-train", 1, 600, 4, 2).begin().end()
    master.network_check(round=1).begin().end()
    master.train_job("job-1", args={"a": 1}).begin().end()


EXPECTED = {
    "AtorchTrainerV2": (
        ["#start", "#init_end", "#substep", "#predict_step", "#log", "#warning", "#finish"],
        ["#train", "#epoch", "#step", "#evaluate", "#predict", "#save", "#persist_ckpt", "#init"]),
    "dlrover-agent": (
        ["#agent_start", "#agent_exit", "#process_succeeded", "#process_restart", "#process_fail",
         "#process_restart_membership", "#job_abortion", "#job_restart", "#warning"],
        ["#rendezvous", "#network_check"]),
    "dlrover-master": (
        ["#master_start", "#master_exit", "#node_join", "#worker_event", "#worker_relaunch", "#worker_create",
         "#worker_no_heartbeat", "#fault_detect", "#process_restart", "#warning"],
        ["#rendezvous", "#network_check", "#job_train"]),
}


def test_every_predefined_event_has_dlrovers_name_and_kind(log: Log) -> None:
    _trainer(dlrover.TrainerProcess("AtorchTrainerV2"))
    _agent(dlrover.DLRoverAgentEvent())
    _master(dlrover.DLRoverMasterEvent())
    records = log.records()
    for target, (instants, durations) in EXPECTED.items():
        mine = [r for r in records if r["target"] == target]
        assert [r["name"] for r in mine if r["type"] == "INSTANT"] == instants
        assert [r["name"] for r in mine if r["type"] == "BEGIN"] == durations
        assert [r["name"] for r in mine if r["type"] == "END"] == durations
    content = {(r["target"], r["name"], r["type"]): r["content"] for r in records}
    assert content["AtorchTrainerV2", "#log", "INSTANT"] == {"global_step": 1, "logs": {"loss": 0.5}}
    assert content["AtorchTrainerV2", "#persist_ckpt", "BEGIN"] == {"global_step": 1, "path": "/c", "size": 9}
    assert content["dlrover-agent", "#job_abortion", "INSTANT"] == {"caused_node_rank": 1, "reason": "r"}
    assert content["dlrover-master", "#worker_create", "INSTANT"] == {"pod_name": "pod-1", "ok": True}
    assert content["dlrover-master", "#worker_event", "INSTANT"]["exit_reason"] == ""
    assert content["dlrover-agent", "#warning", "INSTANT"] == {"warning_type": "deprecated", "msg": "old"}


def test_agent_and_master_are_singletons_per_class() -> None:
    assert dlrover.DLRoverAgentEvent.singleton_instance() is dlrover.DLRoverAgentEvent.singleton_instance()
    assert dlrover.DLRoverMasterEvent.singleton_instance() is not dlrover.DLRoverAgentEvent.singleton_instance()
    assert isinstance(dlrover.DLRoverMasterEvent.singleton_instance(), dlrover.DLRoverMasterEvent)


# -- safe calls and bad input ------------------------------------------------
class Checkpoint(dlrover.DurationSpan):
    def shard(self, index: int) -> dlrover.DurationSpan:
        return self.stage(f"shard{index}")

    def broken(self) -> dlrover.DurationSpan:
        raise RuntimeError("bug in the user's subclass")


class Saver(dlrover.Process):
    def checkpoint(self) -> Checkpoint:
        return self.custom_duration(Checkpoint, "checkpoint")

    def broken(self) -> None:
        raise ValueError("bug")


def test_a_raising_subclass_method_is_a_no_op_that_chains(log: Log) -> None:
    saver = Saver("AsyncSaver")
    assert isinstance(saver.broken(), dlrover.SafeCallable)
    with saver.checkpoint() as checkpoint:
        with checkpoint.shard(0):
            pass
        ran = False
        with checkpoint.broken() as inert:  # the body still runs, without events
            ran = True
            inert.extra_args(x=1).stage("y").begin().end()
        assert ran
        with pytest.raises(ZeroDivisionError):  # the user's own exception is never swallowed
            with checkpoint.broken():
                raise ZeroDivisionError
        checkpoint.no_such_method(1).begin()
    assert [r["name"] for r in log.records()] == ["checkpoint", "checkpoint#shard0", "checkpoint#shard0",
                                                  "checkpoint"]


class Tools(dlrover.Process):
    @staticmethod
    def helper(value: int) -> int:
        return 10 // value

    @classmethod
    def make(cls) -> Tools:
        return cls("tools")


def test_static_and_class_methods_stay_what_they_are_and_are_safe_calls(log: Log) -> None:
    tools = Tools.make()
    assert isinstance(tools, Tools) and tools.target == "tools"
    assert Tools.helper(5) == tools.helper(5) == 2
    assert isinstance(tools.helper(0), dlrover.SafeCallable)
    duration = tools.duration("d", {"a": 1})
    assert copy.copy(duration).content == {"a": 1}  # dunder lookups are not swallowed


class Unprintable:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def test_bad_input_never_raises_and_the_line_is_still_written(log: Log) -> None:
    trainer = dlrover.TrainerProcess("AtorchTrainerV2")
    cycle: dict[str, Any] = {}
    cycle["self"] = cycle
    assert isinstance(trainer.step(), dlrover.SafeCallable)  # global_step missing
    trainer.instant("odd", {"obj": Unprintable(), "when": datetime(2025, 1, 1), (1, 2): "tuple key"})
    trainer.instant("cycle", cycle)
    trainer.instant("not a mapping", [1, 2])  # type: ignore[arg-type]
    trainer.duration("d", {"x": 1}).extra_dict(42).begin().end()  # type: ignore[arg-type]
    records = log.records()
    assert [r["name"] for r in records] == ["odd", "cycle", "not a mapping", "d", "d"]
    odd = records[0]["content"]
    assert odd["obj"] == "<<non-serializable: Unprintable>>" and odd["when"] == "2025-01-01T00:00:00"
    assert odd["(1, 2)"] == "tuple key"
    assert records[1]["content"] == {"self": "<<non-serializable: dict>>"}
    assert records[2]["content"] == {}


FORGED = '\n[2026-01-01T00:00:00] [1] [deadbeef] [AtorchTrainerV2] [#step] [END] {"global_step": 1}\n'


def test_names_and_content_cannot_forge_lines(log: Log) -> None:
    process = dlrover.Process("Trainer] [x" + FORGED)
    with process.duration("#step" + FORGED + "\x1b]0;t\x07", {"note": FORGED + "\u2028\x85"}):
        process.instant("tick\r" + FORGED)
    lines = log.lines()
    assert len(lines) == 3, lines
    records = [parse(line) for line in lines]
    assert [r["type"] for r in records] == ["BEGIN", "INSTANT", "END"]
    assert all(r["id"] != "deadbeef" for r in records)
    assert records[0]["content"]["note"] == FORGED + "\u2028\x85"  # JSON gives back exactly what was given
    assert not any(character in "".join(lines) for character in "\x1b\x07\r\u2028\x85")
    assert "\\n" in records[0]["name"] and "\\x5d" in records[0]["target"]


def test_unconfigured_or_disabled_dlrover_writes_nothing_and_raises_nothing(
        log: Log, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLROVER_EVENT_ENABLE", "false")
    dlrover._reset()
    assert dlrover.get_default_exporter() is None
    with dlrover.TrainerProcess("AtorchTrainerV2").step(global_step=1):
        pass
    assert not (tmp_path / "events").exists()
    monkeypatch.setenv("DLROVER_EVENT_ENABLE", "true")
    monkeypatch.setenv("DLROVER_EVENT_TEXT_FORMATTER", "YAML")  # DLRover raises at import; we use LOG
    monkeypatch.setenv("DLROVER_EVENT_EVENT_EXPORTER", "KAFKA")  # DLRover raises too; we write the file
    dlrover._reset()
    dlrover.TrainerProcess("AtorchTrainerV2").finish()
    assert parse(log.lines()[0])["name"] == "#finish"


# -- interop -----------------------------------------------------------------
def test_a_reader_of_dlrovers_grammar_parses_every_line_of_a_run(log: Log) -> None:
    trainer = dlrover.TrainerProcess("AtorchTrainerV2")
    _trainer(trainer)
    with trainer.train():
        for step in range(3):
            with trainer.step(global_step=step, step_type="train"):
                trainer.substep(global_step=step)
            trainer.log(step, {"loss": 1.0 / (step + 1), "grad norm": [0.1, 0.2]})
        with pytest.raises(RuntimeError):
            with trainer.save(global_step=3):
                raise RuntimeError("[disk] full\n")
    _agent(dlrover.DLRoverAgentEvent())
    _master(dlrover.DLRoverMasterEvent())
    lines = log.lines()
    records = [parse(line) for line in lines]  # every line: six fields, then a JSON object
    assert len(records) == len(lines) > 60
    opened: dict[str, str] = {}
    for record in records:  # every BEGIN has its END under the same id, and the pid is ours
        assert record["pid"] == os.getpid()
        if record["type"] == "BEGIN":
            opened[record["id"]] = record["name"]
        elif record["type"] == "END":
            assert opened.pop(record["id"]) == record["name"]
    assert not opened
    steps = [r for r in records if r["name"] == "#step" and r["target"] == "AtorchTrainerV2"]
    assert [r["content"]["global_step"] for r in steps if r["type"] == "END"] == [1, 0, 1, 2]


def test_step_lines_are_python_literals_too_as_dlrovers_master_reads_them(log: Log) -> None:
    # DLRover's master reads #step content with ast.literal_eval: JSON's true/false/null are no
    # Python literals, so a step ended with success()/fail()/with must not write them.
    import ast

    trainer = dlrover.TrainerProcess("AtorchTrainerV2")
    with trainer.step(global_step=1, note=None, flags=[True, None]):
        pass
    step = trainer.step(global_step=2)
    step.begin()
    step.fail(error="nan loss")
    step = trainer.step(global_step=3)
    step.begin()
    step.success(ok=False)
    lines = [line for line in log.lines() if "[#step]" in line]
    assert len(lines) == 6
    for line in lines:
        content = line[line.index("{"):]
        assert ast.literal_eval(content) == json.loads(content)
        # The master drops every [...] from the line first: only the six fields may go.
        assert ast.literal_eval(re.sub(r"\[.*?\]", "", line).strip()) == json.loads(content)
    ends = [json.loads(line[line.index("{"):]) for line in lines if "[END]" in line]
    assert [end["success"] for end in ends] == [1, 0, 1]
    assert ends[1]["error"] == "nan loss" and ends[2]["ok"] == 0
    begins = [json.loads(line[line.index("{"):]) for line in lines if "[BEGIN]" in line]
    assert json.loads(begins[0]["flags"]) == [True, None] and "note" not in begins[0]


# -- the spans beside the log -------------------------------------------------
def test_durations_are_also_our_spans_with_our_attribute_names(
        log: Log, configure: Callable[..., Any]) -> None:
    telemetry = configure(exporter="file")
    trainer = dlrover.TrainerProcess("AtorchTrainerV2")
    with trainer.train():
        with trainer.step(global_step=5, batch_size=8, note="n") as step:
            trainer.substep(global_step=5)
            with step.stage("forward"):
                pass
        trainer.log(5, {"loss": 0.25})
        with trainer.save(global_step=5):
            pass
        trainer.evaluate(global_step=5).begin().fail("eval crashed")
    telemetry.shutdown(timeout_s=5)
    spans = {span["name"]: span for span in read_spans(telemetry.trace_path)}
    step = spans[sc.SPAN_STEP]
    assert step["attributes"][sc.STEP] == 5 and step["attributes"][sc.BATCH_SIZE] == 8
    assert step["attributes"]["training.content.note"] == "n"
    assert step["attributes"][sc.EVENT_NAME] == "#step" and step["attributes"][sc.EVENT_TARGET] == "AtorchTrainerV2"
    assert "success" not in str(step["attributes"]) and step["status"]["code"] == STATUS_OK
    assert [event["name"] for event in step["events"]] == ["#substep"]
    assert spans["#step#forward"]["parent_id"] == step["span_id"]
    assert step["parent_id"] == spans[sc.SPAN_TRAIN]["span_id"]
    assert spans[sc.SPAN_SAVE_CHECKPOINT]["attributes"][sc.CHECKPOINT_STEP] == 5
    assert spans[sc.SPAN_SAVE_CHECKPOINT]["attributes"][sc.EVENT_NAME] == "#save"
    evaluate = spans[sc.SPAN_EVALUATE]
    assert evaluate["status"] == {"code": STATUS_ERROR, "message": "eval crashed"}
    (log_event,) = spans[sc.SPAN_TRAIN]["events"]
    assert log_event["attributes"][sc.LOSS] == 0.25 and log_event["attributes"][sc.STEP] == 5
    # ... while the log keeps DLRover's keys.
    assert log.records()[1]["content"] == {"global_step": 5, "batch_size": 8, "note": "n"}


# -- DLROVER_EVENT_HOOK_ERROR -------------------------------------------------
def test_with_hook_error_an_uncaught_exception_is_logged_then_the_previous_hook_runs(
        log: Log, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[type[BaseException]] = []
    monkeypatch.setattr(sys, "excepthook", lambda exc_type, exc, tb: seen.append(exc_type))
    monkeypatch.setenv("DLROVER_EVENT_HOOK_ERROR", "true")
    monkeypatch.setattr(signal, "signal", lambda signum, handler: None)  # this test is about the excepthook
    dlrover._reset()
    try:
        raise OSError("disk gone")
    except OSError:
        sys.excepthook(*sys.exc_info())
    (record,) = log.records()
    assert (record["target"], record["name"], record["type"]) == ("ErrorReporter", "exception", "INSTANT")
    assert record["content"]["pid"] == os.getpid() and "OSError: disk gone\n" in record["content"]["stack"]
    assert seen == [OSError]
    monkeypatch.delenv("DLROVER_EVENT_HOOK_ERROR")
    dlrover._reset()  # unregistered: the previous hook is back
    assert sys.excepthook.__name__ == "<lambda>"


def test_with_hook_error_a_termination_signal_is_in_the_log_before_the_process_dies_of_it(tmp_path: Path) -> None:
    env = {**os.environ, "DLROVER_EVENT_HOOK_ERROR": "1", "DLROVER_EVENT_FILE_DIR": str(tmp_path), "RANK": "0",
           "OTEL_TRAINING_EXPORTER": "none", "PYTHONPATH": str(Path(dlrover.__file__).parents[3])}
    script = Path(__file__).resolve().parent / "scripts" / "dlrover_step_then_wait.py"
    child = subprocess.Popen([sys.executable, str(script)], env=env, cwd=tmp_path, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) == -signal.SIGTERM  # the exit status is the signal's, as without the hook
    finally:
        child.kill()
    records = [parse(line) for line in (tmp_path / "events_0.log").read_text().splitlines()]
    assert [(r["name"], r["type"]) for r in records] == [("#step", "BEGIN"), ("exit_sig", "INSTANT")]
    assert records[1]["content"]["sig_name"] == "SIGTERM" and records[1]["content"]["pid"] == child.pid
