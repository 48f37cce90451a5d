"""Helpers of tests/e2e/test_opensearch_topology.py: the topology with Jaeger on a three-node
OpenSearch cluster, simulated ranks that also write their spans to files, and the two reports
(``otel-training report DIR`` and ``report --jaeger``) to compare."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from otelstack import opensearch as opensearch_mod  # scripts/stack/otelstack/
from otelstack import topology as topology_mod
from stack_helpers import scrape_samples
from training_helpers import BIN, REPO, new_job_id

from otel_training.report.jaeger import fetch

SIM_RANK = REPO / "scripts" / "stack" / "sim_rank.py"
#: Traces cut at 1 s or 12 spans (shorter than the gateways' window), stuck steps alerted after 0.5 s.
RANK_ENV = {"OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_TRAINING_TRACE_MAX_AGE_S": "1",
            "OTEL_TRAINING_TRACE_MAX_SPANS": "12", "OTEL_TRAINING_STUCK_THRESHOLD_S": "0.5"}


def require_opensearch() -> None:
    """Skip (developer machine) or fail (CI) when the OpenSearch cluster cannot be built or run here."""
    missing = opensearch_mod.missing_prerequisites()
    if not missing:
        return
    msg = "OpenSearch cluster unavailable, missing: " + "; ".join(missing)
    if os.environ.get("CI"):
        pytest.fail(msg + " (CI is set: scripts/setup --all must install these)", pytrace=False)
    pytest.skip(msg)


class Ranks:
    """Simulated ranks started together, each exporting OTLP to an agent and writing its spans to ``files``."""

    def __init__(self, topo: topology_mod.Topology, tmp_path: Path, *, ranks: int, steps: int, rate: float,
                 inject: dict[int, tuple[str, str]] | None = None, start_in: float = 3.0) -> None:
        self.service = new_job_id("e2e-opensearch")
        self.start_at = time.time() + start_in  # every rank imported and configured
        self.tmp, self.files, self.n = tmp_path, tmp_path / "traces", ranks
        self.procs = []
        self.end = self.start_at + steps / rate  # when the last step is due
        for rank in range(ranks):
            failed, stuck = (inject or {}).get(rank, ("", ""))
            env = topo.rank_env(rank, OTEL_SERVICE_NAME=self.service, OTEL_TRAINING_JOB_ID=self.service,
                                OTEL_TRAINING_WORLD_SIZE=str(ranks), PYTHONPATH=str(REPO), **RANK_ENV)
            argv = [sys.executable, str(SIM_RANK), "--steps", str(steps), "--rate", str(rate), "--fail-steps", failed,
                    "--stuck-steps", stuck, "--start-at", str(self.start_at), "--file-dir", str(self.files),
                    "--result", str(tmp_path / f"rank{rank}.json")]
            with open(tmp_path / f"rank{rank}.log", "wb") as log:
                self.procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                   start_new_session=True))

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
        return [json.loads((self.tmp / f"rank{rank}.json").read_text()) for rank in range(self.n)]


def sent_per_trace(results: list[dict]) -> Counter[str]:
    sent: Counter[str] = Counter()
    for result in results:
        sent.update(result["traces"])
    return sent


def in_jaeger(jaeger_url: str, service: str) -> Counter[str]:
    """Spans per trace id read back through Jaeger's API (each span id once)."""
    records, problems = fetch(jaeger_url, service, lookback_s=3600)
    assert all("no spans" in str(p) for p in problems), problems
    return Counter(trace for trace, _ in {(r.trace_id, r.span_id) for r in records})


def to_microseconds(directory: Path) -> None:
    """Rewrite the rank files' times as Jaeger keeps them: a span's start cut to whole microseconds and its
    duration (end - start) cut to whole microseconds, so its end is start + duration; event times cut too."""
    def us(ns) -> int:
        return int(ns) // 1000 * 1000

    def cut(node):
        if isinstance(node, list):
            return [cut(v) for v in node]
        if not isinstance(node, dict):
            return node
        out = {k: (str(us(v)) if k.endswith("UnixNano") else cut(v)) for k, v in node.items()}
        if "startTimeUnixNano" in node and "endTimeUnixNano" in node:
            start, end = int(node["startTimeUnixNano"]), int(node["endTimeUnixNano"])
            out["endTimeUnixNano"] = str(us(start) + us(end - start))
        return out

    for path in directory.glob("traces-r*.jsonl"):
        lines = [json.dumps(cut(json.loads(line)), separators=(",", ":")) for line in path.read_text().splitlines()
                 if line.strip()]
        path.write_text("\n".join(lines) + "\n")


def report(*args: str) -> str:
    proc = subprocess.run([str(BIN / "otel-training"), "report", "--no-html", "--no-progress", *args],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def reports(jaeger_url: str, ranks: Ranks) -> tuple[str, str]:
    """The file report of the ranks' own files (times cut to microseconds) and the report read from Jaeger."""
    to_microseconds(ranks.files)
    return report(str(ranks.files)), report("--jaeger", jaeger_url, "--service", ranks.service, "--lookback", "3600")


def counter(url: str, name: str, **labels: str) -> float:
    return sum(v for lab, v in scrape_samples(url, name) if all(lab.get(k) == val for k, val in labels.items()))


class HealthWatch(threading.Thread):
    """The cluster's health every 0.1 s: the sequence of (status, nodes) it went through, with times."""

    def __init__(self, cluster: opensearch_mod.OpenSearchCluster) -> None:
        super().__init__(name="opensearch-health", daemon=True)
        self.cluster, self.seen, self._done = cluster, [], threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.1):
            try:
                health = self.cluster.health()
            except Exception:  # noqa: BLE001 - a node dying mid-answer (http.client's errors are not OSErrors)
                state = ("unanswered", 0)
            else:
                state = (health["status"], health["number_of_nodes"])
            if not self.seen or self.seen[-1][1] != state:
                self.seen.append((time.time(), state))

    def stop(self) -> list[tuple[float, tuple[str, int]]]:
        self._done.set()
        self.join(timeout=5)
        return self.seen
