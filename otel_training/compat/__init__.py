"""Other tools' instrumentation APIs, so their users switch by changing one import.

``otel_training.compat.dlrover`` (DLRover's ``training_event``, with DLRover's own
event log) and ``otel_training.compat.kungfu`` (KungFu's monitor functions). See
docs/compat.md.
"""
