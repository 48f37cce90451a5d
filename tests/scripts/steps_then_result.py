"""STEPS steps with the pipeline from the environment, then ``RESULT exported dropped spooled``.

    python steps_then_result.py STEPS
"""

import sys

import otel_training

telemetry = otel_training.configure(signal_hooks=False, exception_hooks=False)
trainer = otel_training.TrainerProcess()
with trainer.epoch(epoch=0):
    for step in range(int(sys.argv[1])):
        with trainer.step(global_step=step, batch_size=8):
            pass
result = telemetry.shutdown(timeout_s=30)
print("RESULT", result.exported, result.dropped, result.spooled)
