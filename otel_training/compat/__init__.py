"""Drop-in replacements for other tools' instrumentation APIs (``otel_training.compat.kungfu``)."""
