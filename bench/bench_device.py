"""The device timeline's cost on the training thread, and how fast a stalled step is alerted.

1. Cost per step on the training thread: ``trainer.step()`` with the device
   timeline against the same step without it, interleaved in rounds within one
   process (CPU time of the training thread only, so the resolver thread's own
   work is not counted, but its competition for the GIL is). On CPU the device
   is a no-op stand-in, so the figure is our own code around the two markers;
   with ``--cuda`` (and a GPU) it is the real ``torch.cuda.Event`` records on
   the current stream. Goal: <= 10 µs per step.

2. Alert latency: a loop whose step ``--stall-step`` stalls on the device (a
   gated kernel on the fake device; ``torch.cuda._sleep`` with ``--cuda``),
   with ``loss.item()`` every step and every 10 steps. Printed: the step the
   stuck alert names, and how long after the device began that step the alert
   came, minus the threshold. Goal: the stalled step, within 50 ms.

    .venv/bin/python bench/bench_device.py            # CPU: the no-op device and the fake device
    .venv/bin/python bench/bench_device.py --cuda     # a GPU: real CUDA events and kernels
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # fake_device
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))  # cuda_plain_loop's GPU stall

import otel_training
from otel_training import semconv as sc
from otel_training.events import device as device_module
from otel_training.events import device_probe


class NoOpDevice:
    """Markers that complete at once: what is left is the timeline's own cost."""

    label, name = "noop:0", "no-op device"

    def record(self) -> object:
        return time.time_ns()

    def completed_ns(self, marker: int) -> int:
        return marker

    def release(self, marker: object) -> None:
        pass


def _configure(output: str, **options) -> otel_training.Telemetry:
    return otel_training.configure(reconfigure=True, output_dir=output, exporter="none", metrics=False,
                                   signal_hooks=False, exception_hooks=False, **{"offload": False, **options})


def record_cost(factory, pairs: int = 20000) -> float:
    """µs per step of the two marker records alone (the device's own call), from the pool as in a loop."""
    device = factory()
    device.release(device.record())
    started = time.thread_time_ns()
    for _ in range(pairs):
        device.release(device.record())
        device.release(device.record())
    return (time.thread_time_ns() - started) / pairs / 1e3


def step_cost(factory, steps: int, rounds: int, resolving: bool = True,
              pace_s: float = 0.0) -> tuple[float, float, list[float]]:
    """Median µs per step with and without the timeline, and the per-round differences.

    ``resolving=False`` keeps the resolver asleep: the training thread's own code alone, without
    the resolver thread's competition for the GIL (which emits a device span per step).
    ``pace_s`` spaces the steps (only the steps are timed), as a loop with work in its steps
    does: the resolver then keeps up and the markers come from its pool, whereas back-to-back
    empty steps outrun it and each marker is a new event.
    """
    saved = device_module.POLL_S, device_module.IDLE_POLL_S
    if not resolving:
        device_module.POLL_S = device_module.IDLE_POLL_S = 3600.0
    try:
        return _step_cost(factory, steps, rounds, pace_s)
    finally:
        device_module.POLL_S, device_module.IDLE_POLL_S = saved


def _step_cost(factory, steps: int, rounds: int, pace_s: float) -> tuple[float, float, list[float]]:
    with tempfile.TemporaryDirectory() as output:
        with_device, without, differences = [], [], []
        for index in range(rounds):
            measured = {}
            for on in ((True, False) if index % 2 == 0 else (False, True)):
                device_probe.use_device(factory if on else None)
                telemetry = _configure(output, device_timeline=on)
                trainer = otel_training.TrainerProcess()
                with trainer.step(global_step=-1):  # probe and warm up outside the timing
                    pass
                spent = 0
                for step in range(steps):
                    started = time.thread_time_ns()
                    with trainer.step(global_step=step):
                        pass
                    spent += time.thread_time_ns() - started
                    if pace_s:
                        time.sleep(pace_s)
                measured[on] = spent / steps / 1e3
                telemetry.shutdown(timeout_s=5)
            with_device.append(measured[True])
            without.append(measured[False])
            differences.append(measured[True] - measured[False])
        device_probe.use_device(None)
    return statistics.median(with_device), statistics.median(without), differences


def alert_latency(cuda: bool, sync_every: int, threshold_s: float, stall_step: int) -> tuple[object, float]:
    """(the step the first stuck alert names, alert time − device begin − threshold in seconds)."""
    if cuda:
        import torch

        torch.cuda.init()
        device_probe.use_device(None)
        from cuda_plain_loop import cycles_per_second

        cycles = cycles_per_second()
        work = torch.randn(2048, 2048, device="cuda")

        def launch(index: int) -> None:
            if index == stall_step:
                torch.cuda._sleep(int((threshold_s + 1.0) * cycles))
            for _ in range(4):
                work @ work

        def sync() -> None:
            torch.cuda.synchronize()
    else:
        from fake_device import FakeDevice

        fake = FakeDevice()
        device_probe.use_device(lambda: fake)
        gates: list[threading.Event] = []

        def launch(index: int) -> None:
            if index == stall_step:
                gates.append(fake.launch_gate())
            fake.launch(0.004)

        def sync() -> None:
            fake.synchronize()

    alerts: list = []
    with tempfile.TemporaryDirectory() as output:
        telemetry = _configure(output, stuck_threshold_s=threshold_s)

        def on_alert(event) -> None:
            if event.kind == sc.ALERT_KIND_STUCK and not alerts:
                alerts.append((event, time.time_ns()))
                for gate in gates if not cuda else ():
                    gate.set()

        telemetry.stuck.add_callback(on_alert)  # type: ignore[attr-defined]
        trainer = otel_training.TrainerProcess()
        for index in range(stall_step + 20):
            with trainer.step(global_step=index):
                launch(index)
            if index % sync_every == sync_every - 1:
                sync()
        sync()
        telemetry.shutdown(timeout_s=5)
    device_probe.use_device(None)
    event, _ = alerts[0]
    return event.attributes.get(sc.STEP), event.elapsed_s - threshold_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cuda", action="store_true", help="real CUDA events and kernels (needs a GPU)")
    parser.add_argument("--steps", type=int, default=2000, help="steps per round (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=9, help="rounds per mode (default: %(default)s)")
    parser.add_argument("--threshold", type=float, default=1.0, help="stuck threshold, s (default: %(default)s)")
    args = parser.parse_args()

    if args.cuda:
        import torch

        from otel_training.events.cuda import CudaDevice

        torch.cuda.init()
        factory, what = CudaDevice.current, f"CUDA events on {torch.cuda.get_device_name()}"
    else:
        factory, what = NoOpDevice, "a no-op device (the timeline's own code)"
    print(f"training-thread CPU per trainer.step(), {what}:")
    if args.cuda:
        for events in ("torch", "torch.cuda"):
            cost = record_cost(lambda: CudaDevice(torch.cuda, events=events))  # noqa: B023
            print(f"  the two marker records alone, {'torch.Event' if events == 'torch' else 'torch.cuda.Event'}: "
                  f"{cost:.2f} us per step; goal <= 10 us")
    else:
        print(f"  the two marker records alone: {record_cost(factory):.2f} us per step; goal <= 10 us")
    variants = [(False, 0.0, "the timeline's training-thread code (resolver asleep)"),
                (True, 0.0, "with the resolver emitting a device span per step, steps back to back")]
    if args.cuda:
        variants.append((True, 0.0005, "the same, steps 0.5 ms apart (markers from the pool)"))
    for resolving, pace_s, label in variants:
        with_device, without, differences = step_cost(factory, args.steps, args.rounds, resolving, pace_s)
        print(f"  {label}: {with_device:.2f} vs {without:.2f} us, "
              f"+{statistics.median(differences):.2f} us per step (rounds {min(differences):+.2f} .. "
              f"{max(differences):+.2f})")
    for sync_every in (1, 10):
        step, late = alert_latency(args.cuda, sync_every, args.threshold, stall_step=80 if args.cuda else 30)
        print(f"stall at step {80 if args.cuda else 30}, loss.item() every {sync_every:2d} step(s): alert names "
              f"step {step}, {late * 1e3:6.1f} ms after threshold (goal: that step, <= 50 ms)")


if __name__ == "__main__":
    main()
