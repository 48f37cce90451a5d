"""An offloading process forks a child that reconfigures and exits normally; the parent goes on.

    python offload_fork.py OUTPUT_DIR

The child's own pipeline, its exit hooks and its inherited copy of the parent's must leave the parent's
ring and drain alone: the parent's steps after the fork are all exported. Prints the parent's FlushResult.
"""

from __future__ import annotations

import os
import sys

import otel_training

telemetry = otel_training.configure(exporter="file", output_dir=sys.argv[1], offload=True, signal_hooks=False)
trainer = otel_training.TrainerProcess()
for step in range(5):
    with trainer.step(global_step=step):
        pass
telemetry.force_flush(timeout_s=30)
pid = os.fork()
if pid == 0:
    with trainer.step(global_step=100):  # refused: the ring is the parent's
        pass
    otel_training.configure(reconfigure=True, exporter="none")
    sys.exit(0)  # atexit runs: the inherited pipeline's shutdown must not close the parent's drain
os.waitpid(pid, 0)
for step in range(5, 15):
    with trainer.step(global_step=step):
        pass
print(telemetry.shutdown(timeout_s=30), flush=True)
