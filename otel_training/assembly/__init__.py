"""The assembly layer: where a pipeline is put together from options, and the one global pointer to it.

Everything below it is built to be handed what it needs (a ``Telemetry``, a callable, a typed port); this layer
is the one place that decides what to hand: ``configure()`` and ``get_telemetry()`` (``configure.py``), the
processors and helpers options turn on (``plugins.py``), and the drain process's start (``drain.py``, run as
``python -m otel_training.assembly.drain``). It imports the pipeline, the lifecycle hooks and the watchdog; none
of them imports it. The events API and the integrations reach it for the embedded default only.
"""
