"""KungFu's failure-detection functions, so a script switches by changing one import.

    from otel_training.compat.kungfu import monitor_batch_begin, monitor_batch_end

The implementation lives with the other integrations in
``otel_training.integrations.compat.kungfu``.
"""

from otel_training.integrations.compat.kungfu import *  # noqa: F403
from otel_training.integrations.compat.kungfu import __all__  # noqa: F401
