"""The events API against the real SDK, read back from the OTLP JSON file."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping

import pytest
from otlp_json import read_spans

import otel_training
from otel_training import semconv as sc

STATUS_ERROR = 2
STATUS_OK = 1


def _spans(telemetry) -> list[dict]:
    telemetry.shutdown(timeout_s=5)
    return read_spans(telemetry.trace_path)


def test_span_tree_and_attributes_from_the_file(configure) -> None:
    telemetry = configure(exporter="file", job_id="job-1")
    trainer = otel_training.TrainerProcess()
    with trainer.train():
        for epoch in range(2):
            with trainer.epoch(epoch=epoch):
                for step in range(3):
                    with trainer.step(global_step=epoch * 3 + step, batch_size=32, tokens=4096):
                        for substep in range(2):
                            with trainer.substep(substep=substep):
                                pass
    spans = _spans(telemetry)
    by_id = {span["span_id"]: span for span in spans}
    counts = Counter(span["name"] for span in spans)
    assert counts == {"training.train": 1, "training.epoch": 2, "training.step": 6, "training.substep": 12}
    for span in spans:
        parent = by_id.get(span["parent_id"])
        expected_parent = {"training.train": None, "training.epoch": "training.train",
                           "training.step": "training.epoch", "training.substep": "training.step"}[span["name"]]
        assert (parent["name"] if parent else None) == expected_parent
        assert len(span["span_id"]) == 16 and len(span["trace_id"]) == 32  # hex, not base64
        assert span["attributes"][sc.EVENT_TARGET] == "TrainerProcess"
        assert span["resource"][sc.TRAINING_JOB_ID] == "job-1"
        assert span["resource"][sc.TRAINING_ROLE] == "trainer"
    assert len({span["trace_id"] for span in spans}) == 1
    steps = sorted((s for s in spans if s["name"] == "training.step"), key=lambda s: s["attributes"][sc.STEP])
    assert [s["attributes"][sc.STEP] for s in steps] == list(range(6))
    assert steps[0]["attributes"][sc.BATCH_SIZE] == 32
    assert steps[0]["attributes"][sc.TOKENS] == 4096
    assert steps[0]["attributes"][sc.EVENT_NAME] == "#step"
    epochs = sorted((s for s in spans if s["name"] == "training.epoch"), key=lambda s: s["attributes"][sc.EPOCH])
    assert [s["attributes"][sc.EPOCH] for s in epochs] == [0, 1]


def test_exception_in_a_duration_is_recorded_and_reraised(configure) -> None:
    telemetry = configure(exporter="file")
    trainer = otel_training.TrainerProcess()
    with pytest.raises(ZeroDivisionError):
        with trainer.step(global_step=7):
            1 / 0  # noqa: B018
    (span,) = _spans(telemetry)
    assert span["status"]["code"] == STATUS_ERROR
    assert "ZeroDivisionError" in span["status"]["message"]
    (event,) = span["events"]
    assert event["name"] == "exception"
    assert event["attributes"]["exception.type"] == "ZeroDivisionError"
    assert "1 / 0" in event["attributes"]["exception.stacktrace"]


def test_manual_begin_end_success_fail_stage_and_extra_args(configure) -> None:
    telemetry = configure(exporter="file")
    trainer = otel_training.TrainerProcess()
    save = trainer.save(path="/ckpt/100", step=100).begin()
    with save.stage("serialize"):
        pass
    save.extra_args(size=1234)
    save.success(persisted=True)
    failed = trainer.load_ckpt(path="/ckpt/missing")
    failed.begin()
    failed.fail("no such checkpoint")
    spans = {span["name"]: span for span in _spans(telemetry)}
    saved = spans["training.save_checkpoint"]
    assert saved["status"]["code"] == STATUS_OK
    assert saved["attributes"][sc.CHECKPOINT_PATH] == "/ckpt/100"
    assert saved["attributes"][sc.CHECKPOINT_STEP] == 100
    assert saved["attributes"][sc.CHECKPOINT_BYTES] == 1234
    assert saved["attributes"]["training.content.persisted"] is True
    stage = spans["training.save_checkpoint.serialize"]
    assert stage["parent_id"] == saved["span_id"]
    assert stage["attributes"][sc.EVENT_NAME] == "serialize"
    loaded = spans["training.load_checkpoint"]
    assert loaded["status"] == {"code": STATUS_ERROR, "message": "no such checkpoint"}


def test_duration_as_decorator_sync_and_async(configure) -> None:
    telemetry = configure(exporter="file")
    process = otel_training.Process("DataPipeline")

    @process.duration("pipeline.fetch", {"shard": 3})
    def fetch(value: int) -> int:
        return value * 2

    @process.duration("pipeline.afetch")
    async def afetch(value: int) -> int:
        await asyncio.sleep(0)
        return value + 1

    assert fetch(4) == 8 and fetch(5) == 10
    assert asyncio.run(afetch(1)) == 2
    spans = _spans(telemetry)
    assert Counter(span["name"] for span in spans) == {"pipeline.fetch": 2, "pipeline.afetch": 1}
    fetched = [span for span in spans if span["name"] == "pipeline.fetch"]
    assert {span["span_id"] for span in fetched}.__len__() == 2  # a fresh span per call
    assert fetched[0]["attributes"]["training.content.shard"] == 3
    assert fetched[0]["attributes"][sc.EVENT_TARGET] == "DataPipeline"


def test_instants_go_to_the_current_span_or_the_process_span(configure) -> None:
    telemetry = configure(exporter="file")
    trainer = otel_training.TrainerProcess()
    trainer.start(config={"lr": 0.1, "layers": [1, 2]})
    with trainer.step(global_step=1):
        trainer.log(loss=0.25, lr=0.001, grad_norm=1.5)
        trainer.error("loss spike", factor=10)
    spans = {span["name"]: span for span in _spans(telemetry)}
    (start,) = spans["training.process"]["events"]
    assert start["name"] == "#start"
    assert start["attributes"]["training.content.config.lr"] == 0.1
    assert start["attributes"]["training.content.config.layers"] == [1, 2]
    log, error = spans["training.step"]["events"]
    assert log["attributes"][sc.LOSS] == 0.25
    assert log["attributes"][sc.LEARNING_RATE] == 0.001
    assert log["attributes"]["training.metric.grad_norm"] == 1.5
    assert error["name"] == sc.EVENT_LOG_ERROR
    assert error["attributes"][sc.LOG_MESSAGE] == "loss spike"


def test_agent_and_master_events(configure) -> None:
    telemetry = configure(exporter="file", role="agent")
    agent, master = otel_training.AgentProcess(), otel_training.MasterProcess()
    with agent.rendezvous(round=2, node_rank=1):
        pass
    with master.pod_create(pod_name="worker-3"):
        pass
    spans = {span["name"]: span for span in _spans(telemetry)}
    rendezvous = spans["elastic.rendezvous"]
    assert rendezvous["attributes"][sc.ELASTIC_RENDEZVOUS_ROUND] == 2
    assert rendezvous["attributes"][sc.ELASTIC_NODE_RANK] == 1
    assert rendezvous["attributes"][sc.EVENT_TARGET] == "DLRoverAgentEvent"
    assert rendezvous["resource"][sc.TRAINING_ROLE] == "agent"
    assert spans["elastic.pod_create"]["attributes"][sc.K8S_POD_NAME] == "worker-3"
    assert spans["elastic.pod_create"]["attributes"][sc.EVENT_TARGET] == "DLRoverMasterEvent"


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no")

    __repr__ = __str__


class _FakeCudaTensor:
    """Looks like a torch tensor on an accelerator: reading it would sync the device."""

    dtype = "float32"
    shape = (1,)

    class device:
        type = "cuda"

    def item(self) -> float:
        raise AssertionError("item() on an accelerator tensor forces a device sync")


class _FakeCpuScalar:
    dtype = "float64"
    size = 1

    def item(self) -> float:
        return 0.5


def test_odd_attribute_values_never_raise(configure) -> None:
    telemetry = configure(exporter="file")
    trainer = otel_training.TrainerProcess()
    odd = {
        "unprintable": _Unprintable(),
        "mixed": [1, "two", 3.0],
        "nested": {"a": {"b": {"c": {"d": {"e": {"f": 1}}}}}},
        "none": None,
        "cuda": _FakeCudaTensor(),
        "cpu": _FakeCpuScalar(),
        "long": "x" * 10_000,
        "set": {1, 2},
        "bytes": b"\x00\x01",
        42: "int key",
    }
    with trainer.step(global_step=1, **{k: v for k, v in odd.items() if isinstance(k, str)}) as step:
        step.extra_args(more=object())
        trainer.instant("#odd", odd)
    (span,) = [s for s in _spans(telemetry) if s["name"] == "training.step"]
    attributes = span["attributes"]
    assert attributes["training.content.mixed"] == ["1", "two", "3.0"]
    deepest = [key for key in attributes if key.startswith("training.content.nested.")]
    assert len(deepest) == 1 and attributes[deepest[0]].startswith("{")  # flattening is depth-bounded
    assert "training.content.none" not in attributes
    assert attributes["training.content.cuda"].startswith("<_FakeCudaTensor shape=(1,)")
    assert attributes["training.content.cpu"] == 0.5
    assert len(attributes["training.content.long"]) <= 1024
    assert attributes["training.content.unprintable"] == "<_Unprintable>"
    assert span["events"][0]["attributes"]["training.content.42"] == "int key"


def test_lineage_is_stamped_on_every_span(configure) -> None:
    telemetry = configure(exporter="file", pipeline_id="pipe-1")
    trainer = otel_training.TrainerProcess()
    otel_training.set_lineage(trigger_id="trigger-7", training_id="t-7-0")
    with trainer.train():
        with trainer.step(global_step=0):
            pass
    otel_training.set_lineage(trigger_id=None)
    with trainer.evaluate():
        pass
    spans = {span["name"]: span for span in _spans(telemetry)}
    for name in ("training.train", "training.step"):
        assert spans[name]["attributes"][sc.TRAINING_PIPELINE_ID] == "pipe-1"
        assert spans[name]["attributes"][sc.TRAINING_TRIGGER_ID] == "trigger-7"
        assert spans[name]["attributes"][sc.TRAINING_TRIGGER_TRAINING_ID] == "t-7-0"
    assert sc.TRAINING_TRIGGER_ID not in spans["training.evaluate"]["attributes"]
    assert spans["training.evaluate"]["attributes"][sc.TRAINING_PIPELINE_ID] == "pipe-1"


def test_traces_are_bounded_and_linked(configure) -> None:
    telemetry = configure(exporter="file", trace_max_spans=10)
    trainer = otel_training.TrainerProcess()
    with trainer.train():
        with trainer.epoch(epoch=0):
            for step in range(30):
                with trainer.step(global_step=step):
                    pass
    spans = _spans(telemetry)
    per_trace = Counter(span["trace_id"] for span in spans)
    assert len(per_trace) >= 3
    assert max(per_trace.values()) <= 11  # the budget, plus the continuation span itself
    steps = [span for span in spans if span["name"] == "training.step"]
    assert sorted(s["attributes"][sc.STEP] for s in steps) == list(range(30))
    by_id = {span["span_id"]: span for span in spans}
    original_epoch = next(s for s in spans if s["name"] == "training.epoch" and sc.TRACE_SEGMENT not in s["attributes"])
    segments = sorted((s for s in spans if s["name"] == "training.epoch" and sc.TRACE_SEGMENT in s["attributes"]),
                      key=lambda s: s["attributes"][sc.TRACE_SEGMENT])
    assert [s["attributes"][sc.TRACE_SEGMENT] for s in segments] == list(range(1, len(segments) + 1))
    for index, segment in enumerate(segments):
        assert segment["parent_id"] == ""  # a new trace
        links = {link["attributes"][sc.LINK_TYPE]: link for link in segment["links"]}
        assert links["continues"]["span_id"] == original_epoch["span_id"]
        if index:
            assert links["previous"]["span_id"] == segments[index - 1]["span_id"]
    for step in steps:  # every step's parent is the epoch or one of its segments, in the step's own trace
        parent = by_id[step["parent_id"]]
        assert parent["name"] == "training.epoch" and parent["trace_id"] == step["trace_id"]


def test_console_exporter_prints_readable_lines(configure, capsys: pytest.CaptureFixture[str]) -> None:
    telemetry = configure(exporter="console")
    with otel_training.TrainerProcess().step(global_step=5):
        pass
    telemetry.shutdown(timeout_s=2)
    line = capsys.readouterr().err.strip().splitlines()[0]
    assert " training.step " in line and "training.step=5" in line and " ms OK " in line


def test_a_throwing_exporter_never_breaks_the_loop(configure, monkeypatch: pytest.MonkeyPatch) -> None:
    from otel_training.exporters.otlp_json import OtlpJsonFileSpanExporter

    def broken_export(self, spans):
        raise OSError("disk on fire")

    monkeypatch.setattr(OtlpJsonFileSpanExporter, "export", broken_export)
    telemetry = configure(exporter="file", offload=False)
    trainer = otel_training.TrainerProcess()
    for step in range(50):
        with trainer.step(global_step=step):
            trainer.log(loss=1.0)
    result = telemetry.shutdown(timeout_s=2)
    assert result.exported == 0
    assert result.dropped == 50  # every span accounted for as lost


class _BrokenProcessor:
    """A span processor whose every hook raises, as a buggy plugin would."""

    def __init__(self) -> None:
        self.calls = 0

    def on_start(self, span, parent_context=None):
        self.calls += 1
        raise RuntimeError("processor bug")

    def on_end(self, span):
        self.calls += 1
        raise RuntimeError("processor bug")

    def _on_ending(self, span):
        raise RuntimeError("processor bug")

    def shutdown(self):
        raise RuntimeError("processor bug")

    def force_flush(self, timeout_millis=30000):
        raise RuntimeError("processor bug")


def test_a_raising_span_processor_never_breaks_the_loop(configure) -> None:
    telemetry = configure(exporter="file", offload=False)
    broken = _BrokenProcessor()
    telemetry.add_span_processor(broken)
    trainer = otel_training.TrainerProcess()
    completed = 0
    for epoch in range(2):
        with trainer.epoch(epoch=epoch):
            for step in range(10):
                with trainer.step(global_step=step) as span:
                    span.extra_args(loss=0.1)
                    trainer.log(loss=1.0)
                completed += 1
    assert completed == 20 and broken.calls >= 20
    result = telemetry.shutdown(timeout_s=2)  # a raising processor does not stall shutdown either
    assert result.elapsed_s < 2.5


class _ArrayLike:
    """Looks like a numpy array: its truth value is ambiguous, so ``bool()`` raises."""

    dtype = "float32"
    shape = (3,)
    size = 3

    def __bool__(self) -> bool:
        raise ValueError("The truth value of an array with more than one element is ambiguous")

    def __len__(self) -> int:
        return 3

    def item(self) -> float:
        raise ValueError("can only convert an array of size 1 to a Python scalar")


class _UnsizedMapping(Mapping):
    """A Mapping that can be read but whose ``__len__`` (hence ``bool()``) raises."""

    def __init__(self, data: dict) -> None:
        self._data = data

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self) -> int:
        raise RuntimeError("no length")


class _BrokenMapping(_UnsizedMapping):
    def __iter__(self):
        raise RuntimeError("no iteration")

    def items(self):
        raise RuntimeError("no items")


class _FalsyRaising(dict):
    def __bool__(self) -> bool:
        raise RuntimeError("no truth value")


def test_content_that_raises_never_reaches_the_caller(configure) -> None:
    from otel_training.events.duration import Duration

    telemetry = configure(exporter="file")
    process = otel_training.Process("Odd")
    contents = [_ArrayLike(), _UnsizedMapping({"a": 1}), _BrokenMapping({}), _FalsyRaising(a=1)]
    for content in contents:
        process.instant("#odd", content)
        with process.duration("odd.duration", content):
            pass
        process.custom_duration(Duration, "odd.custom", content).begin().end()
        with process.duration("odd.array_value", {"values": _ArrayLike()}):
            pass
    process.info(_Unprintable())
    process.error(_Unprintable(), detail=_ArrayLike())
    spans = _spans(telemetry)
    assert Counter(span["name"] for span in spans) == {"odd.duration": 4, "odd.custom": 4, "odd.array_value": 4,
                                                       "training.process": 1}
    readable = [span for span in spans if span["name"] == "odd.duration"][1::2]  # the two readable mappings
    assert [span["attributes"].get("training.content.a") for span in readable] == [1, 1]
    (process_span,) = [span for span in spans if span["name"] == "training.process"]
    assert len(process_span["events"]) == 6  # every instant, info and error recorded


def test_a_huge_instant_is_bounded_and_logged_once(configure, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from otel_training.events.attributes import MAX_KEYS

    telemetry = configure(exporter="file")
    trainer = otel_training.TrainerProcess()
    read = []

    class Counting(dict):
        def items(self):
            for item in super().items():
                read.append(item)
                yield item

    huge = Counting((f"k{index}", index) for index in range(200_000))
    with caplog.at_level(logging.WARNING):
        with trainer.step(global_step=1):
            trainer.instant("#huge", huge)
            trainer.instant("#huge", huge)
    assert len(read) <= 2 * (MAX_KEYS + 1)  # the rest is never even looked at
    (step,) = [span for span in _spans(telemetry) if span["name"] == "training.step"]
    assert all(len(event["attributes"]) <= 128 for event in step["events"])  # under the SDK's limit: no drops
    assert len(step["events"]) == 2 and len(step["events"][0]["attributes"]) >= MAX_KEYS
    warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert len(warnings) <= 1 and all(f"more than {MAX_KEYS} keys" in message for message in warnings), warnings[:3]


class _FakeUint64:
    dtype = "uint64"
    size = 1

    def item(self) -> int:
        return 2**64 - 1


def test_big_integers_and_lone_surrogates_are_kept_as_text(configure, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    telemetry = configure(exporter="file")
    trainer = otel_training.TrainerProcess()
    with caplog.at_level(logging.WARNING):
        with trainer.step(global_step=1, huge=2**64, negative=-(2**63) - 1, uint64=_FakeUint64(),
                          mixed=[1, 2**64], where="/data/caf\udce9", int64=2**63 - 1) as step:
            step.extra_args(**{"k\udce9y": "value"})
            trainer.instant("#caf\udce9", {"name": "x\ud800y"})
            trainer.info("message \udce9")
        telemetry.force_flush(timeout_s=5)
    (span,) = [span for span in _spans(telemetry) if span["name"] == "training.step"]
    attributes = span["attributes"]
    assert attributes["training.content.huge"] == str(2**64)
    assert attributes["training.content.negative"] == str(-(2**63) - 1)
    assert attributes["training.content.uint64"] == str(2**64 - 1)
    assert attributes["training.content.mixed"] == ["1", str(2**64)]
    assert attributes["training.content.int64"] == 2**63 - 1
    assert attributes["training.content.where"] == "/data/caf\\udce9"
    assert attributes["training.content.k\\udce9y"] == "value"
    instant, info = span["events"]
    assert instant["name"] == "#caf\\udce9" and instant["attributes"]["training.content.name"] == "x\\ud800y"
    assert info["attributes"][sc.LOG_MESSAGE] == "message \\udce9"
    assert not [record for record in caplog.records if "encode" in record.getMessage()]


def test_an_error_whose_str_raises_still_fails_and_ends_the_span(configure) -> None:
    # Issue 13 item 3: fail(obj) and an exception leaving a with block, where str() raises.
    from otlp_json import read_spans

    import otel_training

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no str for you")

    class Weird:
        def __str__(self) -> str:
            raise RuntimeError("nor for you")

    telemetry = configure()
    trainer = otel_training.TrainerProcess()
    with trainer.epoch(epoch=0):
        step = trainer.step(global_step=0).begin()
        step.fail(Weird())
        with pytest.raises(Unprintable):
            with trainer.step(global_step=1):
                raise Unprintable()
        with trainer.step(global_step=2):
            pass
    assert telemetry.force_flush(5).completed
    spans = {s["attributes"].get("training.step"): s for s in read_spans(telemetry.trace_path)
             if s["name"] == "training.step"}
    assert sorted(spans) == [0, 1, 2]
    assert spans[0]["status"]["code"] == 2 and spans[1]["status"]["code"] == 2
    assert spans[1]["attributes"]["error.type"] == "test_an_error_whose_str_raises_still_fails_and_ends_the_span.<locals>.Unprintable"
    epoch = next(s for s in read_spans(telemetry.trace_path) if s["name"] == "training.epoch")
    assert spans[2]["parent_id"] == epoch["span_id"]  # not an orphan under a step that never ended


def test_sdk_disabled_logs_no_internal_error(configure, monkeypatch, caplog) -> None:
    # Issue 13 item 17: with OTEL_SDK_DISABLED=true spans are NonRecordingSpans, which have no parent.
    import logging

    import otel_training

    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    configure()
    trainer = otel_training.TrainerProcess()
    with caplog.at_level(logging.DEBUG, logger="otel_training"):
        with trainer.epoch(epoch=0):
            with trainer.step(global_step=0):
                pass
    assert not [r for r in caplog.records if "internal error" in r.getMessage()], caplog.text


def test_uncaught_exception_attributes_are_always_encodable() -> None:
    # Issue 13 item 4: an exception message with a lone surrogate (or a __str__ that raises) must not
    # lose the spans the exception hook ends at export.
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue

    from otel_training.lifecycle.hooks import _exception_attributes

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    for error in (ValueError("bad byte \udcff in a path"), Unprintable()):
        attributes = _exception_attributes(type(error), error, None)
        for value in attributes.values():
            if isinstance(value, str):
                AnyValue(string_value=value).SerializeToString()  # raises on a lone surrogate


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # chained to pytest's hook
def test_a_thread_dying_of_an_exception_is_an_event_on_the_process_span(configure) -> None:
    """The lifecycle hooks (installed by the pipeline) record it on the API's process span,
    which the pipeline reaches through ``Telemetry.process_span`` without importing the API."""
    import threading

    telemetry = configure(exporter="file", exception_hooks=True)
    trainer = otel_training.TrainerProcess()
    trainer.start()
    assert telemetry.process_span is not None

    def die() -> None:
        raise RuntimeError("data worker lost")

    thread = threading.Thread(target=die, name="loader-3")
    thread.start()
    thread.join()
    (process,) = [span for span in _spans(telemetry) if span["name"] == "training.process"]
    (death,) = [event for event in process["events"] if event["name"] == sc.EVENT_EXCEPTION]
    assert death["attributes"]["thread.name"] == "loader-3"
    assert death["attributes"][sc.EXCEPTION_MESSAGE] == "data worker lost"


def test_a_span_recorded_after_the_fact_fails_like_a_duration_even_if_the_error_cannot_be_printed(configure) -> None:
    """One span factory: ``record_span`` records errors as ``Duration`` does (status first, never raising)."""
    from otel_training.events.past_spans import record_span

    class Unprintable(RuntimeError):
        def __str__(self) -> str:
            raise ValueError("no")

    telemetry = configure(exporter="file")
    with otel_training.TrainerProcess().step(global_step=1) as step:
        record_span(sc.SPAN_DATA_WAIT, "#data_wait", 1_000, 2_000, {}, parent=step.span, error=Unprintable())
        record_span(sc.SPAN_DATA_WAIT, "#data_wait", 2_000, 3_000, {}, parent=step.span, error="worker lost")
    waits = [span for span in _spans(telemetry) if span["name"] == sc.SPAN_DATA_WAIT]
    assert [w["status"]["code"] for w in waits] == [2, 2]  # ERROR
    assert [w["attributes"][sc.ERROR_TYPE].rsplit(".", 1)[-1] for w in waits] == ["Unprintable", "error"]


def test_a_process_that_first_met_a_shut_down_pipeline_records_into_the_next_one(configure, tmp_path) -> None:
    """A Process whose first span came while the global pipeline was shut down (and still global: nothing had
    configured the next yet) keeps no runtime of it: once a new pipeline is configured, its spans go there.
    Before, it kept that runtime for good and every later span was lost (test_compat_areal after
    test_compat_dlrover: a module-level Process, exported=0)."""
    first = configure(exporter="file", output_dir=str(tmp_path / "first"))
    first.shutdown(timeout_s=2)
    trainer = otel_training.TrainerProcess()
    with trainer.step(global_step=1):  # the shut-down pipeline: nothing is exported, nothing raises
        pass
    telemetry = configure(exporter="file", output_dir=str(tmp_path / "second"))
    with trainer.step(global_step=2):
        pass
    steps = [span for span in _spans(telemetry) if span["name"] == "training.step"]
    assert [span["attributes"][sc.STEP] for span in steps] == [2]
