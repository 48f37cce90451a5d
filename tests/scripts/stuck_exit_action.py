"""Step 2 hangs; the stuck detector's ``exit`` action ends the open spans, flushes and exits with 42."""

import time

import otel_training

otel_training.configure(exporter="file", output_dir="traces", stuck_threshold_s=0.3,
                        stuck_action="exit", stuck_exit_code=42)
trainer = otel_training.TrainerProcess()
with trainer.epoch(epoch=0):
    with trainer.step(global_step=1):
        pass
    with trainer.step(global_step=2):
        time.sleep(60)
print("not reached")
