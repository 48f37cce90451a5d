"""A training process whose steps run on the fake asynchronous device (tests/fake_device.py), exporting
OTLP to the e2e stack: the device timeline's spans and a stalled device step's alert, end to end.

Step ``STALL_STEP`` launches a kernel that runs until ``HOLD_S`` after its stuck alert (long enough for the
alert to reach Alertmanager), with ``loss.item()``-style syncs every 10 steps, so the host runs ahead into
later steps while the device is stuck. Prints ``ALERT <kind> <span name> <step>`` for each alert it raised.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for fake_device

from fake_device import FakeDevice

import otel_training
from otel_training import semconv as sc
from otel_training.events import device_probe

STEPS, STALL_STEP, HOLD_S = 30, 12, 8.0


def main() -> None:
    fake = FakeDevice()
    device_probe.use_device(lambda: fake)
    # In-process: its on_stuck callback releases the hung kernel (offloaded, the detector is the drain's).
    telemetry = otel_training.configure(stuck_threshold_s=float(sys.argv[1]), offload=False)
    gates: list[threading.Event] = []

    def on_alert(event) -> None:
        print(f"ALERT {event.kind} {event.span_name} {event.attributes.get(sc.STEP)}", flush=True)
        if event.kind == sc.ALERT_KIND_STUCK and gates:
            threading.Timer(HOLD_S, gates[0].set).start()  # the hung kernel comes back after a while

    telemetry.stuck.add_callback(on_alert)  # type: ignore[attr-defined]
    trainer = otel_training.TrainerProcess()
    with trainer.train():
        with trainer.epoch(epoch=0):
            for index in range(STEPS):
                with trainer.step(global_step=index):
                    fake.wait_until_behind(6)  # a full launch queue
                    if index == STALL_STEP:
                        gates.append(fake.launch_gate())
                    fake.launch(0.01)
                if index % 10 == 9:
                    fake.synchronize()
    fake.synchronize()
    result = telemetry.shutdown(timeout_s=10)
    print(f"delivered {result.exported} spans, dropped {result.dropped}", flush=True)


if __name__ == "__main__":
    main()
