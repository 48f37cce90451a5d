"""The collective tracking routes (issue 27): torch's ProcessGroup hooks, or its per-group sequence number.

The real-gloo cases run on both routes in test_hang_gloo.py; here the sequence route's bookkeeping on a
stand-in group whose counter the test moves, and the choice of route on a torch with or without hooks.
"""

from __future__ import annotations

import json

import pytest
from otlp_json import read_spans
from requirements import require

require("torch")

from otel_training import semconv as sc  # noqa: E402
from otel_training.integrations.torch import collective_routes  # noqa: E402
from otel_training.integrations.torch.collectives import CollectiveTracker  # noqa: E402
from otel_training.integrations.torch.flight_recorder import name_ops  # noqa: E402


class Group:
    """What the sequence route reads of a ProcessGroup: its name, backend and sequence counter."""

    group_name = "0"

    def __init__(self) -> None:
        self.seq = 5

    def name(self) -> str:
        return "gloo"

    def _get_sequence_number_for_group(self) -> int:
        return self.seq


def test_auto_takes_the_hooks_where_torch_has_them_and_the_sequence_route_where_it_does_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    assert collective_routes.route("sequence")[0] == "sequence"
    assert collective_routes.route("off")[0] == "off"
    if hasattr(dist.ProcessGroup, "register_pre_hook"):
        assert collective_routes.route("auto")[0] == "hooks"
        monkeypatch.delattr(dist.ProcessGroup, "register_pre_hook")
    taken, why = collective_routes.route("auto")
    assert taken == "sequence" and "has no ProcessGroup collective hooks" in why
    assert collective_routes.route("hooks")[0] == "sequence" or collective_routes.route("hooks")[0] == "off"
    monkeypatch.delattr(dist.ProcessGroup, "_get_sequence_number_for_group")
    taken, why = collective_routes.route("auto")
    assert taken == "off" and "neither" in why


def test_the_sequence_route_counts_entered_when_it_looks_and_completed_at_each_step_end() -> None:
    step = {"number": 3}
    tracker = CollectiveTracker(step_number=lambda: step["number"], route="sequence")
    group = Group()
    assert tracker.attach(group)
    state = tracker.groups["0"]
    assert (state.entered, state.completed, state.pending) == (5, 5, False)  # before tracking: done
    group.seq = 8  # the step's three collectives (DDP's buckets, a logging all_reduce)
    attributes = tracker.step_attributes()
    assert attributes[sc.STEP_COLLECTIVES] == 3 and attributes[sc.COLLECTIVE_SEQ] == 8
    assert attributes[sc.COLLECTIVE_COMPLETED_SEQ] == 8 and attributes[sc.COLLECTIVE_PENDING] is False
    step["number"] = 4
    group.seq = 9  # the next step entered one and is stuck in it
    stuck = tracker.alert_attributes()
    assert stuck[sc.COLLECTIVE_SEQ] == 9 and stuck[sc.COLLECTIVE_COMPLETED_SEQ] == 8
    assert stuck[sc.COLLECTIVE_PENDING] is True and stuck[sc.COLLECTIVE_STEP] == 4
    rows = {(name, tuple(sorted(attributes.items()))): value for name, value, attributes in tracker.observe()}
    assert rows[(sc.METRIC_COLLECTIVE_ENTERED, ((sc.COLLECTIVE_GROUP, "0"), (sc.COLLECTIVE_OP, "")))] == 9
    assert rows[(sc.METRIC_COLLECTIVE_COMPLETED, ((sc.COLLECTIVE_GROUP, "0"),))] == 8
    tracker.detach(group)
    assert tracker.groups == {}


def test_the_flight_recorder_names_the_sequence_routes_ops() -> None:
    tracker = CollectiveTracker(route="sequence")
    group = Group()
    tracker.attach(group)
    group.seq = 7
    state = tracker.groups["0"]
    state.refresh()
    entries = [{"collective_seq_id": 6, "profiling_name": "gloo:broadcast", "process_group": ["0", "default_pg"]},
               {"collective_seq_id": 7, "profiling_name": "nccl:all_gather", "process_group": ["0", "default_pg"]},
               {"collective_seq_id": 7, "profiling_name": "gloo:barrier", "process_group": ["1", "other"]}]
    name_ops([state], {sc.COLLECTIVE_FLIGHT_RECORDER: json.dumps(entries)})
    assert state.op_name == "allgather"
    name_ops([state], {sc.COLLECTIVE_FLIGHT_RECORDER: "not json"})  # damaged: nothing changes, nothing raises
    assert state.op_name == "allgather"


def test_the_sequence_routes_gauge_keeps_one_op_label_per_collective(monkeypatch: pytest.MonkeyPatch) -> None:
    """A label that changed within one collective (unnamed, then named) would leave two series at the group's
    highest sequence number, which the hang rules read as two ranks in different ops: a mismatch named on a rank
    that only waits (seen once in CI, the sleeper case on the sequence route). So the gauge waits for the flight
    recorder's name a moment, and then keeps whatever label it first carried for that collective."""
    from otel_training.integrations.torch import flight_recorder

    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "200")
    recorded: list[dict] = []  # the stand-in flight recorder's entries
    monkeypatch.setattr(flight_recorder, "flight_recorder",
                        lambda backends, **options: {sc.COLLECTIVE_FLIGHT_RECORDER: json.dumps(recorded)})

    def entry(seq: int, op: str) -> dict:
        return {"collective_seq_id": seq, "profiling_name": f"gloo:{op}", "process_group": ["0", "default_pg"]}

    tracker = CollectiveTracker(route="sequence")
    group = Group()
    assert tracker.attach(group)

    def entered() -> list[tuple[str, float]]:
        return [(attributes[sc.COLLECTIVE_OP], value) for name, value, attributes in tracker.observe()
                if name == sc.METRIC_COLLECTIVE_ENTERED]

    group.seq = 7
    assert entered() == []  # not named yet: the group's rows wait
    recorded.append(entry(7, "all_gather"))
    assert entered() == [("allgather", 7)]
    group.seq = 8  # the next collective, which the recorder has not got
    assert entered() == []
    tracker.groups["0"].entered_ns -= flight_recorder.NAME_HOLD_NS  # the hold is over
    assert entered() == [("", 8)]
    recorded.append(entry(8, "all_reduce"))
    assert entered() == [("", 8)]  # named too late: this collective keeps the label it was seen with
    assert tracker.groups["0"].op_name == "allreduce"  # a stuck alert still names it
    group.seq = 9
    recorded.append(entry(9, "broadcast"))
    assert entered() == [("broadcast", 9)]
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE")
    group.seq = 10  # the recorder off: nothing to wait for
    assert entered() == [("", 10)]


def test_a_group_the_sequence_route_cannot_read_is_not_tracked() -> None:
    tracker = CollectiveTracker(route="sequence")

    class Odd:
        group_name = "x"

    assert not tracker.attach(Odd()) and tracker.groups == {}
    assert not tracker.attach(None)


def test_the_option_is_checked_before_training() -> None:
    from otel_training.config.options import ConfigError, resolve

    with pytest.raises(ConfigError, match="collective_tracking"):
        resolve({"collective_tracking": "sometimes"})




def test_a_way_out_reads_the_collectives_as_they_stand_and_vouches_for_none() -> None:
    """``interrupted_attributes``: what was entered, not marked completed (a step's end would), no recorder dump."""
    tracker = CollectiveTracker(step_number=lambda: 4, route="sequence")
    group = Group()
    tracker.attach(group)
    group.seq = 6  # the step entered its all-reduce, and a peer died in it
    attributes = tracker.interrupted_attributes()
    assert (attributes[sc.COLLECTIVE_SEQ], attributes[sc.COLLECTIVE_COMPLETED_SEQ]) == (6, 5)
    assert attributes[sc.COLLECTIVE_PENDING] is True and attributes[sc.COLLECTIVE_STEP] == 4
    assert sc.COLLECTIVE_FLIGHT_RECORDER not in attributes and tracker.groups["0"].completed == 5
    assert CollectiveTracker(route="sequence").interrupted_attributes() == {}  # no group yet: nothing to say


def test_a_step_the_way_out_ends_carries_the_collective_it_failed_in(configure, caplog) -> None:
    """A peer gone mid-collective: the rank's step raises and the way out (the excepthook's ``end_open_spans``)
    ends it as ERROR. The step carries the collective it was in, entered and not completed: without it the rank's
    last view would be the step before's, behind the ranks whose stuck alerts named that collective, and the
    verdict would name the rank that did enter it as the culprit."""
    import torch

    from otel_training.integrations.torch import TorchInstrumentor
    from otel_training.lifecycle.hooks import end_open_spans

    telemetry = configure()
    instrumentor = TorchInstrumentor()
    instrumentor.instrument()
    try:
        tracker = TorchInstrumentor.tracker
        assert tracker is not None
        collectives = tracker.collectives = CollectiveTracker(step_number=lambda: tracker.number, route="sequence")
        group = Group()
        assert collectives.attach(group)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
            group.seq += 2  # DDP's all-reduce and a logging all_gather
            optimizer.step()
        model(torch.randn(2, 4)).sum().backward()
        group.seq += 1  # step 3's all-reduce, where the peer died: the backward raises
        end_open_spans(telemetry, sc.EVENT_EXCEPTION, {sc.EXCEPTION_TYPE: "RuntimeError"},
                       "RuntimeError: Connection reset by peer")
    finally:
        instrumentor.uninstrument()
    assert telemetry.force_flush(5).completed
    steps = {s["attributes"][sc.STEP]: s for s in read_spans(telemetry.trace_path) if s["name"] == sc.SPAN_STEP}
    assert sorted(steps) == [0, 1, 2, 3]
    ended, failed = steps[2]["attributes"], steps[3]
    assert (ended[sc.COLLECTIVE_SEQ], ended[sc.COLLECTIVE_COMPLETED_SEQ], ended[sc.COLLECTIVE_PENDING]) == (11, 11, False)
    assert failed["status"]["code"] == 2 and [e["name"] for e in failed["events"]] == [sc.EVENT_EXCEPTION]
    attributes = failed["attributes"]
    assert (attributes[sc.COLLECTIVE_SEQ], attributes[sc.COLLECTIVE_COMPLETED_SEQ]) == (12, 11)
    assert attributes[sc.COLLECTIVE_PENDING] is True and attributes[sc.COLLECTIVE_STEP] == 3
    assert "internal error" not in caplog.text
