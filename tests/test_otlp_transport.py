"""The same span tree through OTLP/gRPC and OTLP/HTTP to receivers on loopback."""

from __future__ import annotations

from collections import Counter

import pytest
from otlp_receiver import grpc_receiver, http_receiver

import otel_training
from otel_training import semconv as sc


def _emit_tree() -> None:
    trainer = otel_training.TrainerProcess()
    with trainer.train():
        with trainer.epoch(epoch=0):
            for step in range(2):
                with trainer.step(global_step=step, batch_size=8):
                    with trainer.substep(substep=0):
                        pass


@pytest.mark.parametrize(("protocol", "receiver"), [("grpc", grpc_receiver), ("http/protobuf", http_receiver)])
def test_span_tree_over_otlp(configure, monkeypatch: pytest.MonkeyPatch, protocol: str, receiver) -> None:
    with receiver() as (endpoint, received):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-team=vision")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "llm-pretrain")
        telemetry = configure()
        assert telemetry.exporter_name == "otlp"
        _emit_tree()
        flushed = telemetry.force_flush(timeout_s=10)
        assert flushed.completed and flushed.exported == 6
        spans = received.wait_for(6)
    assert Counter(span.name for _, span in spans) == {
        "training.train": 1, "training.epoch": 1, "training.step": 2, "training.substep": 2}
    by_id = {span.span_id: span for _, span in spans}
    parents = {span.name: by_id[span.parent_span_id].name for _, span in spans if span.parent_span_id}
    assert parents == {"training.epoch": "training.train", "training.step": "training.epoch",
                       "training.substep": "training.step"}
    resource, step = next((r, s) for r, s in spans if s.name == "training.step")
    assert resource["service.name"].string_value == "llm-pretrain"
    assert resource[sc.TRAINING_RANK].int_value == 0
    attributes = {kv.key: kv.value for kv in step.attributes}
    assert attributes[sc.BATCH_SIZE].int_value == 8
    assert attributes[sc.EVENT_NAME].string_value == "#step"
    assert all(headers.get("x-team") == "vision" for headers in received.headers)
