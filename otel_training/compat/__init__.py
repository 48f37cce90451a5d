"""Other tools' instrumentation APIs, so their users switch by changing one import.

``otel_training.compat.dlrover`` (DLRover's ``training_event``, with DLRover's own
event log), ``otel_training.compat.areal`` (AReaL's ``perf_tracer``, with its
Chrome-trace and session files) and ``otel_training.compat.kungfu`` (KungFu's
monitor functions). See docs/compat.md and docs/compat-areal.md.
"""
