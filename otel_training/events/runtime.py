"""Per-pipeline state of the events API: the tracer, trace budgets, process spans.

Kept apart from ``Duration`` so the hot path reads one module global and the
rest (bounding trace size, the process-lifetime span) stays in one place. A
new ``configure(reconfigure=True)`` gets a fresh runtime.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, Tracer, TracerProvider

from otel_training import semconv as sc
from otel_training._version import __version__
from otel_training.assembly import configure as _pipeline
from otel_training.events.values import PendingValues
from otel_training.pipeline.record_tracer import RecordTracer
from otel_training.pipeline.telemetry import Telemetry

if TYPE_CHECKING:
    from otel_training.events.device import DeviceTimeline
    from otel_training.events.device_native import NativeDeviceTimeline

#: Events per process-lifetime span before it continues in a new one (the SDK
#: keeps 128 events per span and silently drops the rest).
PROCESS_SPAN_MAX_EVENTS = 120
_MAX_TRACKED_TRACES = 4096


class _ProcessSpan:
    """A span for the life of one ``Process`` target, holding instants that have no other home."""

    def __init__(self, runtime: EventsRuntime, target: str) -> None:
        self._runtime = runtime
        self._target = target
        self._lock = threading.Lock()
        self._span: Span | None = None
        self._events = 0

    def get(self) -> Span:
        with self._lock:
            if self._span is None or self._events >= PROCESS_SPAN_MAX_EVENTS:
                previous = self._span
                links = [Link(previous.get_span_context(), {sc.LINK_TYPE: sc.LINK_PREVIOUS})] if previous else None
                self._span = self._runtime.tracer.start_span(
                    sc.SPAN_PROCESS,
                    context=Context(),
                    attributes={sc.EVENT_TARGET: self._target, sc.EVENT_NAME: "#process"},
                    links=links,
                )
                self._events = 0
                if previous is not None:
                    previous.end()
            self._events += 1
            return self._span

    def end(self) -> None:
        with self._lock:
            if self._span is not None:
                self._span.end()
                self._span = None


class EventsRuntime:
    """The events API's state for one pipeline and one tracer.

    ``tracer``: spans go to another ``TracerProvider`` than the pipeline's (an instrumentor or a
    callback given ``tracer_provider=``, as contrib's instrumentors take one), process spans
    included; the pipeline's options (trace budgets) still apply. The lifecycle hooks record a
    thread's death on the pipeline's own process span.
    """

    #: Slots: the C core reads the device, the budget and the tracer's start_child at every tracker step's
    #: begin (native/step_span.c), at a field's cost.
    __slots__ = ("telemetry", "tracer", "start_child", "max_spans", "max_age_s", "_traces", "_process_spans", "_lock",
                 "device", "device_probe_at", "host_work", "host_work_ended_ns", "training", "values", "closed", "__weakref__")

    def __init__(self, telemetry: Telemetry, tracer: Tracer | None = None) -> None:
        self.telemetry = telemetry
        self.tracer = tracer if tracer is not None else telemetry.tracer
        #: The offloaded pipeline's ``RecordTracer.start_child`` (a child of a current span already read),
        #: else None: any other tracer starts its spans through ``start_span``.
        self.start_child: Callable[[str, Span, Mapping[str, Any] | None], Span] | None = (
            self.tracer.start_child if isinstance(self.tracer, RecordTracer) else None)
        self.max_spans: int = telemetry.options["trace_max_spans"]
        self.max_age_s: float = telemetry.options["trace_max_age_s"]
        # trace_id -> [spans begun in it through this API, monotonic start]
        self._traces: dict[int, list[float]] = {}
        self._process_spans: dict[str, _ProcessSpan] = {}
        self._lock = threading.Lock()
        #: The device timeline (``events.device``): None until a device is in use, False when turned off.
        self.device: DeviceTimeline | NativeDeviceTimeline | Literal[False] | None = None
        #: When the next step may ask whether a device came into use (``device_probe.may_probe``).
        self.device_probe_at = 0.0
        #: Host work between steps open now (checkpoint, evaluation, set-up: ``HostWork``), and whether
        #: the training loop is running (None: no ``training.train`` span seen). The device timeline
        #: calls the time between steps idle only while neither says otherwise.
        self.host_work = 0
        #: When the last of it ended (wall clock, ns): the time between steps after it counts from there, so two
        #: pieces back to back (a save, then an evaluation) leave no gap as old as the step before them.
        self.host_work_ended_ns = 0
        self.training: bool | None = None
        #: Device values logged here, read once computed (``values.py``); None with an injected provider, whose
        #: pipeline cannot hold a span for them: they are described there, as before.
        self.values: PendingValues | None = None
        #: Its pipeline began shutting down: the ``Process`` objects that kept it look their runtime up again. True
        #: from the start for a pipeline already shut down (still the global one until the next ``configure()``),
        #: whose shutdown callbacks have run: kept, such a runtime would never be let go.
        self.closed = telemetry.is_shut_down
        if tracer is None:
            self.values = PendingValues(telemetry.deliver_values, float(telemetry.options.get("values_hold_s", 30.0)))
        telemetry.on_shutdown(self.close)
        if self.values is not None:
            telemetry.before_flush(self._settle_values)
        if tracer is None:
            telemetry.serve_process_span(self.process_span)

    def charge(self, trace_id: int) -> None:
        """Count one more span in ``trace_id``."""
        entry = self._traces.get(trace_id)
        if entry is None:
            if len(self._traces) >= _MAX_TRACKED_TRACES:
                self._traces.clear()
            self._traces[trace_id] = [1, time.monotonic()]
        else:
            entry[0] += 1

    def over_budget(self, trace_id: int) -> bool:
        entry = self._traces.get(trace_id)
        if entry is None:
            return False
        return entry[0] >= self.max_spans or time.monotonic() - entry[1] >= self.max_age_s

    def admit(self, trace_id: int) -> bool:
        """``charge(trace_id)`` unless ``over_budget(trace_id)``: True when the span was counted. A child
        begun in its parent's trace asks once, not twice."""
        entry = self._traces.get(trace_id)
        if entry is None:
            self.charge(trace_id)
            return True
        if entry[0] >= self.max_spans or time.monotonic() - entry[1] >= self.max_age_s:
            return False
        entry[0] += 1
        return True

    def forget(self, trace_id: int) -> None:
        self._traces.pop(trace_id, None)

    def process_span(self, target: str) -> Span:
        holder = self._process_spans.get(target)
        if holder is None:
            with self._lock:
                holder = self._process_spans.setdefault(target, _ProcessSpan(self, target))
        return holder.get()

    def _settle_values(self, timeout_s: float) -> None:
        if self.values is not None and self.values.pending:
            self.values.settle(timeout_s)

    def close(self) -> None:
        self.closed = True
        self._settle_values(self.telemetry.shutdown_share_s(0.25))  # the device finishes its queue: a share
        for holder in list(self._process_spans.values()):
            holder.end()


_runtime: EventsRuntime | None = None
_runtime_lock = threading.Lock()


def runtime() -> EventsRuntime:
    """The runtime of the current pipeline, configuring one with defaults if needed.

    Events used before ``configure()`` get the embedded default (settings from
    the environment and config file), as DLRover's emitter works out of the box.
    """
    global _runtime
    telemetry = _pipeline.get_telemetry()
    current = _runtime
    if current is not None and current.telemetry is telemetry:
        return current
    with _runtime_lock:
        telemetry = _pipeline.get_telemetry()
        if telemetry is None:
            try:
                telemetry = _pipeline.configure()
            except Exception:
                # configure() logged it once and installed a disabled stand-in: use that.
                telemetry = _pipeline.get_telemetry()
                if telemetry is None:
                    raise
        if _runtime is None or _runtime.telemetry is not telemetry:
            _runtime = EventsRuntime(telemetry)
        return _runtime


# Per injected provider (held weakly: a provider dropped is freed), the runtime for the current pipeline.
_provided: weakref.WeakKeyDictionary[TracerProvider, EventsRuntime] = weakref.WeakKeyDictionary()


def runtime_for(tracer_provider: TracerProvider | None) -> EventsRuntime:
    """The runtime whose spans go to ``tracer_provider`` (the pipeline's own when None). An injected provider
    configures nothing: its runtime reads the configured pipeline's options if there is one, else the
    environment's (``options_only``)."""
    if tracer_provider is None:
        return runtime()
    telemetry = _pipeline.options_only()
    provided = _provided.get(tracer_provider)
    if provided is None or provided.telemetry is not telemetry:
        with _runtime_lock:
            provided = _provided.get(tracer_provider)
            if provided is None or provided.telemetry is not telemetry:
                tracer = tracer_provider.get_tracer(sc.INSTRUMENTATION_SCOPE, __version__, schema_url=sc.SCHEMA_URL)
                provided = _provided[tracer_provider] = EventsRuntime(telemetry, tracer)
    return provided


def current_recording_span() -> Span | None:
    span = trace_api.get_current_span()
    return span if span.is_recording() else None
