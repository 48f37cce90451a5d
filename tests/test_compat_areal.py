"""``otel_training.compat.areal``: AReaL's perf_tracer API, its files, and our spans on top.

The spec is AReaL's documented behaviour (its module docstrings and config
help): file layout and line formats its converter and plotting tools read,
session records with derived ``*_s`` metrics, task/session ids in context
variables. Each test also holds us to what we add: spans, and containment.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import time
import types
from pathlib import Path

import pytest
from otlp_json import read_spans

from otel_training import semconv as sc
from otel_training.compat import areal as perf_tracer
from otel_training.config.options import ConfigError


@pytest.fixture(autouse=True)
def _uninstall():
    perf_tracer.reset()
    perf_tracer.set_task_id(None)
    perf_tracer.set_session_id(None)
    yield
    perf_tracer.reset()


def make_config(root: Path, *, enabled: bool = True, sessions: bool = False, flush_threshold: int = 1,
                **extra) -> perf_tracer.PerfTracerConfig:
    session_config = perf_tracer.SessionTracerConfig(enabled=True, flush_threshold=flush_threshold) if sessions else None
    return perf_tracer.PerfTracerConfig(experiment_name="exp", trial_name="trial", fileroot=str(root),
                                        enabled=enabled, session_tracer=session_config, **extra)


def trial_dir(root: Path) -> Path:
    return root / "logs" / getpass.getuser() / "exp" / "trial"


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def spans_of(telemetry) -> list[dict]:
    assert telemetry.force_flush(5).completed
    return read_spans(telemetry.trace_path)


def by_name(spans: list[dict], name: str) -> list[dict]:
    return [s for s in spans if s["name"] == name]


# -- the module ------------------------------------------------------------------

AREAL_NAMES = ["PerfTracer", "SessionTracer", "PerfTraceCategory", "Category", "SessionTraceEvent",
               "trace_session_event", "trace_session_phase", "atrace_session_phase", "trace_perf", "trace_session",
               "session_context", "set_session_id", "get_session_id", "set_task_id", "get_task_id", "register_task",
               "register_session", "GLOBAL_TRACER", "get_tracer", "get_session_tracer", "configure", "reset",
               "trace_scope", "atrace_scope", "instant", "save"]


def test_the_old_import_path_is_the_same_module_object(tmp_path):
    from otel_training.integrations import perf_tracer as old_path

    assert old_path is perf_tracer
    assert set(AREAL_NAMES) <= set(perf_tracer.__all__) and "is_configured" in perf_tracer.__all__
    tracer = old_path.configure(make_config(tmp_path), rank=0)
    assert perf_tracer.GLOBAL_TRACER is tracer and perf_tracer.get_tracer() is tracer
    assert perf_tracer.profiler is old_path.profiler  # one module attribute, monkeypatched once for both


def test_configure_is_configured_reset_and_get_tracer(tmp_path):
    assert not perf_tracer.is_configured() and perf_tracer.get_session_tracer() is None
    with pytest.raises(RuntimeError):
        perf_tracer.get_tracer()
    # Any object with AReaL's config fields will do (AReaL's own dataclass, an OmegaConf node...).
    config = types.SimpleNamespace(experiment_name="exp", trial_name="trial", fileroot=str(tmp_path), enabled=True,
                                   save_interval=1, profile_steps=None,
                                   session_tracer=types.SimpleNamespace(enabled=True, flush_threshold=4))
    tracer = perf_tracer.configure(config, rank=3, role="rollout")
    assert perf_tracer.is_configured() and perf_tracer.get_tracer() is tracer and tracer.enabled
    assert perf_tracer.get_session_tracer() is tracer.session_tracer is not None
    with pytest.raises(RuntimeError):  # AReaL's engines check is_configured() first
        perf_tracer.configure(config, rank=3)
    assert perf_tracer.GLOBAL_TRACER is tracer
    perf_tracer.reset()
    assert not perf_tracer.is_configured() and perf_tracer.GLOBAL_TRACER is None
    assert perf_tracer.configure(make_config(tmp_path, sessions=False), rank=0).session_tracer is None
    with pytest.raises(ValueError):
        perf_tracer.PerfTracer(make_config(tmp_path), rank=-1)


def test_task_and_session_ids_have_areal_semantics(tmp_path):
    perf_tracer.set_task_id(42)
    assert perf_tracer.get_task_id() == 42
    assert perf_tracer.register_task(7) == 7
    assert perf_tracer.register_session(7) is None  # no session tracer: no session, as in AReaL
    perf_tracer.configure(make_config(tmp_path, sessions=True), rank=0)
    assert perf_tracer.register_task(7) == 7
    assert [perf_tracer.register_session(7), perf_tracer.register_session(7), perf_tracer.register_session(8)] == [0, 1, 2]
    assert perf_tracer.get_session_tracer().get_session_ids(7) == [0, 1]
    perf_tracer.set_session_id(1)
    assert perf_tracer.get_session_id() == 1

    async def in_task(task_id: int) -> tuple[int | None, int | None]:
        perf_tracer.set_task_id(task_id)
        await asyncio.sleep(0)
        return perf_tracer.get_task_id(), perf_tracer.get_session_id()

    async def main() -> list:
        return await asyncio.gather(in_task(100), in_task(200))

    assert asyncio.run(main()) == [(100, 1), (200, 1)]  # each asyncio task has its own copy
    assert perf_tracer.get_task_id() == 42
    perf_tracer.reset()
    perf_tracer.configure(make_config(tmp_path, sessions=True), rank=0)
    assert perf_tracer.register_session(9) == 0  # a new tracer counts from 0 again


def test_session_context_registers_one_session_per_call_of_the_current_task(tmp_path):
    perf_tracer.configure(make_config(tmp_path, sessions=True, flush_threshold=100), rank=0)

    @perf_tracer.session_context()
    async def sample() -> tuple[int | None, int | None]:
        await asyncio.sleep(0)
        return perf_tracer.get_task_id(), perf_tracer.get_session_id()

    @perf_tracer.session_context()
    def sync_sample() -> int | None:
        return perf_tracer.get_session_id()

    async def episode() -> list:
        perf_tracer.set_task_id(5)
        return await asyncio.gather(sample(), sample(), sample())

    results = asyncio.run(episode())
    assert sorted(results) == [(5, 0), (5, 1), (5, 2)]
    assert perf_tracer.get_session_tracer().get_session_ids(5) == [0, 1, 2]
    assert sync_sample() is None  # no current task: the session context is None
    perf_tracer.set_task_id(6)
    assert sync_sample() == 3


# -- the Chrome trace ---------------------------------------------------------------


def test_chrome_trace_lines_and_layout(tmp_path):
    tracer = perf_tracer.configure(make_config(tmp_path), rank=1, role="actor")
    before_us = time.time_ns() // 1000
    with perf_tracer.trace_scope("step", category="communication", args={"global_step": 3}):
        with perf_tracer.trace_scope("inner", category="session.sess-0"):
            perf_tracer.instant("mark", category=perf_tracer.Category.IO, args={"value": 42})
    with pytest.raises(KeyError):
        with perf_tracer.trace_scope("failing"):
            raise KeyError("missing")
    perf_tracer.save()
    after_us = time.time_ns() // 1000

    path = trial_dir(tmp_path) / "perf_tracer" / "actor" / "traces-r1.jsonl"
    assert tracer.output_path == str(path)
    events = lines(path)
    meta = [e for e in events if e["ph"] == "M"]
    assert {e["name"] for e in meta} == {"thread_name", "process_name", "process_sort_index"}
    (process,) = [e for e in meta if e["name"] == "process_name"]
    assert process["args"] == {"name": "[actor] Rank 1, Process"} and process["pid"] == tracer._pid
    assert [e["args"] for e in meta if e["name"] == "process_sort_index"] == [{"sort_index": 1}]
    complete = {e["name"]: e for e in events if e["ph"] == "X"}
    assert set(complete) == {"step", "inner", "failing"}
    for event in complete.values():
        assert set(event) == {"name", "ph", "ts", "dur", "pid", "tid", "cat", "args"}
        assert isinstance(event["ts"], int) and isinstance(event["dur"], int) and event["dur"] >= 1
        assert before_us <= event["ts"] <= event["ts"] + event["dur"] <= after_us + 1
        assert event["args"]["rank"] == 1 and event["args"]["role"] == "actor"
    step, inner = complete["step"], complete["inner"]
    assert step["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= step["ts"] + step["dur"] + 1
    assert step["cat"] == "comm" and inner["cat"] == "session.sess-0" and complete["failing"]["cat"] == "misc"
    assert step["args"]["global_step"] == 3
    assert complete["failing"]["args"]["exception"] == "KeyError"
    (mark,) = [e for e in events if e["ph"] == "i"]
    assert mark["s"] == "t" and mark["cat"] == "io" and mark["args"] == {"value": 42, "rank": 1, "role": "actor"}
    assert inner["ts"] <= mark["ts"] <= inner["ts"] + inner["dur"]
    assert {e["tid"] for e in events if e["ph"] != "M" or e["name"] == "thread_name"} == {step["tid"]}


def test_save_interval_force_and_disabled(tmp_path):
    tracer = perf_tracer.PerfTracer(make_config(tmp_path, save_interval=3), rank=0)
    path = trial_dir(tmp_path) / "perf_tracer" / "traces-r0.jsonl"
    for step in (0, 1):
        tracer.instant(f"mark-{step}")
        tracer.save(step=step)
        assert not path.exists()
    tracer.instant("mark-2")
    tracer.save(step=2)  # the last step of the interval
    assert [e["name"] for e in lines(path) if e["ph"] == "i"] == ["mark-0", "mark-1", "mark-2"]
    tracer.instant("mark-3")
    tracer.save(step=3)
    assert len([e for e in lines(path) if e["ph"] == "i"]) == 3
    tracer.save(force=True)
    assert [e["name"] for e in lines(path) if e["ph"] == "i"][-1] == "mark-3"

    disabled = perf_tracer.PerfTracer(make_config(tmp_path / "off", enabled=False), rank=0)
    with disabled.trace_scope("nothing"):
        disabled.instant("nothing")
    disabled.save(force=True)
    assert not (tmp_path / "off").exists()


def test_reset_drops_unsaved_events_and_exit_saves_buffered_ones(tmp_path):
    tracer = perf_tracer.configure(make_config(tmp_path), rank=0)
    perf_tracer.instant("unsaved")
    tracer.reset()
    perf_tracer.instant("kept")
    perf_tracer._save_at_exit()
    names = [e["name"] for e in lines(trial_dir(tmp_path) / "perf_tracer" / "traces-r0.jsonl") if e["ph"] != "M"]
    assert names == ["kept"]


# -- session records ---------------------------------------------------------------------


def test_session_records_fields_and_derived_metrics(tmp_path):
    perf_tracer.configure(make_config(tmp_path, sessions=True, flush_threshold=2), rank=2, role="rollout")
    perf_tracer.register_task(11)
    first = perf_tracer.register_session(11)
    second = perf_tracer.register_session(11)
    perf_tracer.set_session_id(first)
    with perf_tracer.trace_session_phase("generate"):
        pass
    with perf_tracer.trace_session_phase("generate"):  # a phase may run more than once
        pass
    with perf_tracer.trace_session_phase("reward"):
        pass
    perf_tracer.trace_session_event("mark_toolcall_end", session_id=first)  # an end with no start: zero-length
    perf_tracer.trace_session_event("increment_counter", session_id=first, name="turns", value=2)
    perf_tracer.trace_session_event("increment_counter", session_id=first, name="turns")
    perf_tracer.trace_session_event("mark_finalized", session_id=first, status="accepted")
    path = trial_dir(tmp_path) / "session_tracer" / "rollout" / "sessions-r2.jsonl"
    assert not path.exists()  # one ready record, threshold 2
    perf_tracer.trace_session_event("mark_finalized", session_id=second, status="rejected", reason="low_reward")
    records = {r["session_id"]: r for r in lines(path)}
    accepted, rejected = records[first], records[second]
    assert list(accepted) == ["task_id", "session_id", "rank", "role", "status", "submit_ts", "finalized_ts",
                              "total_s", "generate_s", "reward_s", "toolcall_s", "phases", "counters"]
    assert (accepted["task_id"], accepted["rank"], accepted["role"], accepted["status"]) == (11, 2, "rollout",
                                                                                              "accepted")
    assert accepted["total_s"] == pytest.approx(accepted["finalized_ts"] - accepted["submit_ts"])
    generate = accepted["phases"]["generate"]
    assert len(generate) == 2 and all(p["start_ts"] <= p["end_ts"] for p in generate)
    assert accepted["generate_s"] == pytest.approx(sum(p["end_ts"] - p["start_ts"] for p in generate))
    assert accepted["submit_ts"] <= generate[0]["start_ts"] <= generate[1]["end_ts"] <= accepted["finalized_ts"]
    (toolcall,) = accepted["phases"]["toolcall"]
    assert toolcall["start_ts"] == toolcall["end_ts"] and accepted["toolcall_s"] == 0
    assert accepted["counters"] == {"turns": 3}
    assert rejected["reason"] == "low_reward" and rejected["status"] == "rejected"
    assert "phases" not in rejected and "generate_s" not in rejected and "counters" not in rejected
    # Written once: later events for a written session change nothing.
    perf_tracer.trace_session_event("mark_finalized", session_id=first, status="failed")
    perf_tracer.save(force=True)
    assert len(lines(path)) == 2


def test_unfinished_sessions_are_written_by_a_forced_save_and_by_reset(tmp_path):
    perf_tracer.configure(make_config(tmp_path, sessions=True, flush_threshold=1), rank=0)
    perf_tracer.register_task(1)
    pending = perf_tracer.register_session(1)
    perf_tracer.trace_session_event("mark_generate_start", session_id=pending)
    finalized_without_status = perf_tracer.register_session(1)
    perf_tracer.trace_session_event("mark_finalized", session_id=finalized_without_status)
    path = trial_dir(tmp_path) / "session_tracer" / "sessions-r0.jsonl"
    assert not path.exists()  # neither is ready: pending, and finalized without a status
    perf_tracer.save(step=0)
    assert not path.exists()  # only a forced save writes them
    perf_tracer.save(force=True)
    records = {r["session_id"]: r for r in lines(path)}
    assert records[pending]["status"] == "pending" and "finalized_ts" not in records[pending]
    assert "total_s" not in records[pending] and records[pending]["phases"]["generate"][0]["end_ts"] is None
    assert records[finalized_without_status]["status"] == "pending" and "total_s" in records[finalized_without_status]
    leftover = perf_tracer.register_session(2)
    perf_tracer.reset()
    assert [r["session_id"] for r in lines(path)][-1] == leftover


def test_task_wide_events_reach_every_unwritten_session_of_the_task(tmp_path):
    perf_tracer.configure(make_config(tmp_path, sessions=True, flush_threshold=100), rank=0)
    sessions = [perf_tracer.register_session(3) for _ in range(3)]
    other = perf_tracer.register_session(4)
    perf_tracer.trace_session_event("mark_finalized", task_id=3, status="failed", reason="workflow_exception")
    perf_tracer.trace_session_event("mark_finalized", status="accepted")  # no id: nothing, as in AReaL
    perf_tracer.trace_session_event("mark_unknown_thing", task_id=4)  # not an event: nothing
    perf_tracer.save(force=True)
    records = {r["session_id"]: r for r in lines(trial_dir(tmp_path) / "session_tracer" / "sessions-r0.jsonl")}
    assert {records[s]["status"] for s in sessions} == {"failed"}
    assert {records[s]["reason"] for s in sessions} == {"workflow_exception"}
    assert records[other]["status"] == "pending" and "phases" not in records[other]


def test_phase_functions_without_a_session_do_nothing(configure, tmp_path):
    telemetry = configure()
    perf_tracer.configure(make_config(tmp_path, sessions=True), rank=0)

    @perf_tracer.trace_session("reward")
    def reward() -> float:
        return 1.0

    @perf_tracer.trace_session("generate")
    async def generate() -> str:
        async with perf_tracer.atrace_session_phase("inner"):
            return "text"

    with perf_tracer.trace_session_phase("generate", start_payload={"a": 1}) as phase:
        assert phase is not None
    with perf_tracer.trace_scope("alongside"):
        assert reward() == 1.0 and asyncio.run(generate()) == "text"
    perf_tracer.save(force=True)
    spans = spans_of(telemetry)
    assert [s["name"] for s in spans] == ["alongside"]
    assert by_name(spans, sc.SPAN_ROLLOUT_PHASE) == [] and by_name(spans, sc.SPAN_ROLLOUT_SESSION) == []
    assert not (trial_dir(tmp_path) / "session_tracer").exists()


# -- profiling -------------------------------------------------------------------------


class FakeProfile:
    entered = 0

    def __init__(self, *args, **kwargs) -> None:
        self.kwargs = kwargs

    def __enter__(self):
        FakeProfile.entered += 1
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def export_chrome_trace(self, path: str) -> None:
        Path(path).write_text(json.dumps({"traceEvents": [
            {"ph": "M", "name": "thread_name", "pid": 9, "tid": 77, "args": {"name": "stream 7"}},
            {"ph": "X", "name": "kernel", "pid": 9, "tid": 77, "ts": 1000, "dur": 5, "args": {}},
            {"ph": "X", "name": "cpu_op", "pid": 9, "tid": 1, "ts": 1002, "dur": 2},
            {"ph": "X", "name": "span", "pid": "Spans", "tid": 0, "ts": 1001, "dur": 2},
        ]}))


def test_enable_profiler_runs_on_configured_steps_only_once_at_a_time(tmp_path, monkeypatch):
    monkeypatch.setattr(perf_tracer.profiler, "profile", FakeProfile)
    monkeypatch.setattr(FakeProfile, "entered", 0)
    tracer = perf_tracer.configure(make_config(tmp_path, profile_steps=[3]), rank=0)
    with perf_tracer.trace_scope("skip", enable_profiler=True, args={"global_step": 2}):
        pass
    assert FakeProfile.entered == 0
    with perf_tracer.trace_scope("hit", enable_profiler=True, args={"global_step": 3}) as outer:
        with perf_tracer.trace_scope("nested", enable_profiler=True):  # inherits step 3; one profiler at a time
            pass
    assert FakeProfile.entered == 1
    with perf_tracer.trace_scope("not-requested", args={"global_step": 3}):
        pass
    assert FakeProfile.entered == 1
    perf_tracer.save()
    events = lines(Path(tracer.output_path))
    (hit,) = [e for e in events if e["name"] == "hit"]
    merged = [e for e in events if e["name"] in ("kernel", "cpu_op", "span")]
    assert sorted(e["name"] for e in merged) == ["cpu_op", "kernel"]  # the profiler's own rows are left out
    assert all(e["pid"] == tracer._pid and e["tid"] < 0 and e["args"]["rank"] == 0 for e in merged)
    kernel = next(e for e in merged if e["name"] == "kernel")
    assert kernel["ts"] == pytest.approx(hit["ts"])  # the profile starts where its scope started
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name" and e["tid"] < 0}
    assert names[kernel["tid"]] == "[Profiler Stream 7]" and len(names) == 2
    assert outer.span is not None


def test_enable_profiler_with_torch_merges_its_operators(tmp_path):
    torch = pytest.importorskip("torch")
    tracer = perf_tracer.configure(make_config(tmp_path, profile_steps=[0]), rank=0)
    with perf_tracer.trace_scope("profiled", enable_profiler=True, args={"global_step": 0}):
        torch.ones(8, 8) @ torch.ones(8, 8)
    perf_tracer.save()
    events = lines(Path(tracer.output_path))
    (scope,) = [e for e in events if e["name"] == "profiled"]
    operators = [e for e in events if e.get("cat") == "cpu_op"]
    assert any(e["name"] in ("aten::mm", "aten::matmul") for e in operators)
    assert all(e["tid"] < 0 for e in operators)
    assert min(e["ts"] for e in operators) >= scope["ts"] - 1


# -- our spans -------------------------------------------------------------------------


def test_scopes_are_spans_with_or_without_the_areal_tracer(configure, tmp_path):
    telemetry = configure()

    @perf_tracer.trace_perf("engine.train_batch", category="compute")
    def train_batch() -> int:
        with perf_tracer.trace_scope("engine.forward", args={"tokens": 128}):
            perf_tracer.instant("engine.batch_ready", category="scheduler")
        return 1

    assert train_batch() == 1  # not configured: AReaL records nothing, we still trace
    perf_tracer.configure(make_config(tmp_path, enabled=False), rank=0)
    with pytest.raises(ValueError):
        with perf_tracer.trace_scope("engine.failing", category="io"):
            raise ValueError("bad batch")
    perf_tracer.set_task_id(4)
    perf_tracer.set_session_id(9)
    with perf_tracer.trace_scope("engine.in_session"):
        pass

    spans = spans_of(telemetry)
    (outer,) = by_name(spans, "engine.train_batch")
    (inner,) = by_name(spans, "engine.forward")
    assert inner["parent_id"] == outer["span_id"]
    assert outer["attributes"][sc.PERF_CATEGORY] == "compute" and inner["attributes"][sc.PERF_CATEGORY] == "misc"
    assert inner["attributes"][sc.TOKENS] == 128
    assert inner["events"][0]["name"] == "engine.batch_ready"
    assert inner["events"][0]["attributes"][sc.PERF_CATEGORY] == "scheduler"
    (failing,) = by_name(spans, "engine.failing")
    assert failing["status"]["code"] == 2 and failing["attributes"][sc.ERROR_TYPE] == "ValueError"
    (in_session,) = by_name(spans, "engine.in_session")
    assert in_session["attributes"][sc.ROLLOUT_SESSION_ID] == 9 and in_session["attributes"][sc.ROLLOUT_TASK_ID] == 4


def test_session_spans_share_the_records_timestamps(configure, tmp_path):
    telemetry = configure()
    perf_tracer.configure(make_config(tmp_path, sessions=True), rank=0)
    perf_tracer.register_task(21)
    session = perf_tracer.register_session(21)
    perf_tracer.set_session_id(session)
    with perf_tracer.trace_session_phase("generate", end_payload={"output_tokens": 5}):
        pass
    perf_tracer.trace_session_event("mark_finalized", session_id=session, status="failed", reason="timeout")

    (record,) = lines(trial_dir(tmp_path) / "session_tracer" / "sessions-r0.jsonl")
    spans = spans_of(telemetry)
    (task,) = by_name(spans, sc.SPAN_ROLLOUT_TASK)
    (span,) = by_name(spans, sc.SPAN_ROLLOUT_SESSION)
    (phase,) = by_name(spans, sc.SPAN_ROLLOUT_PHASE)
    assert span["parent_id"] == task["span_id"] and phase["parent_id"] == span["span_id"]
    assert span["start"] == pytest.approx(record["submit_ts"] * 1e9, abs=1e3)
    assert span["end"] == pytest.approx(record["finalized_ts"] * 1e9, abs=1e3)
    assert phase["start"] == pytest.approx(record["phases"]["generate"][0]["start_ts"] * 1e9, abs=1e3)
    attributes = span["attributes"]
    assert attributes[sc.ROLLOUT_SESSION_STATUS] == "failed" and attributes[sc.ROLLOUT_SESSION_REASON] == "timeout"
    assert attributes[sc.ROLLOUT_SESSION_TOTAL_S] == pytest.approx(record["total_s"])
    assert attributes[sc.ROLLOUT_SESSION_PHASE_S_PREFIX + "generate"] == pytest.approx(record["generate_s"])
    assert span["status"]["code"] == 2 and attributes[sc.ERROR_TYPE] == "error"
    assert phase["attributes"]["training.content.output_tokens"] == 5
    assert task["attributes"][sc.ROLLOUT_TASK_SESSIONS] == 1


# -- containment ---------------------------------------------------------------------------


def test_a_broken_pipeline_never_reaches_user_code_and_areal_files_are_still_written(tmp_path, monkeypatch):
    def broken():
        raise ConfigError("option output_dir: cannot create the trace directory")

    from otel_training.compat.areal import scope, sessions
    from otel_training.events import past_spans as spans
    from otel_training.events import process

    for module in (process, spans, scope, sessions):  # where perf_tracer looks up the runtime
        monkeypatch.setattr(module, "runtime", broken)
    perf_tracer.configure(make_config(tmp_path, sessions=True), rank=0)

    @perf_tracer.trace_perf("decorated")
    def decorated() -> str:
        perf_tracer.instant("mark")
        return "value"

    @perf_tracer.session_context()
    def sample() -> int | None:
        with perf_tracer.trace_session_phase("generate"):
            return perf_tracer.get_session_id()

    with perf_tracer.trace_scope("scope", args={"global_step": 1}):
        assert decorated() == "value"
    perf_tracer.set_task_id(1)
    session = sample()
    perf_tracer.trace_session_event("mark_finalized", session_id=session, status="accepted")
    with pytest.raises(RuntimeError, match="the user's own"):
        with perf_tracer.trace_scope("raising"):
            raise RuntimeError("the user's own")
    perf_tracer.save()
    names = [e["name"] for e in lines(trial_dir(tmp_path) / "perf_tracer" / "traces-r0.jsonl") if e["ph"] != "M"]
    assert sorted(names) == ["decorated", "mark", "raising", "scope"]
    (record,) = lines(trial_dir(tmp_path) / "session_tracer" / "sessions-r0.jsonl")
    assert record["status"] == "accepted" and "generate_s" in record


def test_bad_arguments_files_and_profilers_cost_a_log_line_not_the_run(tmp_path, monkeypatch):
    class Unserialisable:
        def __str__(self) -> str:
            return "<weights>"

    class BrokenProfile(FakeProfile):
        def __enter__(self):
            raise RuntimeError("profiler already running")

    monkeypatch.setattr(perf_tracer.profiler, "profile", BrokenProfile)
    blocker = tmp_path / "blocked"
    blocker.write_text("a file where the fileroot's directories should go")
    tracer = perf_tracer.configure(make_config(blocker, profile_steps=[0]), rank=0)
    with perf_tracer.trace_scope("step", enable_profiler=True, args={"global_step": 0, "model": Unserialisable()}):
        ran = True
    assert ran
    perf_tracer.save()  # cannot create the directories: kept for the next save
    assert len([e for e in tracer._events if e["ph"] == "X"]) == 1
    blocker.unlink()
    perf_tracer.save()
    (step,) = [e for e in lines(Path(tracer.output_path)) if e["ph"] == "X"]
    assert step["args"]["model"] == "<weights>"  # written as its text, not the whole save lost
    perf_tracer.trace_session_event("mark_finalized", session_id=0, status="accepted")  # no session tracer
    perf_tracer.instant("mark", args=["not", "a", "mapping"])  # type: ignore[arg-type]
    assert perf_tracer.register_session(1) is None


def test_written_sessions_and_finished_tasks_are_not_kept(tmp_path):
    tracer = perf_tracer.configure(make_config(tmp_path, sessions=True, flush_threshold=1), rank=0).session_tracer
    for task_id in range(50):
        perf_tracer.register_task(task_id)
        session = perf_tracer.register_session(task_id)
        if task_id % 2:
            perf_tracer.trace_session_event("mark_finalized", session_id=session, status="accepted")
    perf_tracer.save(force=True)
    assert len(lines(trial_dir(tmp_path) / "session_tracer" / "sessions-r0.jsonl")) == 50
    assert tracer._records == {} and tracer._task_sessions == {} and tracer._tasks == {}


def test_an_incomplete_config_traces_without_files(configure, tmp_path, monkeypatch):
    telemetry = configure()
    monkeypatch.chdir(tmp_path)
    tracer = perf_tracer.configure(types.SimpleNamespace(enabled=True, fileroot=None, experiment_name="exp",
                                                         trial_name="???", session_tracer={"enabled": True}), rank=0)
    assert tracer.output_path is None and tracer.session_tracer.output_path is None
    with perf_tracer.trace_scope("still.a.span"):
        session = perf_tracer.register_session(1)
        perf_tracer.trace_session_event("mark_finalized", session_id=session, status="accepted")
    perf_tracer.save(force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["traces"]  # the spans' directory only
    spans = spans_of(telemetry)
    assert by_name(spans, "still.a.span") and by_name(spans, sc.SPAN_ROLLOUT_SESSION)


def test_a_workflows_own_phases_are_recorded_after_areals_three(tmp_path):
    perf_tracer.configure(make_config(tmp_path, sessions=True), rank=0)
    perf_tracer.set_task_id(1)

    @perf_tracer.trace_session("run_agent")  # AReaL's own agent workflow uses this phase
    def run_agent() -> str:
        with perf_tracer.trace_session_phase("total"):  # would shadow total_s: kept in phases only
            with perf_tracer.trace_session_phase("reward"):
                return "done"

    @perf_tracer.session_context()
    def episode() -> int | None:
        assert run_agent() == "done"
        return perf_tracer.get_session_id()

    session = episode()
    perf_tracer.trace_session_event("mark_finalized", session_id=session, status="accepted")
    (record,) = lines(trial_dir(tmp_path) / "session_tracer" / "sessions-r0.jsonl")
    keys = list(record)
    assert keys.index("reward_s") < keys.index("run_agent_s") < keys.index("phases")
    assert record["run_agent_s"] >= record["reward_s"]
    assert record["total_s"] == pytest.approx(record["finalized_ts"] - record["submit_ts"])
    assert set(record["phases"]) == {"run_agent", "total", "reward"}


def test_trace_perf_on_coroutines_keeps_their_result_and_exception(configure, tmp_path):
    telemetry = configure()
    tracer = perf_tracer.configure(make_config(tmp_path), rank=0)

    @perf_tracer.trace_perf("rollout.generate", category=perf_tracer.Category.COMPUTE)
    async def generate(n: int) -> list[int]:
        async with perf_tracer.atrace_scope("rollout.decode", category="compute"):
            await asyncio.sleep(0)
        if n < 0:
            raise ValueError("negative")
        return list(range(n))

    assert generate.__name__ == "generate"
    assert asyncio.run(generate(3)) == [0, 1, 2]
    with pytest.raises(ValueError, match="negative"):
        asyncio.run(generate(-1))
    perf_tracer.save()
    complete = [e for e in lines(Path(tracer.output_path)) if e["ph"] == "X"]
    assert [(e["name"], e["args"].get("exception")) for e in complete] == [
        ("rollout.decode", None), ("rollout.generate", None), ("rollout.decode", None),
        ("rollout.generate", "ValueError")]
    spans = spans_of(telemetry)
    generates = by_name(spans, "rollout.generate")
    assert sorted(s["status"].get("code", 0) for s in generates) == [0, 2]
    assert {s["parent_id"] for s in by_name(spans, "rollout.decode")} == {s["span_id"] for s in generates}
