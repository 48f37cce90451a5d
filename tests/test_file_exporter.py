"""The embedded file sink under a hostile filesystem: disk full, a deleted directory, planted symlinks, modes."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otlp_json import read_spans

import otel_training
from otel_training.exporters.otlp_json import OtlpJsonFileSpanExporter
from otel_training.report.reader import read_file


def _spans(count: int, prefix: str) -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("test")
    for index in range(count):
        with tracer.start_as_current_span(f"{prefix}-{index}", attributes={"padding": "x" * 200}):
            pass
    return list(memory.get_finished_spans())


class FullDisk:
    """``os.write`` for one file as on a filesystem with ``free`` bytes left (None: unlimited).

    The kernel's behaviour: a write larger than the space left writes what fits
    and returns that count; the next write fails with ENOSPC.
    """

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.free: int | None = None
        self._write = os.write

    def write(self, fd: int, data: bytes) -> int:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if self.free is None or target != self.path:
            return self._write(fd, data)
        if self.free == 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        written = self._write(fd, bytes(data[: self.free]))
        self.free -= written
        return written


@pytest.fixture
def full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FullDisk]:
    disk = FullDisk(tmp_path / "traces" / "traces-r0.jsonl")
    monkeypatch.setattr(os, "write", disk.write)
    yield disk


def test_a_batch_after_disk_full_starts_on_its_own_line(tmp_path: Path, full_disk: FullDisk) -> None:
    path = tmp_path / "traces" / "traces-r0.jsonl"
    exporter = OtlpJsonFileSpanExporter(path)
    assert exporter.export(_spans(3, "before")) is SpanExportResult.SUCCESS
    full_disk.free = 100  # the next batch is cut after 100 bytes, then ENOSPC
    assert exporter.export(_spans(3, "cut")) is SpanExportResult.FAILURE
    full_disk.free = 0  # still full: even the newline closing the cut line fails
    assert exporter.export(_spans(3, "refused")) is SpanExportResult.FAILURE
    full_disk.free = None  # space freed
    assert exporter.export(_spans(3, "after")) is SpanExportResult.SUCCESS
    exporter.shutdown()

    records, problems = read_file(path)
    assert sorted(record.name for record in records) == [f"{prefix}-{index}" for prefix in ("after", "before")
                                                         for index in range(3)]
    assert [(problem.line, problem.message.split(" (")[0]) for problem in problems] == [(2, "truncated JSON line")]


def test_a_deleted_output_directory_is_recreated_and_later_spans_land_in_it(
        configure, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    output_dir = tmp_path / "traces"
    telemetry = configure(exporter="file", output_dir=str(output_dir), metrics=False, offload=False)
    trainer = otel_training.TrainerProcess()
    for step in range(5):
        with trainer.step(global_step=step):
            pass
    assert telemetry.force_flush(5).exported == 5
    shutil.rmtree(output_dir)
    for step in range(5, 12):
        with trainer.step(global_step=step):
            pass
    result = telemetry.force_flush(5)
    assert (result.exported, result.dropped) == (12, 0)
    spans = read_spans(output_dir / "traces-r0.jsonl")
    assert sorted(span["attributes"]["training.step"] for span in spans) == list(range(5, 12))
    assert "was deleted or replaced" in caplog.text and "1 batch(es) of 5 record(s)" in caplog.text


def test_a_file_renamed_away_is_replaced_by_a_new_one_at_its_path(tmp_path: Path) -> None:
    path = tmp_path / "traces-r0.jsonl"
    exporter = OtlpJsonFileSpanExporter(path)
    assert exporter.export(_spans(2, "old")) is SpanExportResult.SUCCESS
    path.rename(tmp_path / "traces-r0.jsonl.1")  # logrotate
    assert exporter.export(_spans(2, "new")) is SpanExportResult.SUCCESS
    exporter.shutdown()
    assert sorted(span["name"] for span in read_spans(path)) == ["new-0", "new-1"]
    assert sorted(span["name"] for span in read_spans(tmp_path / "traces-r0.jsonl.1")) == ["old-0", "old-1"]


def test_a_batch_written_while_the_file_is_deleted_is_written_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "traces-r0.jsonl"
    exporter = OtlpJsonFileSpanExporter(path)
    assert exporter.export(_spans(2, "old")) is SpanExportResult.SUCCESS
    write = os.write

    def delete_then_write(fd: int, data: bytes) -> int:
        monkeypatch.setattr(os, "write", write)
        path.unlink()  # between the check before the write and the write itself
        return write(fd, data)

    monkeypatch.setattr(os, "write", delete_then_write)
    assert exporter.export(_spans(2, "new")) is SpanExportResult.SUCCESS
    exporter.shutdown()
    assert sorted(span["name"] for span in read_spans(path)) == ["new-0", "new-1"]
    assert exporter.lost_spans == 2


def test_a_symlink_at_the_trace_file_is_refused_not_followed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    victim = tmp_path / "victim"
    victim.write_text("secret\n")
    victim.chmod(0o600)
    link = tmp_path / "traces" / "traces-r0.jsonl"
    link.parent.mkdir()
    link.symlink_to(victim)
    dangling = tmp_path / "traces" / "traces-r1.jsonl"
    dangling.symlink_to(tmp_path / "created-by-the-link")

    for path in (link, dangling):
        exporter = OtlpJsonFileSpanExporter(path)
        assert exporter.export(_spans(2, "step")) is SpanExportResult.FAILURE
        exporter.shutdown()
    assert victim.read_text() == "secret\n"
    assert not (tmp_path / "created-by-the-link").exists()
    assert link.is_symlink() and dangling.is_symlink()
    assert "is a symbolic link" in caplog.text


def test_a_planted_symlink_counts_the_spans_as_dropped(configure, tmp_path: Path) -> None:
    output_dir = tmp_path / "traces"
    output_dir.mkdir()
    (output_dir / "traces-r0.jsonl").symlink_to(tmp_path / "elsewhere")
    telemetry = configure(exporter="file", output_dir=str(output_dir), metrics=False)
    with otel_training.TrainerProcess().step(global_step=1):
        pass
    result = telemetry.force_flush(5)
    assert (result.exported, result.dropped) == (0, 1)
    assert not (tmp_path / "elsewhere").exists()


@pytest.fixture
def usual_umask() -> Iterator[None]:
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_files_and_the_directory_are_owner_only(configure, tmp_path: Path, usual_umask: None) -> None:
    output_dir = tmp_path / "traces"
    log = tmp_path / "dlrover" / "events.log"
    telemetry = configure(exporter="file", output_dir=str(output_dir), dlrover_log=str(log))
    with otel_training.TrainerProcess().step(global_step=1):
        pass
    telemetry.shutdown(timeout_s=5)
    assert _mode(output_dir) == 0o700
    assert _mode(output_dir / "traces-r0.jsonl") == 0o600
    assert _mode(output_dir / "metrics-r0.jsonl") == 0o600
    assert _mode(log.parent) == 0o700
    assert _mode(log) == 0o600


def test_an_existing_file_keeps_the_mode_it_was_given(tmp_path: Path, usual_umask: None) -> None:
    """Widening on purpose (docs/security.md): create the file, or the directory, first."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o750)
    path = shared / "traces-r0.jsonl"
    path.touch(mode=0o640)
    exporter = OtlpJsonFileSpanExporter(path)
    assert exporter.export(_spans(1, "step")) is SpanExportResult.SUCCESS
    exporter.shutdown()
    assert (_mode(shared), _mode(path)) == (0o750, 0o640)


def test_a_wider_mode_can_be_asked_for_when_building_the_exporter(tmp_path: Path, usual_umask: None) -> None:
    path = tmp_path / "group" / "traces-r0.jsonl"
    exporter = OtlpJsonFileSpanExporter(path, file_mode=0o640, dir_mode=0o750)
    assert exporter.export(_spans(1, "step")) is SpanExportResult.SUCCESS
    exporter.shutdown()
    assert (_mode(path.parent), _mode(path)) == (0o750, 0o640)


def test_logging_is_quiet_about_a_healthy_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="otel_training")
    exporter = OtlpJsonFileSpanExporter(tmp_path / "traces-r0.jsonl")
    for _ in range(3):
        assert exporter.export(_spans(2, "step")) is SpanExportResult.SUCCESS
    exporter.shutdown()
    assert caplog.text == ""
