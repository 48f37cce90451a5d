"""``python -m otel_training.watchdog``: the sidecar process (started by ``configure(watchdog=True)``)."""

import sys

from otel_training.watchdog.monitor import main

sys.exit(main())
