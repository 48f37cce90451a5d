"""``configure()`` and the ``Telemetry`` handle: one tracing pipeline per process.

What this adds over a plain SDK setup is the guarantees a training job needs:
flush and shutdown that return within their timeout even when the collector is
gone (the SDK's ``force_flush`` ignores its timeout and its ``shutdown`` waits
out the exporter's retries), an exit path bounded the same way instead of the
SDK's unbounded ``atexit`` hook, and an account of every span that was not
delivered.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk.metrics import MeterProvider, TraceBasedExemplarFilter
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.trace.sampling import DEFAULT_ON
from opentelemetry.trace import Span, Tracer

from otel_training import semconv as sc
from otel_training._contain import call_contained
from otel_training._ids import PrivateIdGenerator
from otel_training._version import __version__
from otel_training.analysis.records import creation_time_ns
from otel_training.config.resource import build_resource
from otel_training.exporters.otlp_json import metrics_file, trace_file
from otel_training.exporters.spool import Spool, spool_file
from otel_training.pipeline.deadlines import FlushResult, millis, run_with_deadline
from otel_training.pipeline.device_records import DeviceRecorder
from otel_training.pipeline.exit_budget import ExitBudget
from otel_training.pipeline.exporters import metric_exporter, span_exporter
from otel_training.pipeline.outputs import check_output_dir, default_exporter
from otel_training.pipeline.span_chain import SpanChain
from otel_training.pipeline.span_counters import register_span_counters
from otel_training.processors.late_values import LateValuesSpanProcessor
from otel_training.processors.lineage import LineageSpanProcessor
from otel_training.processors.watching import WatchingSpanProcessor

if TYPE_CHECKING:
    from otel_training.processors.stuck import StuckSpanProcessor

logger = logging.getLogger("otel_training")


#: The SDK's defaults, given explicitly to a stand-in for a failed configuration.
_TRACING_DEFAULTS: dict[str, Any] = {
    "sampler": DEFAULT_ON,
    "span_limits": SpanLimits(max_attributes=128, max_events=128, max_links=128, max_span_attributes=128,
                              max_event_attributes=128, max_link_attributes=128,
                              max_attribute_length=SpanLimits.UNSET, max_span_attribute_length=SpanLimits.UNSET),
}
_METRICS_DEFAULTS: dict[str, Any] = {"exemplar_filter": TraceBasedExemplarFilter()}


class Telemetry:
    """The handle ``configure()`` returns: providers, tracer, meter, and bounded flush/shutdown."""

    METRICS_SUFFIX = ".jsonl"  #: of its metrics file, metrics-r<rank><suffix> (the offload drain's is its own)

    def __init__(self, options: Mapping[str, Any], environ: Mapping[str, str] | None = None, *,
                 config_error: Exception | None = None, resource: Resource | None = None,
                 tracing: Mapping[str, Any] | None = None) -> None:
        """``resource``, ``tracing`` (TracerProvider arguments): the drain's, for another process's spans."""
        environ = os.environ if environ is None else environ
        self.exporter_name: str = options["exporter"] or default_exporter(environ)
        #: The resolved options, read-only: every layer reads the same values for the pipeline's whole life.
        self.options: Mapping[str, Any] = MappingProxyType({**options, "exporter": self.exporter_name})
        self.resource: Resource = resource if resource is not None else build_resource(self.options, environ)
        self.rank: int = int(self.resource.attributes.get(sc.TRAINING_RANK, 0))  # type: ignore[arg-type]  # an int, or a str from OTEL_RESOURCE_ATTRIBUTES
        #: Why this process records nothing: its configuration failed (see ``configure``).
        self.config_error: Exception | None = config_error
        self.disabled: bool = (config_error is not None
                               or environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true")
        self.trace_path: Path | None = None
        #: Where undelivered spans are spooled (``spool_dir``), else None.
        self.spool_path: Path | None = None
        self._stuck: StuckSpanProcessor | None = None
        #: Stuck detectors in this pipeline (``stuck`` and any a user added): stopped before the last flush.
        self._detectors: list[SpanProcessor] = []
        self._process_span: Callable[[str], Span] | None = None
        self.metrics_path: Path | None = None
        self._shutdown_result: FlushResult | None = None
        self._shutdown_lock = threading.Lock()
        self._on_shutdown: list[Callable[[], None]] = []
        self._on_failure: list[Callable[[], None]] = []
        self._before_flush: list[Callable[[float], None]] = []
        #: ``time.monotonic()`` by which the shutdown in progress must return (None before one).
        self.shutdown_deadline: float | None = None
        #: Wall-clock ns at which this process was created (the resource's ``process.creation.time``,
        #: from the OS; else now): where this life's time starts, live as in the report.
        self.process_start_ns: int = creation_time_ns(self.resource.attributes) or time.time_ns()
        #: The way out gets ``exit_timeout_s`` once, however many steps it takes (``exit_budget.py``).
        self._exit = ExitBudget(float(self.options["exit_timeout_s"]))
        self._metric_exporter: MetricExporter | None = None

        # A stand-in for a failed configuration reads none of the environment that failed
        # (the SDK reads sampler, span limits and exemplar filter from it, and may raise).
        sdk_tracing, sdk_metrics = ({}, {}) if config_error is None else (_TRACING_DEFAULTS, _METRICS_DEFAULTS)
        own_ids = {} if os.environ.get("OTEL_PYTHON_ID_GENERATOR") else {"id_generator": PrivateIdGenerator()}
        sdk_tracing = {**own_ids, **sdk_tracing, **(tracing or {})}
        self.tracer_provider = TracerProvider(resource=self.resource, shutdown_on_exit=False, **sdk_tracing)
        self.lineage = LineageSpanProcessor(
            {
                key: value
                for key, value in (
                    (sc.TRAINING_PIPELINE_ID, self.options.get("pipeline_id")),
                    (sc.TRAINING_TRIGGER_ID, self.options.get("trigger_id")),
                    (sc.TRAINING_TRIGGER_TRAINING_ID, self.options.get("trigger_training_id")),
                )
                if value is not None
            }
        )
        self.tracer_provider.add_span_processor(self.lineage)

        span_exporter = None if self.disabled else self._make_span_exporter(environ)
        #: Where the spans leave, and its counts (``span_chain.py``); None: nothing exported here.
        self._chain: SpanChain | None = None
        if span_exporter is not None:
            spool = None
            if self.options["spool_dir"] and self.exporter_name == "otlp":
                check_output_dir(self.options["spool_dir"], "spool_dir", "spool")
                self.spool_path = spool_file(self.options["spool_dir"], self.rank)
                spool = Spool(self.spool_path, self.options["spool_max_mb"] * 2**20)
            self._chain = SpanChain(span_exporter, self.options, spool)
            self.tracer_provider.add_span_processor(self._chain.late_values)

        readers = []
        if self.options["metrics"] and not self.disabled:
            self._metric_exporter = self._make_metric_exporter(environ)
            if self._metric_exporter is not None:
                readers.append(PeriodicExportingMetricReader(self._metric_exporter))
        self.meter_provider = MeterProvider(resource=self.resource, metric_readers=readers, shutdown_on_exit=False,
                                            **sdk_metrics)

        self.tracer: Tracer = self.tracer_provider.get_tracer(
            sc.INSTRUMENTATION_SCOPE, __version__, schema_url=sc.SCHEMA_URL
        )
        self.meter: Meter = self.meter_provider.get_meter(
            sc.INSTRUMENTATION_SCOPE, __version__, schema_url=sc.SCHEMA_URL
        )
        self._register_counters()
        atexit.register(self._atexit)

    # -- construction -------------------------------------------------------
    def _make_span_exporter(self, environ: Mapping[str, str]) -> SpanExporter | None:
        if self.exporter_name == "file":
            check_output_dir(self.options["output_dir"])
            self.trace_path = trace_file(self.options["output_dir"], self.rank)
        return span_exporter(self.exporter_name, environ, self.trace_path)

    def _make_metric_exporter(self, environ: Mapping[str, str]) -> MetricExporter | None:
        if self.exporter_name == "file":
            self.metrics_path = metrics_file(self.options["output_dir"], self.rank).with_suffix(self.METRICS_SUFFIX)
        return metric_exporter(self.exporter_name, environ, self.metrics_path)

    def _register_counters(self) -> None:
        register_span_counters(self.meter, self._observe_dropped, self._observe_queue_wait, self._observe_spooled)

    # -- extension ----------------------------------------------------------
    def add_span_processor(self, processor: SpanProcessor) -> None:
        """Add a processor to this pipeline (stuck detection, goodput, DLRover log, yours)."""
        self.tracer_provider.add_span_processor(processor)
        if isinstance(processor, WatchingSpanProcessor):  # stopped before the last flush (processors/watching.py)
            self._detectors.append(processor)

    def add_stuck_detector(self, detector: StuckSpanProcessor) -> None:
        """Add the stuck detector the options turned on, ``stuck`` from then on (``assembly/plugins.py``)."""
        self.add_span_processor(detector)
        self._stuck = detector

    @property
    def stuck(self) -> StuckSpanProcessor | None:
        """The stuck detector the options turned on (``telemetry.stuck.add_callback``), else None."""
        return self._stuck

    def serve_process_span(self, process_span: Callable[[str], Span]) -> None:
        """The events API's process-lifetime span of a target, once the API runs on this pipeline: the lifecycle
        hooks record a thread's death on it (``process_span``), and the pipeline does not import the API."""
        self._process_span = process_span

    @property
    def process_span(self) -> Callable[[str], Span] | None:
        return self._process_span

    @property
    def metrics_exported(self) -> bool:
        """Whether a metric reader exports this pipeline's metrics (live goodput needs one to be collected)."""
        return self._metric_exporter is not None

    def shutdown_share_s(self, share: float) -> float:
        """``share`` of ``exit_timeout_s``, and of what is left of the shutdown in progress, if one is: what a
        shutdown callback that waits (the device timelines resolving the steps the host ran ahead) may take."""
        budget = share * float(self.options.get("exit_timeout_s", 2.0))
        if self.shutdown_deadline is not None:
            budget = min(budget, share * max(0.0, self.shutdown_deadline - time.monotonic()))
        return budget

    def stuck_threshold_s(self, span_name: str) -> float | None:
        """The stuck threshold a span named ``span_name`` gets now, None when it is not watched: what the device
        timeline alerts the time between steps by (a ``training.between_steps`` span past the step's threshold)."""
        threshold = self.stuck.threshold_for(span_name) if self.stuck is not None else None
        return None if threshold is None else threshold.seconds

    def device_recorder(self, label: str, name: str) -> DeviceRecorder | None:
        """Where a device's step markers go to be resolved natively (``device_records.py``): the offloaded
        pipeline's, with the C core. None here: the device timeline's Python resolver makes the device spans."""
        return None

    @property
    def late_values(self) -> LateValuesSpanProcessor | None:
        """The processor holding ended spans for their late values, in front of the export (None: no export)."""
        return self._chain.late_values if self._chain is not None else None

    def deliver_values(self, span_id: int, target: int, values: dict[str, Any]) -> None:
        """Values of an ended span, read since (``events/values.py``): to the span held for export
        (``target``: -1 its attributes, else its event's timestamp). The offloaded pipeline sends them to its
        drain."""
        if self._chain is not None:
            self._chain.late_values.resolve(span_id, target, values)

    def values_tick(self) -> None:
        """Pass on the spans held for values past ``values_hold_s`` (the drain calls it as it goes)."""
        if self._chain is not None:
            self._chain.late_values.tick()

    def before_flush(self, callback: Callable[[float], None]) -> None:
        """Run ``callback(seconds)`` at the start of every flush, with a quarter of its budget: what still feeds
        spans (device values being read, objects being converted) finishes first, so the flush exports it."""
        self._before_flush.append(callback)

    def on_shutdown(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` at the start of shutdown, e.g. to end long-lived spans."""
        self._on_shutdown.append(callback)

    def on_failure(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` when the way out of a dying process (an uncaught exception, a terminating signal, a
        stuck exit) is about to end the open spans as ERROR: what they should carry is set first (the open
        step's collectives), since the span's own end, which would set it, never comes."""
        self._on_failure.append(callback)

    def failing(self) -> None:
        """The ``on_failure`` callbacks, newest first, each contained (``lifecycle.hooks.end_open_spans``)."""
        for callback in reversed(self._on_failure):
            call_contained(callback)

    # -- accounting ---------------------------------------------------------
    def counts(self) -> tuple[int, int, int]:
        """(exported, dropped, pending) right now: what a flush reports, and what the drain publishes to the ring."""
        return self._chain.counts() if self._chain is not None else (0, 0, 0)

    def _observe_dropped(self, options: CallbackOptions) -> list[Observation]:
        return [Observation(self.counts()[1])]

    def _observe_queue_wait(self, options: CallbackOptions) -> list[Observation]:
        return [Observation(self._chain.queue_wait_s if self._chain is not None else 0.0)]

    @property
    def spans_spooled(self) -> int:
        """Spans the collector could not take, written to the spool (``spool_dir``) instead."""
        return self._chain.spooled if self._chain is not None else 0

    def _observe_spooled(self, options: CallbackOptions) -> list[Observation]:
        return [Observation(self.spans_spooled)]

    @property
    def spans_dropped(self) -> int:
        return self.counts()[1]

    @property
    def is_shut_down(self) -> bool:
        return self._shutdown_result is not None

    # -- flush and shutdown -------------------------------------------------
    def force_flush(self, timeout_s: float = 5.0) -> FlushResult:
        """Export what is queued; returns within ``timeout_s`` whatever the collector does."""
        start = time.monotonic()
        if self._shutdown_result is not None:  # shut down: what the shutdown achieved
            return self._shutdown_result
        for callback in self._before_flush:
            call_contained(callback, 0.25 * timeout_s)
        # The timeout goes to the provider too: the offloaded one asks the drain to flush no longer than this,
        # and the SDK's stops its export in the background by then rather than after its own 30 s.
        completed = run_with_deadline(lambda: self.tracer_provider.force_flush(millis(timeout_s)), timeout_s,
                                       "flush-traces")
        remaining = timeout_s - (time.monotonic() - start)
        if self.meter_provider is not None and remaining > 0:
            run_with_deadline(self.meter_provider.force_flush, remaining, "flush-metrics")
        exported, dropped, pending = self.counts()
        return FlushResult(completed and pending == 0, exported, dropped, pending, time.monotonic() - start,
                           self.spans_spooled)

    def shutdown(self, timeout_s: float = 5.0) -> FlushResult:
        """Flush, then stop exporting; returns within ``timeout_s`` and says what was lost."""
        start = time.monotonic()
        # Bounded even here: a second shutdown (a signal arriving during the
        # atexit one) must not wait longer than asked, let alone deadlock.
        if not self._shutdown_lock.acquire(timeout=max(0.0, timeout_s)):
            exported, dropped, pending = self.counts()
            return FlushResult(False, exported, dropped, pending, time.monotonic() - start, self.spans_spooled)
        try:
            if self._shutdown_result is not None:
                return self._shutdown_result
            deadline = start + max(0.0, timeout_s)
            self.shutdown_deadline = deadline  # callbacks that wait (the device timeline) stay within it
            for callback in reversed(self._on_shutdown):
                call_contained(callback)
            for detector in self._detectors:
                # Its watcher ends alert spans on a thread of its own: stop it (letting an alert it is
                # raising reach the queue) before the last flush. The tracer provider's shutdown stops
                # it only after the batch processor, where that alert would be dropped.
                run_with_deadline(detector.shutdown, 0.2 * (deadline - time.monotonic()), "shutdown-stuck")
            # Most of the budget for delivering spans, the rest for stopping cleanly.
            flush_s = 0.8 * (deadline - time.monotonic())
            completed = run_with_deadline(
                lambda: self.tracer_provider.force_flush(millis(flush_s)), flush_s, "flush-traces"
            )
            if self._chain is not None:
                self._chain.close()  # the exporter's retry back-off interrupted, later batches refused
            run_with_deadline(self.tracer_provider.shutdown, 0.5 * (deadline - time.monotonic()), "shutdown-traces")
            if not run_with_deadline(
                self.meter_provider.shutdown, deadline - time.monotonic(), "shutdown-metrics"
            ) and self._metric_exporter is not None:
                call_contained(self._metric_exporter.shutdown)
            exported, dropped, pending = self.counts()
            dropped += pending  # nothing queued now will ever leave
            # A pipeline shut down (a reconfigure) has nothing left for the exit: its hook would
            # only keep it, its providers and its spans alive until then.
            atexit.unregister(self._atexit)
            spooled = self.spans_spooled
            result = FlushResult(completed and dropped == 0, exported, dropped, 0, time.monotonic() - start, spooled)
            self._shutdown_result = result
            if dropped:
                logger.warning(
                    "otel_training: %d span(s) were not delivered by the %s exporter (%d delivered)",
                    dropped, self.exporter_name, exported,
                )
            if spooled:
                logger.warning(
                    "otel_training: %d span(s) the collector could not take are in the spool %s; send them with "
                    "`otel-training spool send %s --endpoint <collector OTLP/HTTP URL>`",
                    spooled, self.spool_path, self.options["spool_dir"],
                )
            return result
        finally:
            self._shutdown_lock.release()

    def exit_budget_s(self) -> float:
        """What is left of ``exit_timeout_s`` for the way out (the exit flushes share it: ``exit_budget.py``)."""
        return self._exit.left_s()

    def exit_flush(self) -> FlushResult:
        """``force_flush`` on the way out: within, and charged to, ``exit_budget_s``."""
        return self._exit.spend(self.force_flush)

    def _atexit(self) -> None:
        if not self.is_shut_down:
            self.shutdown(timeout_s=self.exit_budget_s())
