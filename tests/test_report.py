"""``otel-training report`` on the crafted job: files, damaged input, Chrome trace, Jaeger API, a real subprocess."""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import goodput_traces as crafted
import pytest

from otel_training import semconv as sc
from otel_training.report import (
    Problem,
    build_report,
    read_paths,
    reader,
    render_html,
    render_summary,
    write_chrome_trace,
)
from otel_training.report import jaeger as jaeger_module
from otel_training.report.files import report_files
from otel_training.report.jaeger import fetch, spool


def _check_crafted(report: Any) -> None:
    for label, expected in crafted.EXPECTED_SECONDS.items():
        assert report.goodput.seconds.get(label, 0.0) == pytest.approx(expected, abs=1e-6), label
    assert report.goodput.goodput == pytest.approx(crafted.EXPECTED_GOODPUT)
    assert report.straggler_ranks == [1]
    assert report.ideal_step_s == pytest.approx(2.0)
    assert report.rank_steps[1].mean_deviation == pytest.approx(2.0)
    assert report.rank_steps[0].mean_deviation == pytest.approx(66 / 29 - 2)


def test_files_of_all_ranks_and_restarts_give_the_hand_computed_figures(tmp_path: Path) -> None:
    crafted.write_otlp(tmp_path / "traces")
    result = read_paths([tmp_path / "traces"])
    assert result.problems == []
    assert len(result.records) == len(crafted.SPANS)
    report = build_report(result.records, result.problems)
    _check_crafted(report)
    (stuck, recovered) = report.alerts
    assert (stuck.kind, stuck.rank, stuck.elapsed_s, stuck.threshold_s) == ("stuck", 0, 5.0, 3.0)
    assert "all_reduce" in stuck.stacks
    assert recovered.kind == "recovered"


def test_command_line_in_a_subprocess(tmp_path: Path) -> None:
    crafted.write_otlp(tmp_path / "traces")
    html, chrome = tmp_path / "out" / "report.html", tmp_path / "trace.json"
    completed = subprocess.run(
        [sys.executable, "-m", "otel_training.cli.main", "report", str(tmp_path / "traces"),
         "--html", str(html), "--chrome", str(chrome)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert completed.returncode == 0, completed.stderr
    out = completed.stdout
    assert "goodput: 54.6% of 4.0 min accelerator time" in out
    assert "stragglers: rank 1" in out
    assert "wasted_progress         19.00 s" in out
    assert "downtime                20.00 s" in out
    assert "training.step stuck after 5.0 s (threshold 3.0 s)" in out  # the crafted alert names no step
    assert "File \"train.py\", line 42 in all_reduce" in out
    assert html.read_text().startswith("<!DOCTYPE html>")
    assert json.loads(chrome.read_text())["traceEvents"]


def test_damaged_input_is_named_by_file_and_line_and_the_rest_is_used(tmp_path: Path) -> None:
    r0, r1 = crafted.write_otlp(tmp_path / "traces")
    # Rank 1's file: its last line (the second batch of run 1) cut short by a crash.
    lines = r1.read_text().splitlines()
    r1.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2] + "\n")
    metrics = tmp_path / "metrics-r0.jsonl"
    metrics.write_text(json.dumps({"resourceMetrics": []}) + "\n")
    csv = tmp_path / "steps.csv"
    csv.write_text("step,duration\n1,0.5\n")
    binary = tmp_path / "blob.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage\n")
    empty = tmp_path / "empty"
    empty.mkdir()

    result = read_paths([tmp_path / "traces", metrics, csv, binary, empty, tmp_path / "missing"])
    messages = [str(problem) for problem in result.problems]
    assert f"{r1}:4: truncated JSON line" in "\n".join(messages)
    assert f"{metrics}:1: OTLP metrics, not traces; skipped" in messages
    assert any(message.startswith(f"{csv}:1: not JSON") for message in messages)
    assert any(message.startswith(f"{binary}:1: ") for message in messages)
    assert f"{empty}: no OTLP JSON trace files (*.jsonl, *.json) in this directory" in messages
    assert f"{tmp_path / 'missing'}: no such file or directory" in messages
    # Everything else is still there: rank 0 whole, rank 1 without its last batch.
    lost = [span for span in crafted.SPANS if span["rank"] == 1 and span["restart"] == 1]
    lost.sort(key=lambda span: span["end"])
    assert len(result.records) == len(crafted.SPANS) - (len(lost) - len(lost) // 2)
    report = build_report(result.records, result.problems)
    assert {run.key.rank for run in report.goodput.runs} == {0, 1}
    summary = render_summary(report)
    assert "input problems (7); everything else was used:" in summary
    assert f"{r1}:4: truncated JSON line" in summary


def test_many_bad_lines_are_counted_not_listed(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("not json\n" * 50)
    result = read_paths([path])
    assert len(result.problems) == 5 + 1 + 1  # five listed, the count of the rest, "no spans found"
    assert str(result.problems[5]) == f"{path}: 45 more unreadable line(s) not listed"


def test_chrome_trace_has_ranks_as_processes_and_attributes_as_args(tmp_path: Path) -> None:
    crafted.write_otlp(tmp_path / "traces")
    result = read_paths([tmp_path / "traces"])
    out = tmp_path / "chrome.json"
    assert write_chrome_trace(result.records, out) == len(crafted.SPANS)
    events = json.loads(out.read_text())["traceEvents"]
    spans = [event for event in events if event["ph"] == "X"]
    assert {event["pid"] for event in spans} == {0, 1}
    step = next(event for event in spans if event["name"] == sc.SPAN_STEP and event["pid"] == 1)
    assert step["dur"] == pytest.approx(4e6)  # microseconds
    assert step["args"][sc.TOKENS] == 1024 and "training.restart.count" in step["args"]
    assert step["tid"] == 0
    names = {event["pid"]: event["args"]["name"] for event in events if event["name"] == "process_name"}
    assert names == {0: "rank 0 (crafted)", 1: "rank 1 (crafted)"}


def test_progress_bar_when_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    crafted.write_otlp(tmp_path / "traces")
    read_paths([tmp_path / "traces"], progress=True)
    assert "reading traces" in capsys.readouterr().err


def _jaeger_payload() -> dict[str, Any]:
    """The crafted job as Jaeger's /api/traces answers it: one trace per run, resource as process tags."""
    traces = []
    for rank in (0, 1):
        for restart in (0, 1):
            spans = [span for span in crafted.SPANS if span["rank"] == rank and span["restart"] == restart]
            tags = [{"key": key, "type": "int64" if isinstance(value, int) else "string", "value": value}
                    for key, value in crafted._resource(rank, restart).items() if key != sc.SERVICE_NAME]
            traces.append({
                "traceID": f"{rank}{restart}" * 8,
                "processes": {"p1": {"serviceName": "crafted", "tags": tags}},
                "spans": [{
                    "traceID": f"{rank}{restart}" * 8, "spanID": span["span_id"], "operationName": span["name"],
                    "references": [], "processID": "p1",
                    "startTime": crafted._s(span["start"]) // 1000,
                    "duration": int(round((span["end"] - span["start"]) * 1e6)),
                    "tags": [{"key": key, "type": "float64" if isinstance(value, float) else
                              "int64" if isinstance(value, int) else "string", "value": value}
                             for key, value in span["attributes"].items()]
                            + ([{"key": "otel.status_code", "type": "string", "value": "ERROR"}] if span["error"] else []),
                } for span in spans],
            })
    return {"data": traces, "total": 0, "limit": 0, "offset": 0, "errors": None}


@contextlib.contextmanager
def _serving(answer: Any) -> Iterator[tuple[str, list[str]]]:
    """A local HTTP server answering ``answer(path) -> (status, body)``; (its URL, the request paths)."""
    requests: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            status, body = answer(self.path)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def jaeger_api() -> Iterator[tuple[str, list[str]]]:
    """Jaeger's query API answering the crafted job to any search (recording the request paths)."""
    body = json.dumps(_jaeger_payload()).encode()
    with _serving(lambda path: (200, body) if path.startswith("/api/traces?") else (404, b"{}")) as served:
        yield served


def test_jaeger_query_api_gives_the_same_figures(jaeger_api: tuple[str, list[str]]) -> None:
    url, requests = jaeger_api
    records, problems = fetch(url, "crafted", limit=50)
    assert problems == []
    assert requests == ["/api/traces?service=crafted&limit=50"]
    _check_crafted(build_report(records, problems))


@pytest.fixture
def paging_jaeger() -> Iterator[tuple[str, list[str]]]:
    """Jaeger's search as it pages: every crafted span its own trace, the ``limit`` traces whose latest
    start is latest up to ``end`` (inclusive), newest first. So pages go back in time."""
    traces = []
    for trace in _jaeger_payload()["data"]:
        for index, span in enumerate(trace["spans"]):
            trace_id = f"{trace['traceID'][:28]}{index:04x}"
            traces.append({"traceID": trace_id, "processes": trace["processes"],
                           "spans": [{**span, "traceID": trace_id}]})
    traces.sort(key=lambda trace: -trace["spans"][0]["startTime"])

    def search(path: str) -> tuple[int, bytes]:
        query = dict(item.split("=", 1) for item in path.split("?", 1)[1].split("&"))
        end = int(query.get("end", 2**62))
        answer = [trace for trace in traces if trace["spans"][0]["startTime"] <= end and
                  query["service"] == "crafted"][:int(query["limit"])]
        return 200, json.dumps({"data": answer, "errors": None}).encode()

    with _serving(search) as served:
        yield served


def test_jaeger_spooled_page_by_page_is_read_as_a_stream_with_the_same_figures(
        paging_jaeger: tuple[str, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``report --jaeger`` spools the pages (newest first) into one file in end order and streams it:
    the figures of the records held in memory, from a file the streamed reader did not recompute."""
    url, requests = paging_jaeger
    records, problems = fetch(url, "crafted", page_traces=4)
    assert problems == [] and len(records) == len(crafted.SPANS)
    pages = len(requests)
    assert pages > 8  # many pages, each older than the one before
    monkeypatch.setattr(jaeger_module, "MERGE_FAN_IN", 3)  # page files merged in rounds, too
    monkeypatch.setattr(jaeger_module, "SPOOL_BATCH", 7)  # several lines a rank
    spooled, spool_problems = spool(url, "crafted", tmp_path, page_traces=4)
    assert spool_problems == []
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(path.name for path in spooled) == [
        "traces-r0.jsonl", "traces-r1.jsonl"]  # one file a rank, as the exporter writes; the page files are gone
    ends: dict[str, list[int]] = {}
    for path in spooled:
        for line in path.read_text().splitlines():
            for resource_spans in json.loads(line)["resourceSpans"]:
                resource = json.dumps(resource_spans["resource"])
                ends.setdefault(resource, []).extend(
                    int(span["endTimeUnixNano"]) for scope in resource_spans["scopeSpans"] for span in scope["spans"])
    assert len(ends) == 4 and sum(map(len, ends.values())) == len(crafted.SPANS)  # 4 lives
    assert all(run == sorted(run) for run in ends.values())  # in the order they ended, each life
    recomputed: list[Any] = []
    monkeypatch.setattr("otel_training.report.files._recompute", lambda *args: recomputed.append(args))
    for workers in (1, 2):
        streamed = report_files(spooled, workers=workers, progress=False)
        assert recomputed == []
        _check_crafted(streamed)
        assert render_summary(streamed) == render_summary(build_report(records, problems))


def test_jaeger_spool_keeps_jaegers_order_for_spans_ending_together(tmp_path: Path) -> None:
    """Spans ending in the same microsecond (Jaeger's resolution) keep the order Jaeger listed them in,
    as ``fetch`` and the in-memory report do: a stuck alert listed before the step it watched ends in that
    microsecond is read first. Ordered by start instead, the step would end before its stuck stretch began."""
    payload = _jaeger_payload()
    trace = payload["data"][0]  # rank 0, its first life: the stuck step and its alerts
    stuck = next(span for span in trace["spans"] if span["operationName"] == sc.SPAN_ALERT and
                 any(tag["value"] == sc.ALERT_KIND_STUCK for tag in span["tags"]))
    watched = next(tag["value"] for tag in stuck["tags"] if tag["key"] == sc.ALERT_SPAN_ID)
    step = next(span for span in trace["spans"] if span["spanID"] == watched)
    stuck["startTime"] = step["startTime"] + step["duration"]
    trace["spans"] = [stuck] + [span for span in trace["spans"] if span is not stuck and
                                span["operationName"] != sc.SPAN_ALERT]
    body = json.dumps(payload).encode()
    with _serving(lambda path: (200, body)) as (url, _):
        records, problems = fetch(url, "crafted")
        spooled, _ = spool(url, "crafted", tmp_path)
    in_memory = build_report(records, problems)
    streamed = report_files(spooled, workers=1, progress=False)
    assert streamed.goodput.seconds == in_memory.goodput.seconds
    assert streamed.goodput.seconds.get(sc.BADPUT_STUCK, 0) > 0


def test_jaeger_spool_bounds_its_lines_and_says_when_it_found_nothing(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    payload = _jaeger_payload()
    for span in payload["data"][0]["spans"]:
        span["tags"].append({"key": "note", "type": "string", "value": "x" * 5000})
    body = json.dumps(payload).encode()
    monkeypatch.setattr(jaeger_module, "SPOOL_LINE_BYTES", 20_000)
    with _serving(lambda path: (200, body)) as (url, _):
        records, problems = fetch(url, "crafted")
        spooled, spool_problems = spool(url, "crafted", tmp_path / "a")
    assert spool_problems == []
    lines = [line for path in spooled for line in path.read_text().splitlines()]
    assert max(len(line) for line in lines) < 20_000 + 6000  # a line ends once past the bound
    assert len(lines) > 8
    streamed = report_files(spooled, workers=1, progress=False)
    assert streamed.span_count == len(records) and streamed.problems == []
    empty = json.dumps({"data": [{"traceID": "ab", "processes": {}, "spans": []}]}).encode()
    with _serving(lambda path: (200, empty)) as (url, _):
        spooled, spool_problems = spool(url, "crafted", tmp_path / "b")
    assert spooled == [] and [problem.message for problem in spool_problems] == ["no spans for service 'crafted'"]


def test_report_cli_from_jaeger_summary_html_and_chrome(paging_jaeger: tuple[str, list[str]], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from otel_training.cli.main import main

    url, _ = paging_jaeger
    chrome = tmp_path / "chrome.json"
    assert main(["report", "--jaeger", url, "--service", "crafted", "--no-html", "--no-progress",
                 "--chrome", str(chrome)]) == 0
    out = capsys.readouterr().out
    assert f"{len(crafted.SPANS)} spans, 2 rank(s)" in out, out
    assert len(json.loads(chrome.read_text())["traceEvents"]) >= len(crafted.SPANS)
    assert main(["report", "--jaeger", url, "--service", "nobody", "--no-html"]) == 1
    assert "no spans for service 'nobody'" in capsys.readouterr().err  # the reason, on standard error
    assert main(["report", "--jaeger", url, "--service", "crafted", "--no-html", "--progress"]) == 0
    assert "fetching from Jaeger" in capsys.readouterr().err
    assert main(["report", "--jaeger", url, "--service", "crafted", "--no-html", "--job", "another"]) == 1
    err = capsys.readouterr().err
    assert f"{url}: no spans found" in err and "otel-training-jaeger-" not in err  # not the spool's gone files


def test_jaeger_unreachable_is_a_problem_not_a_crash() -> None:
    records, problems = fetch("http://127.0.0.1:9", "crafted", timeout_s=5)
    assert records == []
    assert "cannot reach Jaeger" in str(problems[0])


def test_demo_ends_with_the_report_summary_and_html_path(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "otel_training.cli.main", "demo", "--output-dir", str(tmp_path / "traces"),
         "--epochs", "1", "--steps", "12", "--step-time", "0.005"],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stderr
    out = completed.stdout
    assert "goodput: " in out and "steps: 12," in out
    html = tmp_path / "traces" / "otel-training-report.html"
    assert f"html report: {html}" in out
    assert html.read_text().startswith("<!DOCTYPE html>")


def test_scripts_demo_charges_the_demo_its_own_start_up_not_the_set_up_before_it(tmp_path: Path) -> None:
    """scripts/demo sets up the virtualenv, then runs the demo: the report's program start-up is the demo
    process's, from its own creation, not the set-up's (which a fresh clone spends ~20 s in). The real script,
    with a set-up that takes 3 s standing in for scripts/setup."""
    repo = Path(__file__).resolve().parent.parent
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "demo").write_text((repo / "scripts" / "demo").read_text())
    (tmp_path / "scripts" / "setup").write_text("sleep 3\n")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "otel-training").symlink_to(Path(sys.executable).parent / "otel-training")
    completed = subprocess.run(
        ["bash", str(tmp_path / "scripts" / "demo"), "--output-dir", str(tmp_path / "traces"), "--epochs", "1",
         "--steps", "6", "--step-time", "0.005", "--no-stuck"],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stderr
    report = build_report(read_paths([tmp_path / "traces"]).records)
    startup = report.goodput.seconds.get(sc.BADPUT_PROGRAM_STARTUP, 0.0)
    assert 0 < startup < 3.0, completed.stdout


def _damaged_line(name: str, start_ns: int, end_ns: int, *, span_id: str = "00000000000000d1",
                  resource: list[dict[str, Any]] | None = None) -> str:
    """An OTLP request of one span, with whatever timestamps and resource it is given."""
    return json.dumps({"resourceSpans": [{
        "resource": {"attributes": resource if resource is not None else crafted._attributes(crafted._resource(0, 0))},
        "scopeSpans": [{"spans": [{"traceId": "d" * 32, "spanId": span_id, "name": name,
                                   "startTimeUnixNano": str(start_ns), "endTimeUnixNano": str(end_ns)}]}],
    }]})


def test_large_inputs_are_read_without_tqdm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The summary needs the core alone: no progress bar rather than no report."""
    crafted.write_otlp(tmp_path / "traces")
    monkeypatch.setattr(reader, "PROGRESS_MIN_BYTES", 1)  # every input is "large"
    monkeypatch.setitem(sys.modules, "tqdm", None)  # not installed
    for progress in (None, True):
        result = read_paths([tmp_path / "traces"], progress=progress)
        assert len(result.records) == len(crafted.SPANS) and result.problems == []


def test_hostile_lines_are_problems_and_never_kill_the_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "MAX_LINE_BYTES", 250_000)
    infinite_rank = crafted._attributes(crafted._resource(0, 0))
    infinite_rank[1] = {"key": sc.TRAINING_RANK, "value": {"doubleValue": "Infinity"}}
    path = tmp_path / "hostile.jsonl"
    path.write_text("\n".join([
        "[" * 200_000,
        '{"resourceSpans":' + "[" * 3000 + "]" * 3000 + "}",
        _damaged_line(sc.SPAN_STEP, crafted.T0, crafted.T0 + 10**9, resource=infinite_rank),
        _damaged_line(sc.SPAN_ALERT, 10**23, 10**23),
        '{"resourceSpans": [], "padding": "' + "x" * 300_000 + '"}',
        _damaged_line("good", crafted.T0, crafted.T0 + 10**9),
    ]) + "\n")
    result = read_paths([path])
    assert [record.name for record in result.records] == ["good"]
    assert [problem.line for problem in result.problems] == [1, 2, 3, 4, 5]
    assert "nested too deeply" in str(result.problems[0]) and "nested too deeply" in str(result.problems[1])
    assert "longer than" in str(result.problems[4])
    report = build_report(result.records, result.problems)
    assert f"{path}:4: " in render_summary(report)
    assert render_html(report, result.records).startswith("<!DOCTYPE html>")


def test_the_same_spans_passed_twice_are_counted_once(tmp_path: Path) -> None:
    r0, _ = crafted.write_otlp(tmp_path / "traces")
    copy = tmp_path / "copy-of-r0.jsonl"
    copy.write_bytes(r0.read_bytes())
    result = read_paths([tmp_path / "traces", tmp_path / "traces", r0, copy])
    assert len(result.records) == len(crafted.SPANS)
    _check_crafted(build_report(result.records, result.problems))
    messages = [str(problem) for problem in result.problems]
    assert any(message.startswith(f"{copy}: ") and "already read" in message for message in messages), messages


def test_impossible_spans_are_problems_not_figures(tmp_path: Path) -> None:
    crafted.write_otlp(tmp_path / "traces")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([
        _damaged_line(sc.SPAN_STEP, crafted.T0 + 10 * 10**9, crafted.T0, span_id="00000000000000e1"),
        _damaged_line(sc.SPAN_STEP, -crafted.T0, crafted.T0, span_id="00000000000000e2"),
        _damaged_line(sc.SPAN_STEP, crafted.T0, 2**64 + 5, span_id="00000000000000e3"),
    ]) + "\n")
    result = read_paths([tmp_path / "traces", bad])
    assert len(result.records) == len(crafted.SPANS)
    messages = [str(problem) for problem in result.problems]
    assert any(message.startswith(f"{bad}:1: ") and "ends before it starts" in message for message in messages)
    assert any(message.startswith(f"{bad}:2: ") and "timestamp" in message for message in messages)
    assert any(message.startswith(f"{bad}:3: ") and "timestamp" in message for message in messages)
    _check_crafted(build_report(result.records, result.problems))


def test_an_alert_claiming_an_impossible_duration_is_a_problem(tmp_path: Path) -> None:
    path = tmp_path / "alerts.jsonl"
    lines = []
    for number, elapsed in enumerate(("Infinity", 1e308, "NaN", -5.0)):
        request = json.loads(_damaged_line(sc.SPAN_ALERT, crafted.T0, crafted.T0, span_id=f"{number:016x}"))
        request["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"] = crafted._attributes(
            {sc.ALERT_KIND: sc.ALERT_KIND_STUCK, sc.ALERT_THRESHOLD_S: 3.0}) + [
            {"key": sc.ALERT_ELAPSED_S, "value": {"doubleValue": elapsed}}]
        lines.append(json.dumps(request))
    path.write_text("\n".join(lines) + "\n")
    result = read_paths([path])
    assert [problem.line for problem in result.problems if problem.line] == [1, 2, 3, 4]
    assert "training.alert.elapsed_s" in str(result.problems[0])
    build_report(result.records, result.problems)


def test_escape_sequences_in_trace_content_do_not_reach_the_terminal(tmp_path: Path) -> None:
    hostile = "\x1b]0;owned\x07\x1b[2J\u202e"
    records = crafted.records()
    run = dataclasses.replace(records[0].run, job_id="job" + hostile)
    records = [dataclasses.replace(record, run=run) for record in records]
    records.append(dataclasses.replace(records[0], name=sc.SPAN_ALERT, span_id="00000000000000f1", attributes={
        sc.ALERT_KIND: "stuck" + hostile, sc.ALERT_SPAN_NAME: "step" + hostile,
        sc.ALERT_STACKS: "Thread 1\n  File \"x.py\", line 1 in f" + hostile + "\rfake line"}))
    problems = [Problem(str(tmp_path / ("name" + hostile)), 3, "not JSON" + hostile)]
    summary = render_summary(build_report(records, problems))
    assert not any(character in summary for character in "\x1b\x07\r\u202e")
    assert "job\\x1b]0;owned\\x07" in summary


def test_a_file_gone_between_listing_and_reading_is_a_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    r0, r1 = crafted.write_otlp(tmp_path / "traces")
    listed = reader.find_trace_files([tmp_path / "traces"])
    r1.unlink()  # a rotation, a cleanup: after the listing, before the sizes
    monkeypatch.setattr(reader, "find_trace_files", lambda paths: listed)
    result = read_paths([tmp_path / "traces"])
    assert any(str(problem).startswith(f"{r1}: cannot open") for problem in result.problems)
    assert {record.run.rank for record in result.records} == {0}


def test_the_summary_gives_the_loops_goodput_beside_the_jobs_and_a_spread_one_stuck_step_cannot_move(
        tmp_path: Path) -> None:
    crafted.write_otlp(tmp_path / "traces")
    result = read_paths([tmp_path / "traces"])
    report = build_report(result.records, result.problems)
    out = render_summary(report)
    loop = report.goodput.training_goodput
    startup = report.goodput.seconds.get(sc.BADPUT_PROGRAM_STARTUP, 0.0) + report.goodput.seconds.get(
        sc.BADPUT_COMPILATION, 0.0)
    assert loop is not None and startup > 0 and loop > report.goodput.goodput  # start-up is the job's, not the loop's
    assert f"training loop goodput: {loop:.1%} (the job's time without program start-up and compilation)" in out
    stats = report.job_steps
    assert stats is not None and stats.abnormal >= 1
    # The crafted steps take 2 s and 4 s, with one stuck step: the spread is the typical steps', not the stuck one's.
    assert f"MAD {stats.mad * 1000:.1f} ms" in out and "mean deviation" not in out
    assert f"mean {stats.mean * 1000:.1f} ms (pulled by the abnormal steps)" in out
    from otel_training.analysis.steps import normal_threshold, step_stats

    issue = [0.0202] * 39 + [0.8202]  # the issue's 40 steps of 20.2 ms, one of them stuck for 820 ms
    one_stuck = step_stats(issue, None, normal_threshold(issue))
    assert one_stuck is not None and one_stuck.mad == pytest.approx(0.0) and one_stuck.abnormal == 1
    assert one_stuck.mean == pytest.approx(0.0402)  # what "mean deviation 20.0 ms" came from
    html = render_html(report)
    assert "training loop goodput" in html and f"{loop:.1%}" in html and "MAD ms" in html


def test_json_output_carries_every_figure_of_the_summary(tmp_path: Path) -> None:
    """``--json`` against the text summary of the same run: each figure the summary prints, formatted the way
    the summary formats it, is the JSON's."""
    from otel_training.report.summary import _duration, _ms

    crafted.write_otlp(tmp_path / "traces")
    json_path = tmp_path / "report.json"
    completed = subprocess.run(
        [sys.executable, "-m", "otel_training.cli.main", "report", str(tmp_path / "traces"), "--no-html",
         "--json", str(json_path)], capture_output=True, text=True, timeout=120, check=False)
    assert completed.returncode == 0, completed.stderr
    text = completed.stdout
    figures = json.loads(json_path.read_text())
    assert figures["schema"] == "otel-training.report/1"
    lines = text.splitlines()

    def line(prefix: str) -> str:
        (found,) = [item for item in lines if item.startswith(prefix)]
        return found

    assert line("job ").startswith(f"job {', '.join(figures['job_ids'])}: {figures['span_count']} spans, "
                                   f"{len(figures['ranks'])} rank(s), {figures['restarts']} restart(s), "
                                   f"{figures['runs']} run(s)")
    goodput = figures["goodput"]
    assert line("goodput: ") == (f"goodput: {goodput['job']:.1%} of {_duration(goodput['accelerator_s'])} "
                                 f"accelerator time ({_duration(goodput['productive_s'])} productive)")
    assert line("training loop goodput: ").startswith(f"training loop goodput: {goodput['training_loop']:.1%} ")
    for bucket, seconds in goodput["badput_s"].items():
        if seconds > 0:
            assert (f"  {bucket:<20} {_duration(seconds):>10}  {seconds / goodput['accelerator_s']:6.1%}"
                    in lines), bucket
    steps = figures["steps"]
    job = steps["job"]
    assert line("steps: ").startswith(
        f"steps: {job['count']}, median {_ms(job['median_s'])}, p90 {_ms(job['p90_s'])}, MAD {_ms(job['mad_s'])}, "
        f"ideal {_ms(steps['ideal_s'])}, {job['abnormal']} abnormal")
    for rank in steps["ranks"]:
        row = (f"  {rank['rank']:>4} {rank['steps']['count']:>6} {_ms(rank['steps']['median_s']):>10} "
               f"{_ms(rank['steps']['p90_s']):>10} {_ms(rank['steps']['mad_s']):>10} {rank['relative_score']:>8.2f} "
               f"{rank['individual_score']:>10.2f}{'  straggler' if rank['straggler'] else ''}")
        assert row in lines, row
    stragglers = figures["stragglers"]
    assert line("stragglers: ") == "stragglers: " + ", ".join(f"rank {rank}" for rank in stragglers["ranks"])
    assert stragglers["ranks"] == [1] and all(f"  {item}" in lines for item in stragglers["lines"])
    assert all(f"  {item}" in lines for item in stragglers["job_slow_windows"])
    assert line("alerts: ") == f"alerts: {len(figures['alerts'])}"
    for alert in figures["alerts"]:
        elapsed = "" if alert["elapsed_s"] is None else f" after {alert['elapsed_s']:.1f} s"
        threshold = "" if alert["threshold_s"] is None else f" (threshold {alert['threshold_s']:.1f} s)"
        assert any(item.startswith(f"  rank {alert['rank']} restart {alert['restart']}: ")
                   and item.endswith(f" {alert['kind']}{elapsed}{threshold}") for item in lines), alert
    for number, episode in enumerate(figures["hang_episodes"], 1):
        state = "recovered" if episode["recovered"] else "still stuck when the files end"
        assert any(item.startswith(f"Hang episode {number}: {episode['seconds']:.1f} s")
                   and item.endswith(f"rank(s) {', '.join(map(str, episode['ranks']))} stuck, {state}")
                   for item in lines), episode
        assert f"  Hang verdict: {episode['verdict']}" in lines
    assert figures["problems"] == [] and "input problems" not in text
    # Standard output holds the JSON alone with "-".
    alone = subprocess.run(
        [sys.executable, "-m", "otel_training.cli.main", "report", str(tmp_path / "traces"), "--no-html",
         "--json", "-"], capture_output=True, text=True, timeout=120, check=False)
    assert alone.returncode == 0 and json.loads(alone.stdout) == figures


def test_the_html_timeline_shows_stuck_time_as_the_breakdown_counts_it_and_folds_repeat_alerts(
        tmp_path: Path) -> None:
    """A hung step was drawn productive (green) on the timeline while the breakdown said stuck; its thirty
    repeat alerts each opened with every thread's stack."""
    import types

    from otel_training.report.alerts_view import alerts_html as _alerts
    from otel_training.report.alerts_view import stuck_intervals
    from otel_training.report.digest import Alert

    crafted.write_otlp(tmp_path / "traces")
    report = build_report(read_paths([tmp_path / "traces"]).records)
    stuck = stuck_intervals(report)
    assert sum(end - start for _, start, end in stuck) / 1e9 == pytest.approx(report.goodput.seconds[sc.BADPUT_STUCK])

    def alert(kind: str, at: int, span_id: str = "00000000000000aa") -> Alert:
        return Alert(rank=0, restart=0, time_ns=at * 10**9, kind=kind, span_name=sc.SPAN_STEP, elapsed_s=float(at),
                     threshold_s=3.0, stacks="Thread 1 (most recent call first):\n  step" if kind == "stuck" else "",
                     step=4, span_id=span_id)

    page = _alerts(types.SimpleNamespace(alerts=[alert("stuck", 3), alert("stuck", 6), alert("stuck", 9),
                                                 alert("recovered", 10), alert("stuck", 13, "00000000000000bb")]))
    assert page.count("<details open>") == 2  # the first alert of each stuck span
    assert page.count("(repeat)") == 2 and page.count("<details>") == 3


def test_alerts_at_one_time_are_listed_in_rank_order_whatever_order_they_were_read_in() -> None:
    """Ranks stuck at one synchronised step can alert in the same microsecond (Jaeger keeps microseconds): the
    report orders them by rank, so files read rank by rank and Jaeger's traces give the same text."""
    records = crafted.records()
    runs = {record.run.rank: record.run for record in records}
    assert len(runs) >= 2
    alerts = [dataclasses.replace(records[0], run=runs[rank], name=sc.SPAN_ALERT, span_id=f"00000000000000a{rank}",
                                  attributes={sc.ALERT_KIND: sc.ALERT_KIND_STUCK, sc.ALERT_SPAN_NAME: "tie.step",
                                              sc.ALERT_THRESHOLD_S: 0.5, sc.ALERT_ELAPSED_S: 0.5})
              for rank in sorted(runs, reverse=True)]
    one, other = build_report(records + alerts, []), build_report(records + alerts[::-1], [])
    def ours(report: Any) -> list[int]:
        return [alert.rank for alert in report.alerts if alert.span_name == "tie.step"]

    assert ours(one) == sorted(runs) == ours(other)
    assert render_summary(one) == render_summary(other)


def test_a_damaged_jaeger_answer_is_said_and_the_rest_is_read(tmp_path: Path) -> None:
    """A span without its start or name, or a typed tag that is not of its type, never ends the report with a
    traceback: the span is skipped and counted in a problem, a bad tag keeps its value, the rest is read."""
    payload = _jaeger_payload()
    spans = payload["data"][0]["spans"]
    total = sum(len(trace["spans"]) for trace in payload["data"])
    del spans[0]["startTime"]
    spans[1].pop("operationName")
    spans[2]["tags"].append({"key": "odd", "type": "int64"})  # no value
    spans[2]["tags"].append({"key": "odder", "type": "float64", "value": "not a number"})
    spans[2]["tags"].append({"key": "oddest", "type": "int64", "value": float("inf")})  # JSON's Infinity
    spans[3]["operationName"] = None
    body = json.dumps(payload).encode()
    with _serving(lambda path: (200, body) if path.startswith("/api/traces?") else (404, b"{}")) as (url, _):
        records, problems = fetch(url, "crafted", lookback_s=10**9)
        files, spooled = spool(url, "crafted", tmp_path / "spool", lookback_s=10**9, progress=False)
    assert len(records) == total - 3
    odd = next(record for record in records if record.span_id == spans[2]["spanID"])
    assert odd.attributes["odd"] is None and odd.attributes["odder"] == "not a number"
    assert odd.attributes["oddest"] == float("inf")
    for said in (problems, spooled):
        assert any("3 span(s) without Jaeger's span fields were skipped" in str(problem)
                   and spans[0]["spanID"] in str(problem) for problem in said), said
    assert files
