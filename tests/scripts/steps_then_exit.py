"""100 steps, then exit with a one-second exit budget (whatever the exporter in the environment does)."""

import otel_training

otel_training.configure(exit_timeout_s=1)
trainer = otel_training.TrainerProcess()
for step in range(100):
    with trainer.step(global_step=step):
        pass
print("done", flush=True)
