"""Steps until step 3, which raises (``raise``) or waits a minute to be signalled (anything else).

    python train_until_step3.py OUTPUT_DIR MODE
"""

import sys
import time

import otel_training

otel_training.configure(exporter="file", output_dir=sys.argv[1])
trainer = otel_training.TrainerProcess()
with trainer.train():
    for step in range(1000):
        with trainer.step(global_step=step):
            if step == 3:
                if sys.argv[2] == "raise":
                    raise RuntimeError("loss is NaN")
                print("in-step-3", flush=True)
                time.sleep(60)
