"""Helpers for the end-to-end tests that run instrumented training processes
against the native stack: starting and reliably stopping them, reading their
spans back from Jaeger, and querying Prometheus.

Every process a test starts carries ``E2E_TRAINING_RUN=<id>`` in its
environment (torchrun workers and watchdog sidecars inherit it), so
:meth:`Training.stop` can find and stop all of them, even those that left the
process group, and assert that nothing is left.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from environ import child_environ
from otelstack import http_get, wait_until  # scripts/stack/otelstack/
from stack_helpers import jaeger_traces, span_tags

#: The marks of these tests: e2e, and a timeout that lets a cold cache build the binaries first.
E2E_MARKS = [pytest.mark.e2e, pytest.mark.timeout(1800)]
#: How long a test waits for anything to show up in a sink (Jaeger, the alerts file, Prometheus, the webhook).
DEADLINE = 60.0

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BIN = Path(sys.executable).parent
WORKER = HERE / "train_worker.py"
RUN_MARKER = "E2E_TRAINING_RUN"


def new_job_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def training_env(stack: Any, *, service: str, job_id: str, **extra: str) -> dict[str, str]:
    """The environment of a training process exporting to ``stack``.

    Inherited ``OTEL_*`` settings are dropped so the developer's own do not
    leak in; spans leave the batch processor after 200 ms and metrics every
    500 ms (instead of 5 s and 60 s) so the tests wait less.
    """
    env = child_environ(RUN_MARKER)
    env.update(stack.client_env())
    env.update(
        OTEL_SERVICE_NAME=service,
        OTEL_TRAINING_JOB_ID=job_id,
        OTEL_BSP_SCHEDULE_DELAY="200",
        OTEL_METRIC_EXPORT_INTERVAL="500",
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


# --------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------
def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, process group) of ``pid``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[2])


def processes_marked(marker: str) -> list[int]:
    """Live (non-zombie) pids whose environment has ``E2E_TRAINING_RUN=marker``."""
    needle = f"{RUN_MARKER}={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                environ = fh.read().split(b"\0")
        except OSError:
            continue
        stat = _proc_stat(int(entry))
        if needle in environ and stat is not None and stat[0] != "Z":
            found.append(int(entry))
    return found


class Training:
    """A training command run by a test, in its own process group, output in ``log``.

    Use as a context manager: on exit every process carrying this run's
    marker (the command, torchrun workers, watchdogs) gets SIGTERM, then
    SIGKILL, and the test fails if any survives.
    """

    def __init__(self, argv: list[str], *, env: dict[str, str], log: Path, cwd: Path | None = None) -> None:
        self.marker = uuid.uuid4().hex
        self.log = log
        with open(log, "wb") as out:
            self.popen = subprocess.Popen(
                argv, env=dict(env, **{RUN_MARKER: self.marker}), stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, cwd=cwd or REPO, start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def __enter__(self) -> Training:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"training did not finish within {timeout:.0f}s; output:\n{self.output()[-4000:]}") from None

    def wait_for_output(self, pattern: str, timeout: float) -> re.Match[str]:
        def found() -> re.Match[str] | None:
            match = re.search(pattern, self.output())
            if match is None and self.popen.poll() is not None:
                raise AssertionError(f"training exited ({self.popen.returncode}) before printing {pattern!r}:\n{self.output()[-4000:]}")
            return match

        try:
            return wait_until(found, timeout=timeout, interval=0.05, what=f"{pattern!r} in the training output")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; output:\n{self.output()[-4000:]}") from None

    def stop(self, timeout: float = 15.0) -> None:
        """Stop everything this run started; fail if anything survives SIGKILL."""
        for sig, grace in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            if self.popen.poll() is None:
                _killpg(self.pid, sig)
            for pid in processes_marked(self.marker):
                _kill(pid, sig)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                self.popen.poll()
                if self.popen.returncode is not None and not processes_marked(self.marker):
                    return
                time.sleep(0.05)
        raise AssertionError(f"processes of the training run survived SIGKILL: {processes_marked(self.marker)}")

    def wait_all_exited(self, timeout: float) -> None:
        """Every process of the run (watchdogs included) exits on its own within ``timeout``."""
        wait_until(lambda: self.popen.poll() is not None and not processes_marked(self.marker),
                   timeout=timeout, interval=0.1, what="every process of the training run to exit")


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun_argv(nproc: int, *script_args: str, script: Path = WORKER) -> list[str]:
    """torchrun on loopback with a free rendezvous port, running ``script`` (train_worker.py)."""
    return [str(BIN / "torchrun"), "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
            "--master-port", str(free_port()), str(script), *script_args]


def worker_argv(*worker_args: str) -> list[str]:
    return [sys.executable, str(WORKER), *worker_args]


def read_timings(path: Path) -> list[dict[str, Any]]:
    """The per-step records train_worker.py --timings writes (complete lines only)."""
    if not path.exists():
        return []
    lines = path.read_text().split("\n")[:-1]  # the last piece may be a partial line
    return [json.loads(line) for line in lines if line]


# --------------------------------------------------------------------------
# Jaeger
# --------------------------------------------------------------------------
def jaeger_spans(jaeger_url: str, service: str) -> list[dict[str, Any]]:
    """Every span Jaeger holds for ``service``, flattened like tests/otlp_json.read_spans."""
    spans = []
    seen = set()
    for trace in jaeger_traces(jaeger_url, service):
        for span in trace["spans"]:
            if span["spanID"] in seen:
                continue
            seen.add(span["spanID"])
            process = trace["processes"][span["processID"]]
            parent = next((r["spanID"] for r in span.get("references", []) if r["refType"] == "CHILD_OF"), "")
            spans.append({
                "name": span["operationName"],
                "trace_id": span["traceID"],
                "span_id": span["spanID"],
                "parent_id": parent,
                "references": [(r["refType"], r["spanID"]) for r in span.get("references", [])],
                "attributes": span_tags(span),
                "resource": dict(span_tags(process), **{"service.name": process["serviceName"]}),
                "start_us": span["startTime"],
                "duration_us": span["duration"],
            })
    return spans


def assert_training_tree(spans: list[dict[str, Any]], *, epochs: int, steps: int, substeps: int) -> dict[str, dict]:
    """One rank's spans hold ``training.train`` > ``training.epoch`` >
    ``training.step`` > ``training.substep`` with the semantic attributes;
    returns the step spans by global step."""
    by_id = {s["span_id"]: s for s in spans}

    def parent(span: dict) -> dict | None:
        return by_id.get(span["parent_id"])

    (train,) = [s for s in spans if s["name"] == "training.train"]
    assert train["parent_id"] == "", f"training.train is not a root span: {train}"
    epoch_spans = [s for s in spans if s["name"] == "training.epoch"]
    assert sorted(s["attributes"]["training.epoch"] for s in epoch_spans) == list(range(epochs))
    assert all(parent(s) is train for s in epoch_spans), "an epoch span is not a child of training.train"
    assert {s["trace_id"] for s in epoch_spans} == {train["trace_id"]}

    step_spans = [s for s in spans if s["name"] == "training.step"]
    by_step = {s["attributes"]["training.step"]: s for s in step_spans}
    assert sorted(by_step) == list(range(epochs * steps)), f"steps in Jaeger: {sorted(by_step)}"
    for number, step in by_step.items():
        epoch = parent(step)
        assert epoch is not None and epoch["name"] == "training.epoch", f"step {number} has parent {epoch}"
        assert epoch["attributes"]["training.epoch"] == number // steps
        assert step["attributes"]["training.batch.size"] == 8
        assert step["attributes"]["training.samples"] == 8

    sub_spans = [s for s in spans if s["name"] == "training.substep"]
    per_step = Counter(parent(s)["attributes"]["training.step"] for s in sub_spans if parent(s) and parent(s)["name"] == "training.step")
    assert len(sub_spans) == epochs * steps * substeps
    assert per_step == {number: substeps for number in by_step}, "substeps are not children of their step"
    assert Counter(s["attributes"]["training.substep"] for s in sub_spans) == {i: epochs * steps for i in range(substeps)}
    return by_step


# --------------------------------------------------------------------------
# Prometheus
# --------------------------------------------------------------------------
def prometheus_query(prometheus_url: str, expr: str) -> list[dict[str, Any]]:
    """Instant query; the result vector."""
    status, body = http_get(f"{prometheus_url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
    if status != 200:
        raise RuntimeError(f"Prometheus query {expr!r} answered {status}: {body[:300]!r}")
    return json.loads(body)["data"]["result"]


def alert_fired(prometheus_url: str, alertname: str, job_id: str, window: str = "15m") -> list[dict[str, Any]]:
    """Series of ``alertname`` for ``job_id`` that were firing at some point in ``window``
    (Prometheus' ALERTS history: an alert that already resolved still counts)."""
    return prometheus_query(
        prometheus_url,
        f'max_over_time(ALERTS{{alertname="{alertname}",alertstate="firing",training_job_id="{job_id}"}}[{window}])',
    )
