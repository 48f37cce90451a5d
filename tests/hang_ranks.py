"""Running tests/hang_worker.py as several local gloo ranks, and reading back what they exported.

One subprocess per rank (torchrun's variables, no torchrun: a launcher would
tear the survivors down when a rank dies, and the hang is what is tested),
each in its own session, all stopped with SIGKILL at the end whatever state
they are in (SIGSTOPped ones included).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from environ import child_environ

from otel_training import semconv as sc
from otel_training.analysis.hang import GroupView, RankView
from otel_training.analysis.records import RunKey, SpanRecord
from otel_training.report.reader import attributes as otlp_attributes

HERE = Path(__file__).resolve().parent
WORKER = HERE / "hang_worker.py"
REPO = HERE.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Ranks:
    """``world`` ranks of hang_worker.py; a context manager that kills them all on exit."""

    def __init__(self, out: Path, world: int, worker_args: list[str], env: dict[str, str]) -> None:
        self.out, self.world = out, world
        out.mkdir(parents=True, exist_ok=True)
        port = str(free_port())
        self.procs: list[subprocess.Popen[bytes]] = []
        for rank in range(world):
            rank_env = dict(env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                            MASTER_ADDR="127.0.0.1", MASTER_PORT=port, HANG_WORKER_DIR=str(out),
                            PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
            with open(self.log(rank), "wb") as log:
                self.procs.append(subprocess.Popen([sys.executable, str(WORKER), *worker_args], env=rank_env,
                                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                                   cwd=out, start_new_session=True))

    def log(self, rank: int) -> Path:
        return self.out / f"rank{rank}.log"

    def output(self, rank: int) -> str:
        return self.log(rank).read_text(errors="replace")

    def outputs(self) -> str:
        return "\n".join(f"--- rank {r}\n{self.output(r)[-3000:]}" for r in range(self.world))

    def printed(self, rank: int, pattern: str) -> re.Match[str] | None:
        return re.search(pattern, self.output(rank))

    def __enter__(self) -> Ranks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # its watchdog sidecar runs in a session of its own
                except ProcessLookupError:
                    pass
            proc.wait(timeout=30)


#: The collective-tracking route the ranks take (``collective_tracking``): set by the tests' route fixture.
ROUTE = "auto"


def env_for(out: Path, **extra: str) -> dict[str, str]:
    env = child_environ("TORCH_FR", "RANK", "WORLD_SIZE")
    env["OTEL_TRAINING_COLLECTIVE_TRACKING"] = ROUTE
    env.update(OTEL_TRAINING_EXPORTER="file", OTEL_TRAINING_OUTPUT_DIR=str(out), OTEL_TRAINING_JOB_ID="hang-test",
               OTEL_METRIC_EXPORT_INTERVAL="200", OTEL_BSP_SCHEDULE_DELAY="100", OTEL_TRAINING_STUCK_THRESHOLD_S="2",
               TORCH_FR_BUFFER_SIZE="200", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


# --------------------------------------------------------------------------
# Reading back
# --------------------------------------------------------------------------
def _requests(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        return
    for line in path.read_text().split("\n")[:-1]:  # the last piece may be a partial line
        if line.strip():
            yield json.loads(line)


def records(out: Path, rank: int) -> list[SpanRecord]:
    """The rank's spans (its watchdog's alerts included: same file) as analysis records."""
    result = []
    for request in _requests(out / f"traces-r{rank}.jsonl"):
        for resource_spans in request.get("resourceSpans", []):
            run = RunKey.from_resource(otlp_attributes(resource_spans.get("resource", {}).get("attributes")))
            for scope in resource_spans.get("scopeSpans", []):
                for span in scope.get("spans", []):
                    result.append(SpanRecord(span["name"], int(span["startTimeUnixNano"]), int(span["endTimeUnixNano"]),
                                             run, otlp_attributes(span.get("attributes"))))
    return result


def alerts(out: Path, rank: int, kind: str) -> list[SpanRecord]:
    return [r for r in records(out, rank) if r.name == sc.SPAN_ALERT and r.attributes.get(sc.ALERT_KIND) == kind]


def gauges(out: Path, rank: int) -> dict[str, list[tuple[dict[str, Any], float]]]:
    """The last exported value of each gauge series of the rank: metric -> [(attributes, value)]."""
    latest: dict[str, dict[str, tuple[dict[str, Any], float]]] = {}
    for request in _requests(out / f"metrics-r{rank}.jsonl"):
        for resource_metrics in request.get("resourceMetrics", []):
            for scope in resource_metrics.get("scopeMetrics", []):
                for metric in scope.get("metrics", []):
                    for point in metric.get("gauge", {}).get("dataPoints", []):
                        attrs = otlp_attributes(point.get("attributes"))
                        value = float(point.get("asDouble", point.get("asInt", 0)))
                        latest.setdefault(metric["name"], {})[json.dumps(attrs, sort_keys=True)] = (attrs, value)
    return {name: list(series.values()) for name, series in latest.items()}


def rank_view(rank: int, samples: dict[str, list[tuple[dict[str, Any], float]]], *, alive: bool,
              stuck: bool = False, died: bool = False) -> RankView:
    """What the Prometheus rules see of one rank, built from its exported gauges."""
    by_group: dict[str, dict[str, Any]] = {}
    for metric, key in ((sc.METRIC_COLLECTIVE_ENTERED, "entered"), (sc.METRIC_COLLECTIVE_COMPLETED, "completed"),
                        (sc.METRIC_COLLECTIVE_WAIT, "wait_s"), (sc.METRIC_COLLECTIVE_STEP, "step")):
        for attrs, value in samples.get(metric, []):
            group = by_group.setdefault(attrs[sc.COLLECTIVE_GROUP], {})
            if key == "entered" and value < group.get("entered", -1):
                continue  # a series of an older op: the current one has the highest sequence number
            group[key] = value
            if key == "entered":
                group["op"] = attrs.get(sc.COLLECTIVE_OP, "")
    views = {name: GroupView(name, int(g.get("entered", 0)), int(g.get("completed", 0)), g.get("op", ""),
                             int(g["step"]) if "step" in g else None, g.get("wait_s", 0.0)) for name, g in by_group.items()}
    return RankView(rank, views, alive=alive, stuck=stuck, died=died)


def heartbeat(samples: dict[str, list[tuple[dict[str, Any], float]]]) -> float:
    values = [value for _attrs, value in samples.get(sc.METRIC_HEARTBEAT, [])]
    return max(values) if values else 0.0
