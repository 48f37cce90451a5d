"""KungFu's monitor functions as step, epoch and train spans, watched by the stuck detector."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator

import pytest
from otlp_json import read_spans
from waiting import wait_until

from otel_training import semconv as sc
from otel_training.compat import kungfu


@pytest.fixture(autouse=True)
def fresh_monitor() -> Iterator[None]:
    kungfu._reset()
    yield
    kungfu._reset()


def test_monitor_calls_become_nested_step_epoch_and_train_spans(configure: Callable[..., object]) -> None:
    telemetry = configure(exporter="file")
    for _epoch in range(2):
        for _batch in range(3):
            kungfu.monitor_batch_begin()
            kungfu.monitor_batch_end()
        kungfu.monitor_epoch_end()
    kungfu.monitor_train_end()
    kungfu.monitor_batch_end()  # out of order: ignored, not raised
    telemetry.shutdown(timeout_s=2)
    spans = read_spans(telemetry.trace_path)
    by_id = {span["span_id"]: span for span in spans}
    steps = [span for span in spans if span["name"] == sc.SPAN_STEP]
    epochs = [span for span in spans if span["name"] == sc.SPAN_EPOCH]
    trains = [span for span in spans if span["name"] == sc.SPAN_TRAIN]
    assert sorted(step["attributes"][sc.STEP] for step in steps) == list(range(6))
    assert sorted(epoch["attributes"][sc.EPOCH] for epoch in epochs) == [0, 1]
    assert len(trains) == 1
    for step in steps:
        epoch = by_id[step["parent_id"]]
        assert epoch["attributes"][sc.EPOCH] == step["attributes"][sc.STEP] // 3
        assert by_id[epoch["parent_id"]]["name"] == sc.SPAN_TRAIN


def test_a_batch_without_end_is_reported_stuck(configure: Callable[..., object]) -> None:
    telemetry = configure(exporter="file", stuck_threshold_s=0.2, offload=False)
    events = []
    telemetry.stuck.add_callback(events.append)  # type: ignore[union-attr]
    kungfu.monitor_batch_begin()
    kungfu.monitor_batch_end()
    kungfu.monitor_batch_begin()  # KungFu would declare this rank stuck after 10 s, polling once a second
    assert wait_until(lambda: events, timeout_s=5)
    assert events[0].attributes[sc.STEP] == 1 and events[0].attributes[sc.EPOCH] == 0
    kungfu.monitor_train_end()


def test_kungfu_has_one_import_path() -> None:
    assert kungfu.__name__ == "otel_training.compat.kungfu"
    assert importlib.util.find_spec("otel_training.integrations.compat") is None
