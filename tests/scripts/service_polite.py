"""A service that exits 0 on SIGTERM; writes ``up`` to MARKER once started.

    python service_polite.py MARKER
"""

import signal
import sys
import time

signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
open(sys.argv[1], "w").write("up")
while True:
    time.sleep(1)
