"""Step 2 waits until the stuck detector's ``signal`` action delivers SIGUSR1 (10 s at most)."""

import signal
import time

import otel_training

got = []
signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signum))
otel_training.configure(exporter="none", stuck_threshold_s=0.2, stuck_action="signal",
                        stuck_signal="SIGUSR1", signal_hooks=False)
trainer = otel_training.TrainerProcess()
with trainer.step(global_step=1):
    pass
with trainer.step(global_step=2):
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
print("signalled", got)
