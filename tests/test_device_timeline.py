"""The device timeline on CPU, with a fake asynchronous device (tests/fake_device.py).

The scenarios of the device-timeline issue, each through the real pipeline
(TrainerProcess or the torch instrumentor on real torch, the stuck processor,
the file exporter, the report's analysis):

* a healthy device-bound loop whose host blocks in the data loader while the
  device runs earlier steps: goodput ~100%, data loading ~0, the median step
  the device's step time, no alert;
* a stalled kernel with a sync every step, and with a sync every 10 steps: one
  stuck alert naming the stalled step (not the one the host was launching),
  then ``recovered``;
* a host outside any step past the threshold with the device idle;
* CUDA graph capture, a failing device, shutdown with device work pending,
  turning it off.

Gates, not sleeps: a stalled kernel runs until the stuck alert's callback opens
it, so each test waits on a condition, never on a guess of how long things take.
"""

from __future__ import annotations

import statistics
import threading
from typing import Any

import pytest
from fake_device import FakeDevice
from otlp_json import read_spans
from waiting import wait_until

import otel_training
from otel_training import semconv as sc
from otel_training.analysis import account
from otel_training.analysis.stragglers import WINDOW
from otel_training.events import device as device_module
from otel_training.events import device_probe
from otel_training.report.job import build_report
from otel_training.report.reader import read_paths
from otel_training.report.stream import digest_file
from otel_training.report.summary import render_summary

THRESHOLD_S = 0.3
#: Markers the host may run ahead of the device (two per step): a pinned-memory copy or a full launch queue.
RUN_AHEAD = 6


class Alerts:
    """Collects alert events; opens a stalled kernel's gate at the first stuck alert."""

    def __init__(self, telemetry: otel_training.Telemetry) -> None:
        self.events: list = []
        self.gate: threading.Event | None = None
        self.stuck = threading.Event()
        telemetry.stuck.add_callback(self)  # type: ignore[union-attr]

    def __call__(self, event) -> None:
        self.events.append(event)
        if event.kind == sc.ALERT_KIND_STUCK:
            self.stuck.set()
            if self.gate is not None:
                self.gate.set()


def spans_of(telemetry: otel_training.Telemetry) -> list[dict]:
    result = telemetry.shutdown(timeout_s=5)
    assert result.completed, result
    return read_spans(telemetry.trace_path)


def named(spans: list[dict], name: str) -> list[dict]:
    return sorted((span for span in spans if span["name"] == name), key=lambda span: span["start"])


def trainer_loop(fake: FakeDevice, alerts: Alerts | None, *, steps: int, device_s: float, sync_every: int,
                 stall_at: int | None = None) -> None:
    """A plain loop: the step launches its kernels; ``loss.item()`` every ``sync_every`` steps, outside the step."""
    trainer = otel_training.TrainerProcess()
    with trainer.train():
        with trainer.epoch(epoch=0):
            for index in range(steps):
                with trainer.step(global_step=index):
                    fake.wait_until_behind(RUN_AHEAD)  # a full launch queue blocks the next launch
                    if index == stall_at:
                        assert alerts is not None
                        alerts.gate = fake.launch_gate()
                    fake.launch(device_s)
                if index % sync_every == sync_every - 1:
                    fake.synchronize()


# -- a stalled kernel -----------------------------------------------------------------------------


@pytest.mark.parametrize("sync_every", [1, 10], ids=["item-every-step", "item-every-10-steps"])
def test_a_stalled_kernel_is_alerted_on_its_own_step_then_recovered(configure, fake, sync_every) -> None:
    telemetry = configure(stuck_threshold_s=THRESHOLD_S)
    alerts = Alerts(telemetry)
    trainer_loop(fake, alerts, steps=25, device_s=0.005, sync_every=sync_every, stall_at=12)
    spans = spans_of(telemetry)

    stuck = [span for span in named(spans, sc.SPAN_ALERT) if span["attributes"][sc.ALERT_KIND] == "stuck"]
    recovered = [span for span in named(spans, sc.SPAN_ALERT) if span["attributes"][sc.ALERT_KIND] == "recovered"]
    # One alert, on the stalled step's device execution: not on a later step the host was launching
    # or blocked in, not on the host step, not on the time between steps.
    assert len(stuck) == 1, [(span["attributes"][sc.ALERT_SPAN_NAME], span["attributes"].get(sc.STEP),
                              span["attributes"][sc.ALERT_COUNT]) for span in stuck]
    alert = stuck[0]["attributes"]
    assert alert[sc.ALERT_SPAN_NAME] == sc.SPAN_DEVICE_STEP
    assert alert[sc.STEP] == 12
    assert alert[sc.EPOCH] == 0
    assert alert[sc.DEVICE] == "fake:0"
    assert alert[sc.DEVICE_LAST_COMPLETED_STEP] == 11
    assert alert[sc.STEP_LAUNCHED] is True  # the host had finished step 12: the device is what is stuck
    assert alert[sc.THREAD_ID] == threading.main_thread().ident
    assert alert[sc.ALERT_STACKS].startswith("Thread MainThread")  # where the host is blocked, first
    assert len(recovered) == 1 and recovered[0]["attributes"][sc.ALERT_SPAN_ID] == alert[sc.ALERT_SPAN_ID]

    # The alert came a threshold after the device began the step (bounds generous for a loaded machine).
    (device_step,) = [span for span in named(spans, sc.SPAN_DEVICE_STEP) if span["attributes"][sc.STEP] == 12]
    assert device_step["span_id"] == alert[sc.ALERT_SPAN_ID]
    late_s = (stuck[0]["start"] - device_step["start"]) / 1e9
    assert THRESHOLD_S <= late_s < THRESHOLD_S + 2.0
    assert alert[sc.ALERT_ELAPSED_S] >= THRESHOLD_S
    assert [event.kind for event in alerts.events] == ["stuck", "recovered"]
    # The report says which step, on which device.
    from otel_training.report.summary import render_summary

    summary = render_summary(build_report(read_paths([telemetry.trace_path]).records))
    assert "training.device_step step 12 on fake:0 stuck after" in summary



@pytest.fixture
def configure(configure: Any) -> Any:
    """The in-process timeline (its Python resolver, its detector read here): offload off. The offloaded one is
    tests/test_device_native.py's (the C core's resolver) and test_offload.py's (the fallback's)."""
    return lambda **options: configure(**{"offload": False, **options})

def test_the_host_blocked_inside_a_later_step_raises_no_alert_of_its_own(configure, fake) -> None:
    # With a sync every 10 steps the host runs ahead of the stalled step 12 and blocks inside a later
    # step's launch (the full queue). That host step is open far past the threshold, yet only the
    # device step is alerted: its host step is timed on the device.
    telemetry = configure(stuck_threshold_s=THRESHOLD_S)
    alerts = Alerts(telemetry)
    trainer_loop(fake, alerts, steps=25, device_s=0.005, sync_every=10, stall_at=12)
    spans = spans_of(telemetry)
    host_steps = named(spans, sc.SPAN_STEP)
    longest = max(host_steps, key=lambda span: span["end"] - span["start"])
    assert longest["attributes"][sc.STEP] > 12
    assert (longest["end"] - longest["start"]) / 1e9 > THRESHOLD_S
    assert all(span["attributes"][sc.STEP_DEVICE_TIMED] for span in host_steps)
    assert {event.span_name for event in alerts.events} == {sc.SPAN_DEVICE_STEP}


# -- a healthy device-bound loop ------------------------------------------------------------------


def test_healthy_loop_device_steps_carry_the_device_time(configure, fake) -> None:
    telemetry = configure(stuck_threshold_s=5.0)
    trainer_loop(fake, None, steps=20, device_s=0.02, sync_every=10)
    spans = spans_of(telemetry)
    host_steps, device_steps = named(spans, sc.SPAN_STEP), named(spans, sc.SPAN_DEVICE_STEP)
    assert [span["attributes"][sc.STEP] for span in device_steps] == list(range(20))
    by_id = {span["span_id"]: span for span in host_steps}
    for device_step in device_steps:
        host = by_id[device_step["parent_id"]]  # a child of its host step
        assert host["attributes"][sc.STEP] == device_step["attributes"][sc.STEP]
        assert device_step["start"] >= host["start"]
        assert device_step["attributes"][sc.DEVICE_NAME] == FakeDevice.name
    # Device steps run one after the other and never overlap.
    for before, after in zip(device_steps, device_steps[1:]):
        assert after["start"] >= before["end"]
    durations = [(span["end"] - span["start"]) / 1e9 for span in device_steps]
    # The device's own step time (each step is one kernel), not the microseconds of launching it.
    assert statistics.median(durations) == pytest.approx(statistics.median(fake.kernel_s), rel=0.15)
    assert not named(spans, sc.SPAN_ALERT)


def test_goodput_follows_the_device_not_the_host_waits(configure, fake, tmp_path) -> None:
    torch = pytest.importorskip("torch")
    from otel_training.integrations.torch import TorchInstrumentor

    telemetry = configure(stuck_threshold_s=5.0)
    instrumentor = TorchInstrumentor()
    instrumentor.instrument()
    try:
        true_step_s = _device_bound_torch_loop(torch, fake, steps=40, device_s=0.03)
    finally:
        instrumentor.uninstrument()
    spans = spans_of(telemetry)

    # The host spent much of the loop blocked in the DataLoader (the pinned-memory copy waiting for the
    # device): a host-timeline report would call that data-loading badput.
    loop_s = (max(s["end"] for s in spans) - min(s["start"] for s in named(spans, sc.SPAN_STEP))) / 1e9
    host_waits_s = sum(s["attributes"][sc.STEP_DATA_WAIT_S] for s in named(spans, sc.SPAN_STEP))
    assert host_waits_s > 0.3 * loop_s

    read = read_paths([telemetry.trace_path])
    assert not read.problems
    report = build_report(read.records)
    goodput = report.goodput
    # Start-up aside, the device was busy with training all along.
    assert goodput.training_goodput is not None and goodput.training_goodput >= 0.90, goodput.seconds
    assert goodput.badput[sc.BADPUT_DATA_LOADING] <= 0.05 * goodput.total_s, goodput.seconds
    assert report.job_steps is not None
    # The fake's items are handed over by a Python thread, so allow more than the GPU test's 5%.
    assert report.job_steps.median == pytest.approx(true_step_s, rel=0.15)
    assert not report.alerts
    # The summary shows both: the host's waits, and the little of them the device paid for.
    assert report.data_wait_s == pytest.approx(host_waits_s)
    summary = render_summary(report)
    (line,) = [line for line in summary.splitlines() if line.startswith("data: host waits for batches ")]
    assert "time lost to them (data_loading)" in line
    streamed = digest_file(telemetry.trace_path, window=WINDOW)[0]
    assert streamed.data_wait_s == pytest.approx(host_waits_s)


def _device_bound_torch_loop(torch, fake: FakeDevice, *, steps: int, device_s: float) -> float:
    """An unmodified-looking torch loop whose "CUDA" work runs on the fake device; the true step time:
    the median of its kernels' measured times (the mean would carry a loaded machine's long sleeps,
    which the report's median rightly does not)."""

    def collate(batch):
        fake.wait_until_behind(RUN_AHEAD)  # pin_memory + non_blocking copy: blocks while the device is behind
        return torch.utils.data.default_collate(batch)

    data = torch.utils.data.TensorDataset(torch.randn(steps * 4, 8), torch.randn(steps * 4, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4, collate_fn=collate)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters())
    kernels_before = len(fake.kernel_s)
    for index, (x, y) in enumerate(loader):
        fake.launch(device_s)  # the step's kernels
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        if index % 10 == 9:
            fake.synchronize()  # loss.item() for logging
    fake.synchronize()
    kernels = fake.kernel_s[kernels_before:]
    assert len(kernels) == steps  # one kernel a step
    return statistics.median(kernels)


def test_live_goodput_metrics_follow_the_device(configure, fake, tmp_path) -> None:
    # The same spans through the live processor's metrics and through the report agree.
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from otel_training.processors.goodput import GoodputSpanProcessor

    telemetry = configure(stuck_threshold_s=5.0, goodput=False)
    reader = InMemoryMetricReader()
    processor = GoodputSpanProcessor(MeterProvider(metric_readers=[reader]))
    telemetry.add_span_processor(processor)
    trainer_loop(fake, None, steps=15, device_s=0.02, sync_every=5)
    fake.synchronize()
    spans = spans_of(telemetry)
    live = processor.settle()
    device_steps = named(spans, sc.SPAN_DEVICE_STEP)
    assert len(device_steps) == 15
    # The device steps are productive live too (the host steps alone would be ~launch time: microseconds of
    # each 20 ms). Not always all of their summed length on a loaded machine (0.94 of it seen once with other
    # jobs on the 2 cores: the fake device's clock is a thread's); the report's figure below is the exact check.
    device_s = sum(span["end"] - span["start"] for span in device_steps)
    assert live["productive"] >= 0.8 * device_s
    report = account(read_paths([telemetry.trace_path]).records)
    assert live["productive"] / 1e9 == pytest.approx(report.productive_s, rel=0.02)
    # The step-duration histogram holds the device steps, not the host steps.
    (histogram,) = [metric for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
                    for metric in sm.metrics if metric.name == sc.METRIC_STEP_DURATION]
    (point,) = histogram.data.data_points
    assert point.count == 15
    assert point.sum == pytest.approx(device_s / 1e9, rel=0.01)


# -- the host outside any step ------------------------------------------------------------------------


def test_host_outside_steps_past_the_threshold_is_alerted(configure, fake) -> None:
    telemetry = configure(stuck_threshold_s=THRESHOLD_S)
    alerts = Alerts(telemetry)
    trainer = otel_training.TrainerProcess()
    with trainer.epoch(epoch=3):
        for index in range(6):
            with trainer.step(global_step=index):
                fake.launch(0.002)
            if index == 3:
                # Logging to a hung filesystem: the host, outside any step, with the device idle.
                assert alerts.stuck.wait(timeout=30), "no alert for the host outside steps"
    spans = spans_of(telemetry)
    (alert,) = [span["attributes"] for span in named(spans, sc.SPAN_ALERT)
                if span["attributes"][sc.ALERT_KIND] == "stuck"]
    assert alert[sc.ALERT_SPAN_NAME] == sc.SPAN_BETWEEN_STEPS
    assert alert[sc.STEP] == 3 and alert[sc.EPOCH] == 3
    assert alert[sc.THREAD_ID] == threading.main_thread().ident
    (gap,) = named(spans, sc.SPAN_BETWEEN_STEPS)
    host_steps = {span["attributes"][sc.STEP]: span for span in named(spans, sc.SPAN_STEP)}
    (device_step_3,) = [span for span in named(spans, sc.SPAN_DEVICE_STEP) if span["attributes"][sc.STEP] == 3]
    # Backdated to where both the host had left the step and the device had finished it.
    assert gap["start"] == max(host_steps[3]["end"], device_step_3["end"])
    assert gap["end"] == host_steps[4]["start"]  # ended where the next step began
    assert gap["parent_id"] == host_steps[3]["parent_id"]  # in the epoch
    assert [event.kind for event in alerts.events] == ["stuck", "recovered"]


def test_accounting_names_host_time_outside_steps(configure, fake) -> None:
    telemetry = configure(stuck_threshold_s=30)
    trainer = otel_training.TrainerProcess()
    with trainer.train():
        for index in range(4):
            with trainer.step(global_step=index):
                fake.launch(0.01)
            fake.synchronize()
            logged = threading.Event()
            logged.wait(0.05)  # host work between steps with the device idle (this wait IS the scenario)
    spans = spans_of(telemetry)
    result = account(read_paths([telemetry.trace_path]).records)
    assert result.seconds.get(sc.BADPUT_HOST_OUTSIDE_STEPS, 0) >= 3 * 0.04
    assert result.seconds.get(sc.BADPUT_OTHER, 0) < 0.05
    assert named(spans, sc.SPAN_DEVICE_STEP)


# -- capture, failure, shutdown, off ---------------------------------------------------------------------


def test_nothing_is_recorded_while_a_graph_is_captured(configure, fake) -> None:
    telemetry = configure(stuck_threshold_s=30)
    trainer = otel_training.TrainerProcess()
    fake.capturing = True
    with trainer.step(global_step=0):
        pass
    fake.capturing = False
    with trainer.step(global_step=1):
        fake.launch(0.001)
    spans = spans_of(telemetry)
    host = {span["attributes"][sc.STEP]: span for span in named(spans, sc.SPAN_STEP)}
    assert sc.STEP_DEVICE_TIMED not in host[0]["attributes"]  # timed (and watched) on the host
    assert host[1]["attributes"][sc.STEP_DEVICE_TIMED] is True
    assert [span["attributes"][sc.STEP] for span in named(spans, sc.SPAN_DEVICE_STEP)] == [1]


def test_device_work_pending_at_shutdown_is_resolved_or_reported(configure, fake) -> None:
    telemetry = configure(stuck_threshold_s=30, exit_timeout_s=4.0)
    trainer = otel_training.TrainerProcess()
    for index in range(3):
        with trainer.step(global_step=index):
            fake.launch(0.05)
    gate = None
    with trainer.step(global_step=3):
        gate = fake.launch_gate()  # never completes before shutdown
    spans = spans_of(telemetry)
    gate.set()
    device_steps = {span["attributes"][sc.STEP]: span for span in named(spans, sc.SPAN_DEVICE_STEP)}
    assert sorted(device_steps) == [0, 1, 2, 3]
    assert all(device_steps[index]["status"].get("code") != 2 for index in range(3))
    assert device_steps[3]["status"]["code"] == 2  # ERROR: its device work had not completed
    assert "had not completed at shutdown" in device_steps[3]["status"]["message"]


def test_a_failing_device_falls_back_to_host_timing_and_says_so(configure, fake, monkeypatch, caplog) -> None:
    telemetry = configure(stuck_threshold_s=30)
    trainer = otel_training.TrainerProcess()
    with trainer.step(global_step=0):
        fake.launch(0.001)
    fake.synchronize()
    timeline = telemetry_timeline()
    assert wait_until(lambda: timeline.resolved == 1)

    def broken(marker):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(fake, "completed_ns", broken)
    with trainer.step(global_step=1):
        pass
    assert wait_until(lambda: timeline.failed)
    with trainer.step(global_step=2):
        pass
    spans = spans_of(telemetry)
    host = {span["attributes"][sc.STEP]: span for span in named(spans, sc.SPAN_STEP)}
    assert host[1]["attributes"][sc.STEP_DEVICE_TIMED] is True
    assert sc.STEP_DEVICE_TIMED not in host[2]["attributes"]  # host timing from then on
    assert "device timeline failed" in caplog.text


def test_turned_off_no_device_spans_no_thread(configure, fake) -> None:
    telemetry = configure(device_timeline=False)
    trainer = otel_training.TrainerProcess()
    with trainer.step(global_step=0):
        fake.launch(0.001)
    from otel_training.events.runtime import runtime

    assert runtime().device is False  # probed once, off: no timeline, no resolver thread
    spans = spans_of(telemetry)
    assert not named(spans, sc.SPAN_DEVICE_STEP)
    assert sc.STEP_DEVICE_TIMED not in named(spans, sc.SPAN_STEP)[0]["attributes"]


def test_without_a_device_nothing_changes(configure, monkeypatch) -> None:
    # No factory and torch has not initialised CUDA (CPU-only here): plain host steps, no timeline.
    monkeypatch.setattr(device_probe, "_factory", None)
    telemetry = configure()
    trainer = otel_training.TrainerProcess()
    with trainer.step(global_step=0):
        pass
    from otel_training.events.runtime import runtime

    assert runtime().device is None
    spans = spans_of(telemetry)
    assert sc.STEP_DEVICE_TIMED not in named(spans, sc.SPAN_STEP)[0]["attributes"]
    assert not named(spans, sc.SPAN_DEVICE_STEP)


def telemetry_timeline() -> device_module.DeviceTimeline:
    from otel_training.events.runtime import runtime

    timeline = runtime().device
    assert isinstance(timeline, device_module.DeviceTimeline)
    return timeline


def test_device_busy_outside_the_steps_past_the_threshold_is_alerted(configure, fake) -> None:
    # An evaluation's kernel hangs between steps 2 and 3: the device never begins step 3, and the
    # host waits inside step 3. No device step is open, so the time between steps is what is alerted.
    telemetry = configure(stuck_threshold_s=THRESHOLD_S)
    alerts = Alerts(telemetry)
    trainer = otel_training.TrainerProcess()
    for index in range(5):
        if index == 3:
            alerts.gate = fake.launch_gate()  # the hung evaluation kernel, outside any step
        with trainer.step(global_step=index):
            fake.launch(0.002)
            fake.wait_until_behind(0)  # the host blocks inside the step (a full queue, a sync)
    spans = spans_of(telemetry)
    stuck = [span["attributes"] for span in named(spans, sc.SPAN_ALERT) if span["attributes"][sc.ALERT_KIND] == "stuck"]
    assert [alert[sc.ALERT_SPAN_NAME] for alert in stuck] == [sc.SPAN_BETWEEN_STEPS]
    assert stuck[0][sc.STEP] == 2 and stuck[0][sc.DEVICE_LAST_COMPLETED_STEP] == 2
    (gap,) = named(spans, sc.SPAN_BETWEEN_STEPS)
    device_steps = {span["attributes"][sc.STEP]: span for span in named(spans, sc.SPAN_DEVICE_STEP)}
    assert gap["start"] == device_steps[2]["end"]  # the device finished step 2, then ran the eval
    assert [event.kind for event in alerts.events] == ["stuck", "recovered"]


# -- what the review of the first version found -------------------------------------------------------


def test_a_data_bound_loop_is_data_loading_not_device_time(configure, fake) -> None:
    # The device is idle while the host waits for each batch: that wait is data loading. The step's
    # device time begins once its batch is in (the torch instrumentor opens the step at the fetch).
    torch = pytest.importorskip("torch")
    from otel_training.integrations.torch import TorchInstrumentor

    class Slow(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 12

        def __getitem__(self, index: int):
            threading.Event().wait(0.03)  # a slow decoder: 30 ms per sample, the scenario itself
            return torch.randn(4), torch.randn(1)

    telemetry = configure(stuck_threshold_s=30)
    TorchInstrumentor().instrument()
    try:
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for x, y in torch.utils.data.DataLoader(Slow(), batch_size=1):
            fake.launch(0.005)
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
    finally:
        TorchInstrumentor().uninstrument()
    fake.synchronize()
    spans = spans_of(telemetry)
    device_steps = named(spans, sc.SPAN_DEVICE_STEP)
    assert len(device_steps) == 12
    # Device steps hold the device work, not the wait before it; the idle gap before each says so.
    assert statistics.median((s["end"] - s["start"]) / 1e9 for s in device_steps) < 0.02
    assert statistics.median(s["attributes"][sc.DEVICE_IDLE_BEFORE_S] for s in device_steps[1:]) > 0.02
    result = account(read_paths([telemetry.trace_path]).records)
    waits = sum(s["attributes"][sc.STEP_DATA_WAIT_S] for s in named(spans, sc.SPAN_STEP))
    assert result.seconds[sc.BADPUT_DATA_LOADING] == pytest.approx(waits, rel=0.2)
    assert result.training_goodput is not None and result.training_goodput < 0.5


def test_checkpoints_evaluation_and_teardown_are_not_gaps(configure, fake) -> None:
    telemetry = configure(stuck_threshold_s=THRESHOLD_S)
    alerts = Alerts(telemetry)
    trainer = otel_training.TrainerProcess()
    over_threshold = threading.Event()

    def long_host_work() -> None:  # twice the step threshold on the host, the device idle: the scenario
        over_threshold.wait(2 * THRESHOLD_S)

    with trainer.train():
        for index in range(3):
            with trainer.step(global_step=index):
                fake.launch(0.002)
            fake.synchronize()
        with trainer.save(path="/tmp/ckpt", step=2):
            long_host_work()
        with trainer.evaluate():
            long_host_work()
        with trainer.step(global_step=3):
            fake.launch(0.002)
    long_host_work()  # teardown after the training loop
    spans = spans_of(telemetry)
    assert not alerts.events, [(event.kind, event.span_name) for event in alerts.events]
    assert not named(spans, sc.SPAN_BETWEEN_STEPS)
    result = account(read_paths([telemetry.trace_path]).records)
    assert result.seconds[sc.BADPUT_CHECKPOINT_SAVE] >= 2 * THRESHOLD_S * 0.9
    assert result.seconds[sc.BADPUT_EVALUATION] >= 2 * THRESHOLD_S * 0.9


def test_the_time_after_host_work_counts_from_its_end(configure, fake) -> None:
    """On an injected clock: the step ended before a save of 0.2 s; 29.9 s after the save's end is no gap yet,
    though it is 30 s after the step's (two pieces of host work back to back had that moment between them, and
    a gap opened there, backdated to the step: a flaky alert on a loaded machine). 30.1 s after is one, from
    the save's end."""
    telemetry = configure(stuck_threshold_s=30)
    trainer = otel_training.TrainerProcess()
    with trainer.train():
        with trainer.step(global_step=0):
            fake.launch(0.002)
        fake.synchronize()
        rt = trainer.events_runtime()
        timeline = rt.device
        assert isinstance(timeline, device_module.DeviceTimeline)
        assert wait_until(lambda: timeline.resolved == 1, 30)
        with trainer.save(path="/tmp/ckpt", step=0):
            threading.Event().wait(0.2)  # the save itself: the scenario, not a wait for something
        ended = rt.host_work_ended_ns
        timeline.poll(now_ns=ended + 29_900_000_000)
        timeline.poll(now_ns=ended + 30_100_000_000)
        with trainer.step(global_step=1):
            fake.launch(0.002)
    spans = spans_of(telemetry)
    (gap,) = named(spans, sc.SPAN_BETWEEN_STEPS)
    (save,) = named(spans, sc.SPAN_SAVE_CHECKPOINT)
    assert gap["start"] == ended and 0 <= ended - save["end"] < 50_000_000  # its end, as the save ended


def test_teardown_after_training_stays_other_with_a_device(configure, fake) -> None:
    telemetry = configure(stuck_threshold_s=30)
    trainer = otel_training.TrainerProcess()
    with trainer.train():
        for index in range(3):
            with trainer.step(global_step=index):
                fake.launch(0.02)  # the device finishes the last steps after the loop has ended
    fake.synchronize()
    with trainer.init():  # something after the loop, so the run extends past it
        threading.Event().wait(0.05)
    spans_of(telemetry)
    result = account(read_paths([telemetry.trace_path]).records)
    assert result.seconds.get(sc.BADPUT_HOST_OUTSIDE_STEPS, 0) < 0.01, result.seconds
    assert result.seconds.get(sc.BADPUT_OTHER, 0) > 0.0


def test_rates_use_the_device_time(configure, fake) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from otel_training.processors.goodput import GoodputSpanProcessor

    telemetry = configure(stuck_threshold_s=30, goodput=False)
    reader = InMemoryMetricReader()
    processor = GoodputSpanProcessor(MeterProvider(metric_readers=[reader]))
    telemetry.add_span_processor(processor)
    trainer = otel_training.TrainerProcess()
    for index in range(5):
        with trainer.step(global_step=index, **{sc.TOKENS: 1000, sc.SAMPLES: 8}):
            fake.launch(0.01)
    fake.synchronize()
    spans = spans_of(telemetry)
    processor.settle()
    metrics = {metric.name: metric for rm in reader.get_metrics_data().resource_metrics
               for sm in rm.scope_metrics for metric in sm.metrics}
    (tokens,) = metrics[sc.METRIC_STEP_TOKENS_RATE].data.data_points
    assert tokens.count == 5
    device_s = [(s["end"] - s["start"]) / 1e9 for s in named(spans, sc.SPAN_DEVICE_STEP)]
    assert tokens.sum == pytest.approx(sum(1000 / d for d in device_s), rel=0.01)


@pytest.mark.realtime
def test_shutdown_keeps_to_its_own_timeout(configure, fake) -> None:
    import time

    telemetry = configure(stuck_threshold_s=30, exit_timeout_s=20)
    trainer = otel_training.TrainerProcess()
    with trainer.step(global_step=0):
        gate = fake.launch_gate()  # never completes before shutdown
    started = time.monotonic()
    telemetry.shutdown(timeout_s=1.0)
    elapsed = time.monotonic() - started
    gate.set()
    assert elapsed < 1.0 + 0.5  # a quarter of 1 s for the device, not of 20 s


def test_device_steps_do_not_grow_the_trace_budget_table(configure, fake) -> None:
    from otel_training.events.runtime import runtime

    configure(stuck_threshold_s=30)
    trainer = otel_training.TrainerProcess()
    for index in range(50):  # root-level steps: each its own trace
        with trainer.step(global_step=index):
            fake.launch(0.0005)
    fake.synchronize()
    timeline = telemetry_timeline()
    assert wait_until(lambda: timeline.resolved == 50)
    assert len(runtime()._traces) == 0  # nothing re-created for traces the training thread forgot


def test_a_recording_span_of_another_implementation_never_raises_into_the_loop(configure, fake) -> None:
    """An injected provider of another implementation: its recording spans need not have the SDK's ``parent``
    or ``attributes``. The steps begin and end without raising into the loop; the device timeline, which reads
    the host step's attributes, falls back to host timing (and says so, once a process)."""
    from opentelemetry import trace as trace_api

    started: list[str] = []

    class Recording(trace_api.NonRecordingSpan):  # the API's Span: no ``parent``
        def is_recording(self) -> bool:
            return True

    class Tracer(trace_api.Tracer):
        def start_span(self, name: str, context: Any = None, *args: Any, **kwargs: Any) -> trace_api.Span:
            started.append(name)
            parent = trace_api.get_current_span(context).get_span_context()
            trace_id = parent.trace_id if parent.is_valid else 0x1234
            return Recording(trace_api.SpanContext(trace_id, len(started) + 1, False))

        def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    class Provider(trace_api.TracerProvider):
        def get_tracer(self, *args: Any, **kwargs: Any) -> trace_api.Tracer:
            return Tracer()

    configure(stuck_threshold_s=5.0, offload=False)
    trainer = otel_training.TrainerProcess(tracer_provider=Provider())
    with trainer.train(), trainer.epoch(epoch=0):
        for index in range(3):
            with trainer.step(global_step=index):
                fake.launch(0.001)
    fake.synchronize()
    assert started.count(sc.SPAN_STEP) == 3
    timeline = trainer.events_runtime().device
    assert timeline is not None and wait_until(lambda: timeline.failed, timeout_s=10)
