"""``otel-training report --jaeger`` against the real Jaeger equals the report of the files.

Two ranks of one job write their spans with the file exporter, in traces of
at most 8 spans (``OTEL_TRAINING_TRACE_MAX_SPANS``), so the job holds more
traces than one page of Jaeger's search. The very same files are then sent
line by line (each line is an OTLP/JSON export request) to the collector's
OTLP/HTTP receiver, through the collector into Jaeger (Badger). Jaeger
keeps times in microseconds, the files in nanoseconds, so the files' times are
cut to whole microseconds first: both paths then hold the same spans. The summary
printed by ``otel-training report DIR`` and by ``otel-training report
--jaeger URL --service S --lookback SECONDS`` must be the same text.
"""

from __future__ import annotations

import json
import subprocess
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from otelstack import http_get  # scripts/stack/otelstack/
from stack_helpers import wait_until
from training_helpers import BIN, DEADLINE, E2E_MARKS, REPO, Training, new_job_id, training_env, worker_argv

from otel_training.report import jaeger as jaeger_report

pytestmark = E2E_MARKS

RANKS, STEPS, MAX_SPANS = 2, 160, 8


def _spans_in(directory: Path) -> int:
    return sum(len(span_list["spans"]) for path in directory.glob("traces-r*.jsonl") for line in path.read_text().splitlines()
               if line.strip() for rs in json.loads(line)["resourceSpans"] for span_list in rs["scopeSpans"])


def _to_microseconds(directory: Path) -> None:
    """Cut every span and event time in the OTLP/JSON files to whole microseconds, as Jaeger stores them."""
    def cut(node):
        if isinstance(node, dict):
            return {k: (str(int(v) // 1000 * 1000) if k.endswith("UnixNano") else cut(v)) for k, v in node.items()}
        if isinstance(node, list):
            return [cut(v) for v in node]
        return node

    for path in directory.glob("traces-r*.jsonl"):
        lines = [json.dumps(cut(json.loads(line)), separators=(",", ":")) for line in path.read_text().splitlines() if line.strip()]
        path.write_text("\n".join(lines) + "\n")


def _post_otlp_json(endpoint: str, line: str) -> None:
    request = urllib.request.Request(f"{endpoint}/v1/traces", data=line.encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200, response.read()[:300]


def _jaeger_trace_count(jaeger_url: str, service: str) -> tuple[int, int]:
    status, body = http_get(f"{jaeger_url}/api/traces?{urllib.parse.urlencode({'service': service, 'limit': 100000})}", timeout=30)
    assert status == 200, body[:300]
    data = json.loads(body)["data"]
    return len(data), len({span["spanID"] for trace in data for span in trace["spans"]})


def _report(*args: str) -> str:
    proc = subprocess.run([str(BIN / "otel-training"), "report", "--no-html", "--no-progress", *args],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@dataclass
class JobInJaeger:
    service: str
    files: Path
    spans: int
    traces: int


@pytest.fixture(scope="module")
def job_in_jaeger(stack, tmp_path_factory) -> JobInJaeger:
    """Two ranks' files (times cut to microseconds), and the same spans in Jaeger."""
    tmp_path = tmp_path_factory.mktemp("report-jaeger")
    service = new_job_id("e2e-report")
    job_id = new_job_id("e2e-report-job")
    out = tmp_path / "traces"
    for rank in range(RANKS):
        env = training_env(stack, service=service, job_id=job_id, OTEL_TRAINING_EXPORTER="file",
                           OTEL_TRAINING_OUTPUT_DIR=str(out), OTEL_TRAINING_RANK=str(rank),
                           OTEL_TRAINING_WORLD_SIZE=str(RANKS), OTEL_TRAINING_TRACE_MAX_SPANS=str(MAX_SPANS))
        with Training(worker_argv("--steps", str(STEPS), "--step-time", str(0.002 * (rank + 1))), env=env,
                      log=tmp_path / f"rank{rank}.log") as worker:
            assert worker.wait(timeout=DEADLINE * 2) == 0, worker.output()[-3000:]
    _to_microseconds(out)
    spans = _spans_in(out)
    assert spans >= RANKS * STEPS * 3

    for path in sorted(out.glob("traces-r*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                _post_otlp_json(stack.otlp_http_endpoint, line)

    traces, stored = wait_until(lambda: (n := _jaeger_trace_count(stack.jaeger_url, service))[1] >= spans and n,
                                timeout=DEADLINE, what=f"{spans} spans of {service} in Jaeger")
    assert stored == spans
    assert traces > jaeger_report.PAGE_TRACES, f"the job must not fit one page of {jaeger_report.PAGE_TRACES} traces: {traces}"
    return JobInJaeger(service, out, spans, traces)


def test_report_from_jaeger_equals_report_from_files(stack, job_in_jaeger):
    job = job_in_jaeger
    from_files = _report(str(job.files))
    from_jaeger = _report("--jaeger", stack.jaeger_url, "--service", job.service, "--lookback", "3600")
    assert f"{job.spans} spans, {RANKS} rank(s)" in from_files, from_files
    assert from_jaeger == from_files, f"files:\n{from_files}\njaeger:\n{from_jaeger}"
    print(f"report --jaeger on {job.traces} traces, {job.spans} spans: same summary as the files:\n{from_jaeger}")


def test_fetch_pages_through_a_job_larger_than_a_page(stack, job_in_jaeger, monkeypatch):
    """Small pages, and a limit below the job: every page is read, nothing is read twice,
    and a job cut short by the limit says so."""
    job = job_in_jaeger
    requests: list[str] = []
    real_get = jaeger_report._get

    def counting_get(address: str, timeout_s: float):
        requests.append(address)
        return real_get(address, timeout_s)

    monkeypatch.setattr(jaeger_report, "_get", counting_get)
    records, problems = jaeger_report.fetch(stack.jaeger_url, job.service, page_traces=7, lookback_s=3600)
    assert problems == []
    assert len(records) == job.spans and len({r.span_id for r in records}) == job.spans
    assert len({r.trace_id for r in records}) == job.traces
    assert len(requests) >= job.traces // 7, requests

    records, problems = jaeger_report.fetch(stack.jaeger_url, job.service, page_traces=7, limit=20, lookback_s=3600)
    assert len({r.trace_id for r in records}) == 20
    assert any("stopped at 20 traces" in str(p) for p in problems), problems
