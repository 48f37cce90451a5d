"""The AReaL-style perf tracer on a real pipeline and real asyncio."""

from __future__ import annotations

import asyncio

import pytest
from otlp_json import read_spans

from otel_training import semconv as sc
from otel_training.integrations import perf_tracer


def spans_of(telemetry) -> list[dict]:
    assert telemetry.force_flush(5).completed
    return read_spans(telemetry.trace_path)


def by_name(spans: list[dict], name: str) -> list[dict]:
    return [s for s in spans if s["name"] == name]


def test_scopes_decorators_and_instants_nest(configure):
    telemetry = configure()

    @perf_tracer.trace_perf("engine.train_batch", category="compute")
    def train_batch() -> int:
        with perf_tracer.trace_scope("engine.forward", category=perf_tracer.Category.COMPUTE, args={"tokens": 128}):
            perf_tracer.instant("engine.batch_ready", category="scheduler", args={"size": 4})
        return 1

    @perf_tracer.trace_perf("engine.update", category="communication")
    async def update() -> str:
        async with perf_tracer.atrace_scope("engine.all_reduce", category="comm"):
            await asyncio.sleep(0)
        return "done"

    assert train_batch() == 1
    assert asyncio.run(update()) == "done"
    with pytest.raises(KeyError):
        with perf_tracer.trace_scope("engine.failing"):
            raise KeyError("missing")

    spans = spans_of(telemetry)
    (outer,) = by_name(spans, "engine.train_batch")
    (inner,) = by_name(spans, "engine.forward")
    assert inner["parent_id"] == outer["span_id"]
    assert inner["attributes"][sc.PERF_CATEGORY] == "compute"
    assert inner["attributes"][sc.TOKENS] == 128  # DLRover-style content keys get their aliases
    assert [e["name"] for e in inner["events"]] == ["engine.batch_ready"]
    assert inner["events"][0]["attributes"][sc.PERF_CATEGORY] == "scheduler"
    (update_span,) = by_name(spans, "engine.update")
    (reduce_span,) = by_name(spans, "engine.all_reduce")
    assert reduce_span["parent_id"] == update_span["span_id"]
    assert update_span["attributes"][sc.PERF_CATEGORY] == "comm"  # the alias is normalised
    (failing,) = by_name(spans, "engine.failing")
    assert failing["status"]["code"] == 2 and failing["events"][0]["name"] == "exception"


def configure_sessions(tmp_path, flush_threshold: int = 1):
    """AReaL keeps sessions only with a configured session tracer; so do we since issue 15."""
    return perf_tracer.configure(
        perf_tracer.PerfTracerConfig(experiment_name="exp", trial_name="trial", fileroot=str(tmp_path / "areal"),
                                     session_tracer=perf_tracer.SessionTracerConfig(enabled=True,
                                                                                    flush_threshold=flush_threshold)),
        rank=0)


@pytest.fixture(autouse=True)
def _uninstall_areal_tracer():
    perf_tracer.reset()
    yield
    perf_tracer.reset()


def test_rollout_task_session_phase_tree_across_asyncio_tasks(configure, tmp_path):
    telemetry = configure()
    configure_sessions(tmp_path)

    @perf_tracer.trace_session("reward")
    async def compute_reward(sample: int) -> float:
        await asyncio.sleep(0)
        return float(sample)

    @perf_tracer.session_context()
    async def collect(sample: int) -> tuple[int, float]:
        async with perf_tracer.atrace_session_phase("generate", start_payload={"attempt": 1},
                                                    end_payload={"output_tokens": 10 * sample}):
            await asyncio.sleep(0)
        if sample == 2:
            raise RuntimeError("reward server down")
        reward = await compute_reward(sample)
        return perf_tracer.get_session_id(), reward

    async def episode() -> list:
        perf_tracer.set_task_id(perf_tracer.register_task(7))
        results = await asyncio.gather(*(collect(i) for i in range(4)), return_exceptions=True)
        for result in results:
            if isinstance(result, tuple):
                session_id, reward = result
                status = "accepted" if reward >= 1 else "rejected"
                perf_tracer.trace_session_event("mark_finalized", session_id=session_id, status=status,
                                                reason=None if status == "accepted" else "low_reward")
        # AReaL's executor finalizes a failed episode by task: only the session not yet written is left.
        perf_tracer.trace_session_event("mark_finalized", task_id=7, status="failed", reason="reward server down")
        return results

    results = asyncio.run(episode())
    assert isinstance(results[2], RuntimeError)

    spans = spans_of(telemetry)
    (task,) = by_name(spans, sc.SPAN_ROLLOUT_TASK)
    assert task["attributes"][sc.ROLLOUT_TASK_SESSIONS] == 4 and task["attributes"][sc.ROLLOUT_TASK_ID] == 7
    sessions = by_name(spans, sc.SPAN_ROLLOUT_SESSION)
    assert len(sessions) == 4 and all(s["parent_id"] == task["span_id"] for s in sessions)
    statuses = sorted(s["attributes"][sc.ROLLOUT_SESSION_STATUS] for s in sessions)
    assert statuses == ["accepted", "accepted", "failed", "rejected"]
    failed = next(s for s in sessions if s["attributes"][sc.ROLLOUT_SESSION_STATUS] == "failed")
    assert "reward server down" in failed["attributes"][sc.ROLLOUT_SESSION_REASON]
    assert failed["status"]["code"] == 2
    rejected = next(s for s in sessions if s["attributes"][sc.ROLLOUT_SESSION_STATUS] == "rejected")
    assert rejected["attributes"][sc.ROLLOUT_SESSION_REASON] == "low_reward"
    phases = by_name(spans, sc.SPAN_ROLLOUT_PHASE)
    by_session = {s["span_id"]: s for s in sessions}
    for phase in phases:  # each phase sits under its own session, though the tasks interleaved
        session = by_session[phase["parent_id"]]
        assert phase["attributes"][sc.ROLLOUT_SESSION_ID] == session["attributes"][sc.ROLLOUT_SESSION_ID]
        assert session["start"] <= phase["start"] <= phase["end"] <= session["end"]
    assert sorted(p["attributes"][sc.ROLLOUT_PHASE_NAME] for p in phases) == ["generate"] * 4 + ["reward"] * 3
    for session in sessions:
        attributes = session["attributes"]
        assert attributes[sc.ROLLOUT_SESSION_TOTAL_S] >= attributes[sc.ROLLOUT_SESSION_PHASE_S_PREFIX + "generate"]
        assert (sc.ROLLOUT_SESSION_PHASE_S_PREFIX + "reward" in attributes) == (
            attributes[sc.ROLLOUT_SESSION_STATUS] != "failed")
    generate = next(p for p in phases if p["attributes"][sc.ROLLOUT_PHASE_NAME] == "generate"
                    and p["attributes"]["training.content.output_tokens"] == 30)
    assert generate["attributes"]["training.content.attempt"] == 1


def test_manual_phase_events_task_wide_drop_and_shutdown(configure, tmp_path):
    telemetry = configure()
    configure_sessions(tmp_path, flush_threshold=100)
    task_id = perf_tracer.register_task(5)
    first = perf_tracer.register_session(task_id)
    second = perf_tracer.register_session(task_id)
    perf_tracer.trace_session_event("mark_toolcall_start", session_id=first, tool="search")
    perf_tracer.trace_session_event("mark_toolcall_end", session_id=first, ok=True)
    perf_tracer.trace_session_event("enqueued", session_id=second, queue=3)  # not an AReaL event: ignored
    perf_tracer.trace_session_event("mark_dropped", task_id=task_id, reason="stale_weight")
    lingering = perf_tracer.register_session(6)  # its own task, never finalized
    telemetry.shutdown(timeout_s=5)

    spans = read_spans(telemetry.trace_path)
    sessions = {s["attributes"][sc.ROLLOUT_SESSION_ID]: s for s in by_name(spans, sc.SPAN_ROLLOUT_SESSION)}
    assert sessions[first]["attributes"][sc.ROLLOUT_SESSION_STATUS] == "dropped"
    assert sessions[first]["attributes"][sc.ROLLOUT_SESSION_REASON] == "stale_weight"
    assert sc.ROLLOUT_SESSION_PHASE_S_PREFIX + "toolcall" in sessions[first]["attributes"]
    (toolcall,) = by_name(spans, sc.SPAN_ROLLOUT_PHASE)
    assert toolcall["attributes"]["training.content.tool"] == "search" and toolcall["attributes"]["training.content.ok"]
    assert sessions[second]["events"] == []
    assert sessions[lingering]["attributes"][sc.ROLLOUT_SESSION_STATUS] == "pending"  # spanned at shutdown as it stood
    assert len(by_name(spans, sc.SPAN_ROLLOUT_TASK)) == 2
