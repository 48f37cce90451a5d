"""Print the pid of the library's signal helper; with ``--block``, then wait in C for 30 s.

    python signal_helper_pid.py [--block]
"""

import ctypes
import sys

import otel_training
from otel_training.lifecycle import hooks

otel_training.configure(exporter="none")
print(hooks._watcher.helper.pid, flush=True)
if "--block" in sys.argv[1:]:
    ctypes.CDLL(None).system(b"sleep 30")
