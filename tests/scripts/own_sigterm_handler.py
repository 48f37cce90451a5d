"""A script's own SIGTERM handler (checkpoint, then carry on), installed after ``configure()``.

    python own_sigterm_handler.py OUTPUT_DIR
"""

import ctypes
import signal
import sys

import otel_training

otel_training.configure(exporter="file", output_dir=sys.argv[1])
signal.signal(signal.SIGTERM, lambda signum, frame: print("checkpointing", flush=True))
print("blocked", flush=True)
ctypes.CDLL(None).system(b"sleep 1")
print("carried on", flush=True)
