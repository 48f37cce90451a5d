"""A fork Pool inside a step, terminated (SIGTERM to its workers) when the with block is left.

    python fork_pool_in_step.py OUTPUT_DIR
"""

import multiprocessing
import sys

import otel_training

otel_training.configure(exporter="file", output_dir=sys.argv[1])
trainer = otel_training.TrainerProcess()
with trainer.train():
    with trainer.step(global_step=1):
        with multiprocessing.get_context("fork").Pool(2) as pool:
            assert pool.map(abs, [-1, -2, -3]) == [1, 2, 3]
        # leaving the with block terminate()s the workers: SIGTERM
