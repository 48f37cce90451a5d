"""The span spool: what the collector cannot take is kept, counted apart, and sent later.

Unit tests drive ``GuardedSpanExporter`` with a scripted exporter and an
injected clock; the integration test runs the real OTLP exporter against a
port where nothing listens and reads the spool back with the report's reader.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
from collections.abc import Sequence
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from otlp_json import read_spans

import otel_training
from otel_training import semconv as sc
from otel_training.exporters.guarded import GuardedSpanExporter
from otel_training.exporters.span_json import spans_to_otlp_json
from otel_training.exporters.spool import Spool, send


class _Scripted(SpanExporter):
    def __init__(self) -> None:
        self.results: list[SpanExportResult] = []
        self.calls = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        return self.results.pop(0) if self.results else SpanExportResult.SUCCESS


def _spans(count: int) -> list[ReadableSpan]:
    tracer = TracerProvider(shutdown_on_exit=False).get_tracer("test")
    spans = []
    for index in range(count):
        span = tracer.start_span(f"s{index}")
        span.end()
        spans.append(span)
    return spans


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_failed_batch_is_spooled_and_the_collector_retried_only_every_probe_interval(tmp_path: Path) -> None:
    inner, clock = _Scripted(), _Clock()
    spool = Spool(tmp_path / "spool-r0-1.jsonl", max_bytes=1 << 20)
    guard = GuardedSpanExporter(inner, spool=spool, probe_interval_s=30, clock=clock)
    inner.results = [SpanExportResult.FAILURE]
    assert guard.export(_spans(3)) is SpanExportResult.SUCCESS  # spooled: nothing for the SDK to retry
    assert (guard.exported, guard.spooled, guard.failed, inner.calls) == (0, 3, 0, 1)
    assert not guard.progressing()  # so a full queue does not wait for it

    clock.now += 29  # within the probe interval: straight to the spool, the collector is not tried
    guard.export(_spans(2))
    assert (guard.spooled, inner.calls) == (5, 1)

    clock.now += 1  # the probe: the collector is back
    guard.export(_spans(4))
    assert (guard.exported, guard.spooled, inner.calls) == (4, 5, 2)
    assert guard.progressing()
    spool.close()
    assert [span["name"] for span in read_spans(spool.path)] == ["s0", "s1", "s2", "s0", "s1"]


def test_past_its_bound_the_spool_takes_nothing_and_the_spans_count_as_failed(tmp_path: Path) -> None:
    inner = _Scripted()
    inner.results = [SpanExportResult.FAILURE] * 3
    one_line = len(spans_to_otlp_json(_spans(1))) + 1
    spool = Spool(tmp_path / "spool-r0-1.jsonl", max_bytes=2 * one_line)
    guard = GuardedSpanExporter(inner, spool=spool, probe_interval_s=0)
    guard.export(_spans(1))
    assert guard.spooled == 1
    guard.export(_spans(20))  # would pass the bound: refused whole
    assert (guard.spooled, guard.failed) == (1, 20)
    assert spool.path.stat().st_size == one_line


def test_a_closed_guard_spools_what_the_shutdown_still_hands_it(tmp_path: Path) -> None:
    inner = _Scripted()
    spool = Spool(tmp_path / "spool-r0-1.jsonl", max_bytes=1 << 20)
    guard = GuardedSpanExporter(inner, spool=spool)
    guard.close()
    guard.export(_spans(2))
    assert (guard.spooled, guard.failed, inner.calls) == (2, 0, 0)


def test_without_a_spool_a_failed_batch_fails_as_before() -> None:
    inner = _Scripted()
    inner.results = [SpanExportResult.FAILURE]
    guard = GuardedSpanExporter(inner)
    assert guard.export(_spans(2)) is SpanExportResult.FAILURE
    assert (guard.failed, guard.spooled) == (2, 0)


def _spool_of(tmp_path: Path, batches: int) -> Path:
    spool = Spool(tmp_path / "spool-r0-1.jsonl", max_bytes=1 << 20)
    for _ in range(batches):
        spool.write(_spans(2))
    spool.close()
    return spool.path


def test_send_posts_each_line_resumes_after_a_failure_and_marks_the_file_done(tmp_path: Path) -> None:
    path = _spool_of(tmp_path, 4)
    posted: list[bytes] = []

    def down_after_two(url: str, body: bytes, timeout_s: float) -> None:
        if len(posted) == 2:
            raise urllib.error.URLError("connection refused")
        posted.append(body)

    result = send(path, "http://collector/v1/traces", post=down_after_two)
    assert (result.lines_sent, result.lines_total) == (2, 4) and "spool-r0-1.jsonl:3" in result.error
    assert path.exists() and path.with_name(path.name + ".sent").read_text() == "2"

    result = send(path, "http://collector/v1/traces", post=lambda url, body, timeout_s: posted.append(body))
    assert (result.lines_sent, result.error) == (4, None)
    assert posted == path.with_name(path.name + ".done").read_bytes().split(b"\n")[:-1]  # each once, in order
    assert not path.exists() and not path.with_name(path.name + ".sent").exists()


def test_send_skips_a_line_the_collector_refuses_as_malformed(tmp_path: Path) -> None:
    path = _spool_of(tmp_path, 2)
    with path.open("ab") as file:
        file.write(b'{"resourceSpans":[{"cut short\n')  # what a crash mid-write leaves, closed by the next open
    sent: list[bytes] = []

    def refuse_bad_json(url: str, body: bytes, timeout_s: float) -> None:
        try:
            json.loads(body)
        except ValueError:
            raise urllib.error.HTTPError(url, 400, "Bad Request", {}, None) from None  # type: ignore[arg-type]
        sent.append(body)

    result = send(path, "http://collector/v1/traces", post=refuse_bad_json)
    assert (result.lines_sent, result.lines_total, result.refused, result.error) == (3, 3, (3,), None)
    assert len(sent) == 2


@pytest.mark.parametrize("offload", [False, True], ids=["in-process", "offloaded"])
def test_the_real_otlp_exporter_against_no_collector_spools_every_span(tmp_path: Path, monkeypatch,
                                                                       offload: bool) -> None:
    # Nothing listens on port 9: every export fails (after the exporter's 1 s timeout).
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    telemetry = otel_training.configure(reconfigure=True, exporter="otlp", metrics=False,
                                        spool_dir=str(tmp_path / "spool"), signal_hooks=False,
                                        exception_hooks=False, offload=offload)  # offloaded: the drain spools
    try:
        trainer = otel_training.TrainerProcess()
        with trainer.epoch(epoch=0):
            for step in range(30):
                with trainer.step(global_step=step):
                    pass
    finally:
        result = telemetry.shutdown(timeout_s=20)
    assert (result.exported, result.dropped) == (0, 0)
    assert result.spooled >= 31  # the steps, the epoch and whatever else ended (the process span at exit)
    assert telemetry.spool_path is not None and telemetry.spool_path.parent == tmp_path / "spool"
    spans = read_spans(telemetry.spool_path)
    assert len(spans) == result.spooled
    assert sorted(span["attributes"][sc.STEP] for span in spans if span["name"] == sc.SPAN_STEP) == list(range(30))
    # The report reads a spool as it reads a trace file.
    report = subprocess.run([sys.executable, "-m", "otel_training.cli.main", "report", str(telemetry.spool_path)],
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    assert "steps: 30" in report.stdout


@pytest.mark.parametrize("offload", [False, True], ids=["in-process", "offloaded"])
def test_an_unusable_spool_dir_fails_before_training(tmp_path: Path, offload: bool) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(otel_training.ConfigError, match=r"spool_dir=.*a-file/spool.*cannot create the spool"):
        otel_training.configure(reconfigure=True, exporter="otlp", spool_dir=str(blocker / "spool"), offload=offload)
