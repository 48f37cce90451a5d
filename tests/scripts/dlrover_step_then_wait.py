"""DLRover's TrainerProcess begins a step, says ``ready`` and waits a minute to be signalled."""

import time

from otel_training.compat import dlrover

dlrover.TrainerProcess("AtorchTrainerV2").step(global_step=1).begin()
print("ready", flush=True)
time.sleep(60)
