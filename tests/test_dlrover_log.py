"""The DLRover event log: BEGIN written at span start, END at span end, bounded queue."""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider

import otel_training
from otel_training import DLRoverLogProcessor

LINE = re.compile(r"^\[(?P<time>[^\]]+)\] \[(?P<id>[0-9a-f]{16})\] \[(?P<target>[^\]]*)\] "
                  r"\[(?P<name>[^\]]+)\] \[(?P<type>BEGIN|END|INSTANT)\] (?P<content>\{.*\})$")


def test_begin_is_written_while_the_step_is_still_open(configure, tmp_path: Path) -> None:
    log = tmp_path / "events.log"
    telemetry = configure(exporter="none", dlrover_log=str(log))
    trainer = otel_training.TrainerProcess()
    with trainer.step(global_step=12, batch_size=4):
        assert telemetry.tracer_provider.force_flush(5000)
        lines = log.read_text().splitlines()
        assert len(lines) == 1, "BEGIN must be in the log before the step ends (DLRover's master tails it)"
        begin = LINE.match(lines[0])
        assert begin and begin["type"] == "BEGIN" and begin["name"] == "#step" and begin["target"] == "TrainerProcess"
        assert json.loads(begin["content"]) == {"training.step": 12, "training.batch.size": 4}
        trainer.log(loss=0.5)
    telemetry.shutdown(timeout_s=2)
    lines = [LINE.match(line) for line in log.read_text().splitlines()]
    assert all(lines)
    assert [line["type"] for line in lines] == ["BEGIN", "INSTANT", "END"]
    assert lines[0]["id"] == lines[1]["id"] == lines[2]["id"]
    end = json.loads(lines[2]["content"])
    assert end["status"] == "OK" and end["duration_s"] >= 0 and end["training.step"] == 12
    assert json.loads(lines[1]["content"])["training.loss"] == 0.5


def test_json_lines_variant(configure, tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    telemetry = configure(exporter="none", dlrover_log=str(log), dlrover_log_format="json")
    with otel_training.AgentProcess().rendezvous(round=1):
        pass
    telemetry.shutdown(timeout_s=2)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["target"], r["name"], r["event_type"]) for r in records] == [
        ("DLRoverAgentEvent", "#rendezvous", "BEGIN"), ("DLRoverAgentEvent", "#rendezvous", "END")]
    assert records[0]["content"] == {"elastic.rendezvous.round": 1}


def test_a_blocked_writer_drops_and_counts_instead_of_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "blocked.log"
    os.mkfifo(fifo)  # opening it for writing blocks until a reader comes: a stuck disk
    processor = DLRoverLogProcessor(fifo, max_queue_size=8)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("test")
    for _ in range(100):
        with tracer.start_as_current_span("training.step"):
            pass
    # 200 lines offered (BEGIN + END each); the writer holds one item, the queue 8.
    assert processor.dropped >= 200 - 8 - 1
    assert processor.written == 0
    reader = threading.Thread(target=lambda: fifo.open().read(), daemon=True)
    reader.start()  # unblock the writer so it can finish
    processor.shutdown()


FORGED = '\n[2026-11-23T10:00:00.000+00:00] [00000000000000aa] [TrainerProcess] [#step] [END] {"status": "OK"}\n'


def test_names_cannot_forge_lines_in_the_text_format(configure, tmp_path: Path) -> None:
    log = tmp_path / "events.log"
    telemetry = configure(exporter="none", dlrover_log=str(log))
    process = otel_training.Process("Trainer" + FORGED + "\x1b]0;owned\x07")
    with process.duration("stage] [END" + FORGED):
        process.instant("tick\r" + FORGED)
    telemetry.shutdown(timeout_s=2)
    lines = log.read_text().splitlines()
    assert len(lines) == 3, lines
    matches = [LINE.match(line) for line in lines]
    assert all(matches), lines
    assert [match["type"] for match in matches] == ["BEGIN", "INSTANT", "END"]
    assert {match["id"] for match in matches} != {"00000000000000aa"}
    assert not any(character in log.read_text() for character in "\x1b\x07\r")
    assert "\\n" in matches[0]["name"] and "\\n" in matches[0]["target"]


def test_names_cannot_forge_lines_in_the_json_format(configure, tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    telemetry = configure(exporter="none", dlrover_log=str(log), dlrover_log_format="json")
    process = otel_training.Process("Trainer" + FORGED)
    with process.duration("stage" + FORGED):
        process.instant("tick" + FORGED)
    telemetry.shutdown(timeout_s=2)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [record["event_type"] for record in records] == ["BEGIN", "INSTANT", "END"]
    assert records[0]["name"] == "stage" + FORGED and records[0]["target"] == "Trainer" + FORGED


def test_a_symlink_at_the_log_is_refused_and_its_lines_counted_as_dropped(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    victim = tmp_path / "victim"
    victim.write_text("secret\n")
    log = tmp_path / "events.log"
    log.symlink_to(victim)
    processor = DLRoverLogProcessor(log)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    with provider.get_tracer("test").start_as_current_span("training.step"):
        pass
    assert processor.force_flush(5000)
    assert (processor.written, processor.dropped) == (0, 2)  # BEGIN and END
    processor.shutdown()
    assert victim.read_text() == "secret\n"
    assert log.is_symlink()
    assert "symbolic link" in caplog.text
