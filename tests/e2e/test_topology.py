"""The agent/gateway topology, run for real on loopback (scripts/stack/otelstack/topology.py):
simulated ranks (scripts/stack/sim_rank.py: the package, OTLP) -> 2 agents ->
load balancing by trace id (DNS) -> 2 gateways (tail sampling) -> Jaeger (Badger).

Settings: sample 25 % of normal traces, decide 5 s after a trace's first span;
ranks cut traces at 1 s or 12 spans (``OTEL_TRAINING_TRACE_MAX_AGE_S``,
``_MAX_SPANS``: shorter than the window, as gateway.yaml asks), stuck threshold
0.5 s, stuck steps last 1 s. Each rank records the spans it ended per trace id;
Jaeger's API must then hold:

* every trace with an injected failed or stuck step, whole;
* the normal traces at 25 % within 4 standard deviations of a binomial draw,
  each of them whole;
* with one gateway killed (SIGKILL) mid-run: the ranks never notice (no span
  dropped, no step delayed), the agents route everything to the survivor, the
  decisive spans (failed steps, alerts) all reach Jaeger once the dead gateway's
  disk queue is drained by a restart, and what its memory held is counted.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import otelstack as stack_mod  # scripts/stack/otelstack/
import pytest
from otelstack import topology as topology_mod  # scripts/stack/otelstack/topology.py
from stack_helpers import scrape_samples, wait_until
from training_helpers import DEADLINE, E2E_MARKS, REPO, new_job_id

from otel_training.report.jaeger import fetch

pytestmark = E2E_MARKS

SIM_RANK = REPO / "scripts" / "stack" / "sim_rank.py"
RANKS, RATE, SAMPLE, DECISION_WAIT_S = 8, 20.0, 25.0, 5.0
RANK_ENV = {"OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_TRAINING_TRACE_MAX_AGE_S": "1",
            "OTEL_TRAINING_TRACE_MAX_SPANS": "12", "OTEL_TRAINING_STUCK_THRESHOLD_S": "0.5"}


@pytest.fixture(scope="module")
def topology(stack_binaries, tmp_path_factory) -> Iterator[topology_mod.Topology]:
    if topology_mod.unshare_argv() is None:
        pytest.skip("unshare --mount is not available: the agents' private /etc/hosts (gateway DNS) needs it")
    topo = topology_mod.Topology(tmp_path_factory.mktemp("topology"), stack_binaries, sample_percent=SAMPLE,
                                 decision_wait=f"{DECISION_WAIT_S:.0f}s", dns_interval="1s")
    try:
        topo.start()
    except stack_mod.StackError as exc:
        pytest.fail(f"the topology did not start: {exc}", pytrace=False)
    try:
        yield topo
    finally:
        topo.stop()
    assert not [p.name for p in topo._procs() if p.running()], "topology processes survived stop()"


class Ranks:
    """RANKS simulated ranks started together; their results once they exit."""

    def __init__(self, topo: topology_mod.Topology, tmp_path: Path, steps: int, inject: dict[int, tuple[str, str]]) -> None:
        self.service = new_job_id("e2e-topology")
        self.start_at = time.time() + 3.0  # every rank imported and configured
        self.tmp = tmp_path
        self.procs = []
        for rank in range(RANKS):
            failed, stuck = inject.get(rank, ("", ""))
            env = topo.rank_env(rank, OTEL_SERVICE_NAME=self.service, OTEL_TRAINING_JOB_ID=self.service,
                                OTEL_TRAINING_WORLD_SIZE=str(RANKS), PYTHONPATH=str(REPO), **RANK_ENV)
            argv = [sys.executable, str(SIM_RANK), "--steps", str(steps), "--rate", str(RATE), "--fail-steps", failed,
                    "--stuck-steps", stuck, "--start-at", str(self.start_at), "--result", str(tmp_path / f"rank{rank}.json")]
            with open(tmp_path / f"rank{rank}.log", "wb") as log:
                self.procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def wait(self, timeout: float) -> list[dict]:
        try:
            for rank, proc in enumerate(self.procs):
                code = proc.wait(timeout=timeout)
                assert code == 0, (self.tmp / f"rank{rank}.log").read_text()[-3000:]
        finally:
            for proc in self.procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait(timeout=10)
        return [json.loads((self.tmp / f"rank{rank}.json").read_text()) for rank in range(RANKS)]


def _in_jaeger(topo: topology_mod.Topology, service: str) -> Counter[str]:
    """Spans per trace id in Jaeger (each span id once)."""
    records, problems = fetch(topo.jaeger_url, service, lookback_s=3600)
    assert all("no spans" in str(p) for p in problems), problems
    return Counter(trace for trace, _ in {(r.trace_id, r.span_id) for r in records})


def _settled(topo: topology_mod.Topology, service: str, expected_spans: int) -> Counter[str]:
    """Jaeger's spans per trace once nothing changed for two decision windows."""
    state = {"last": None, "since": time.monotonic()}

    def stable():
        now = _in_jaeger(topo, service)
        if now != state["last"]:
            state["last"], state["since"] = now, time.monotonic()
            return None
        return now if time.monotonic() - state["since"] > 2 * DECISION_WAIT_S + 2 else None

    return wait_until(stable, timeout=DEADLINE * 3, interval=1.0, what=f"Jaeger to settle on {service}")


def _counter(url: str, name: str, **labels: str) -> float:
    return sum(v for lab, v in scrape_samples(url, name) if all(lab.get(k) == val for k, val in labels.items()))


def _sent(results: list[dict]) -> tuple[dict[str, int], dict[str, dict]]:
    """Spans ended per trace id by every rank, and the injected steps by trace id."""
    sent: dict[str, int] = {}
    for result in results:
        sent.update(result["traces"])
    return sent, {i["trace_id"]: i for r in results for i in r["injected"]}


def test_tail_sampling_keeps_failed_and_stuck_traces_whole_and_samples_the_rest(topology, tmp_path):
    inject = {rank: ("25,120", "50") if rank % 2 == 0 else ("70", "100,150") for rank in range(RANKS)}
    ranks = Ranks(topology, tmp_path, steps=200, inject=inject)
    results = ranks.wait(timeout=120)
    for result in results:
        assert result["dropped"] == 0 and result["exported"] == result["spans_ended"], result
    sent, decisive = _sent(results)
    assert len(decisive) == 3 * RANKS
    got = _settled(topology, ranks.service, sum(sent.values()))

    incomplete = {t: (got.get(t, 0), sent[t]) for t in decisive if got.get(t, 0) != sent[t]}
    assert incomplete == {}, f"failed/stuck traces not whole in Jaeger (got, sent): {incomplete}"
    assert set(got) <= set(sent), "Jaeger holds traces no rank sent"
    normal = [t for t in sent if t not in decisive]
    kept = [t for t in normal if t in got]
    partial = {t: (got[t], sent[t]) for t in kept if got[t] != sent[t]}
    assert partial == {}, f"kept normal traces not whole (got, sent): {partial}"
    n, p = len(normal), SAMPLE / 100
    tolerance = 4 * math.sqrt(p * (1 - p) / n)
    rate = len(kept) / n
    print(f"topology: {len(sent)} traces ({sum(sent.values())} spans) from {RANKS} ranks; {len(decisive)} with a failed "
          f"or stuck step, all whole in Jaeger; normal traces kept {len(kept)}/{n} = {rate:.1%} "
          f"(configured {SAMPLE:.0f}% ± {tolerance:.1%}, 4 sigma), all whole")
    assert abs(rate - p) <= tolerance, f"normal traces kept at {rate:.1%}, configured {p:.0%} ± {tolerance:.1%}"


class LastSeen(threading.Thread):
    """Scrapes a collector's own metrics every 0.2 s; keeps the last answer it gave before it died."""

    NAMES = ("otelcol_receiver_accepted_spans", "otelcol_processor_tail_sampling_sampling_traces_on_memory")

    def __init__(self, url: str) -> None:
        super().__init__(name="last-seen", daemon=True)
        self.url, self.values, self._done = url, {}, threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.2):
            try:
                self.values = {name: _counter(self.url, name) for name in self.NAMES}
            except (OSError, RuntimeError):
                pass

    def stop(self) -> dict[str, float]:
        self._done.set()
        self.join(timeout=5)
        return self.values


STEPS, KILL_AT_S = 480, 9.0


def test_killing_a_gateway_mid_run_fails_over_and_loss_is_counted(topology, tmp_path):
    dead, survivor = topology.gateways[1], topology.gateways[0]
    # Failed and stuck steps early (decided long before the kill), around it, and late (after the failover).
    inject = {rank: ("20,175,440", "40,460") if rank % 2 == 0 else ("30,185,450", "60,470") for rank in range(RANKS)}
    survivor_before = _counter(survivor.telemetry_url, "otelcol_receiver_accepted_spans", receiver="otlp")
    watch = LastSeen(dead.telemetry_url)
    watch.start()
    ranks = Ranks(topology, tmp_path, steps=STEPS, inject=inject)
    wait_until(lambda: time.time() >= ranks.start_at + KILL_AT_S, timeout=60, interval=0.05, what="the kill time")
    topology.kill_gateway(1)
    killed = time.time()
    held = watch.stop()

    def failed_over():
        return all(_counter(a.telemetry_url, "otelcol_loadbalancer_num_backends") == 1 for a in topology.agents)

    wait_until(failed_over, timeout=30, interval=0.1, what="both agents to route to the survivor only")
    failover_s = time.time() - killed
    results = ranks.wait(timeout=120)

    # The job never noticed: nothing dropped at the ranks, no step held up.
    for result in results:
        assert result["dropped"] == 0 and result["exported"] == result["spans_ended"], result
        ends = result["step_ends"]
        assert len(ends) == STEPS
        gaps = [b - a for a, b in zip(ends, ends[1:]) if killed - 1 < a < killed + failover_s + 5]
        assert max(gaps) < 0.5, f"a step was held up around the kill: {max(gaps):.2f} s"
    sent, decisive = _sent(results)
    exported = sum(r["exported"] for r in results)

    # Everything the ranks sent reached a gateway: the dead one before it died, the survivor after.
    survivor_got = _counter(survivor.telemetry_url, "otelcol_receiver_accepted_spans", receiver="otlp") - survivor_before
    dead_got = held.get("otelcol_receiver_accepted_spans", 0.0)
    assert survivor_got + dead_got >= exported, (survivor_got, dead_got, exported)
    assert survivor_got > 0.5 * exported, "the survivor did not take over the dead gateway's traffic"

    got = _settled(topology, ranks.service, sum(sent.values()))
    window = (killed - DECISION_WAIT_S - 3.0, killed + failover_s + 3.0)
    exposed = {t for t, i in decisive.items() if window[0] <= i["start"] <= window[1]}
    outside = {t: (got.get(t, 0), sent[t]) for t in decisive if t not in exposed and got.get(t, 0) != sent[t]}
    assert outside == {}, f"failed/stuck traces outside the kill window not whole (got, sent): {outside}"
    exposed_whole = sum(1 for t in exposed if got.get(t, 0) == sent[t])
    partial = {t: sent[t] - got[t] for t in got if got[t] < sent[t]}
    print(f"gateway SIGKILL at {KILL_AT_S:.0f} s into the job: failover in {failover_s:.1f} s; ranks dropped 0 of {exported} "
          f"spans, no step held up; survivor accepted {survivor_got:.0f} spans, the dead gateway {dead_got:.0f} before it "
          f"died, holding about {held.get('otelcol_processor_tail_sampling_sampling_traces_on_memory', 0):.0f} undecided "
          f"traces; {survivor_got + dead_got - exported:.0f} spans delivered twice (batches retried whole); failed/stuck traces: {len(decisive) - len(exposed)} outside the kill window all whole, "
          f"{exposed_whole}/{len(exposed)} inside it whole; traces kept in part: {len(partial)} "
          f"({sum(partial.values())} spans missing)")

    # Decisive spans are never lost: those the dead gateway had taken wait in its
    # queue on disk, and its restart sends them.
    topology.restart_gateway(1)
    wanted = {(i["trace_id"], i["kind"]) for i in decisive.values()}

    def decisive_spans():
        records, _ = fetch(topology.jaeger_url, ranks.service, lookback_s=3600)
        found = {(r.trace_id, "failed") for r in records if r.name == "training.step" and r.error}
        found |= {(r.trace_id, "stuck") for r in records if r.attributes.get("training.alert.kind") == "stuck"}
        return wanted <= found

    wait_until(decisive_spans, timeout=DEADLINE, interval=1.0, what="every failed step and stuck alert in Jaeger")
