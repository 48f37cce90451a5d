"""The former home of the AReaL ``perf_tracer`` API, kept as an alias.

    from otel_training.integrations import perf_tracer   # still works

This name is ``otel_training.compat.areal`` itself (the same module object,
not a copy): ``GLOBAL_TRACER``, the context variables and a monkeypatched
``profiler`` are shared whichever path a program imported. See docs/compat-areal.md.
"""

import sys

from otel_training.compat import areal as _areal

sys.modules[__name__] = _areal
