"""A service that ignores SIGTERM, with a child that ignores it too; writes the child's pid to MARKER.

    python service_stubborn.py MARKER
"""

import os
import signal
import sys
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = os.fork()
if child == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(1)
open(sys.argv[1], "w").write(str(child))
while True:
    time.sleep(1)
