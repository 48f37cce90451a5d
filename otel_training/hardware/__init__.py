"""The accelerator's own state, beside the spans: clocks, power, throttling, errors (docs/gpu-state.md).

At the processors' layer: it may import semconv, analysis, the OpenTelemetry SDK and ``pynvml``, never the
pipeline; ``assembly/plugins.py`` wires it into the drain process, the only place it samples.
"""
