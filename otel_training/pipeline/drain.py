"""The drain process: the training process's span records, replayed as SDK spans through its pipeline.

Started by ``OffloadTelemetry`` (``offload=True``) with the ring's file
descriptor; the pipeline's options and resource come over its stdin. It builds
the pipeline those options describe (exporter, batch processor, stuck detector,
live goodput, DLRover log) with the training process's resource, and replays
every record: a begin record starts an SDK span with the recorded ids, parent,
start time, attributes and links; an end record adds what came later (attributes,
events, status, a new name) and ends it at the recorded time. The processors
see the on_start and on_end they would have seen in the training process, the
exporters write the same spans.

It runs in a session of its own and ignores SIGTERM, SIGINT and SIGHUP, so a
Ctrl-C, a launcher's signal to the job's process group or a scheduler's to every
process of the job does not stop it before the training process has handed
over its last spans. It stops at the training process's close record, or when
that process is gone (then it exports what was written and counts the spans
that never ended); SIGKILL stops it at once.
"""

from __future__ import annotations

import fnmatch
import logging
import marshal
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import Span as SDKSpan
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
    TraceState,
    get_current_span,
    set_span_in_context,
)

from otel_training import semconv as sc
from otel_training._contain import log_once
from otel_training._ring import DRAIN_FIELDS, Ring
from otel_training.pipeline.device_steps import DeviceSteps
from otel_training.pipeline.host_gaps import HostGaps
from otel_training.pipeline.record_check import check_record
from otel_training.pipeline.records import BEGIN, CLOSE, DEVICE, DEVICE_INFO, END, FLUSH, SCOPE, STACKS, VALUES
from otel_training.pipeline.telemetry import Telemetry
from otel_training.processors.stuck import parse_span_names
from otel_training.processors.stuck_alerts import alert_attributes, end_alert_span

logger = logging.getLogger("otel_training")
#: How a close record's bytes begin (marshal: a tuple, then the int CLOSE); and what the drain gives its last
#: export past the training process's own deadline.
_CLOSE_PREFIX = marshal.dumps((CLOSE, 0.0))[:6]
_LAST_EXPORT_S = 0.25
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
#: How long the drain sleeps when the ring is empty, and how often it publishes its counts.
POLL_S = 0.002
PUBLISH_S = 0.05


class RecordedIds(IdGenerator, Sampler):
    """Hands the SDK what the training process decided: ids, sampling decision and trace state.

    Once, and only to the replaying thread: spans the drain's own processors make (stuck
    alerts, on their watcher's thread) get fresh random ids and are sampled, as ALWAYS_ON
    would (with their parent's trace state).
    """

    def __init__(self) -> None:
        self._primed = threading.local()
        self._random = RandomIdGenerator()

    def prime(self, trace_id: int, span_id: int, flags: int, state: Any) -> None:
        self._primed.ids = (trace_id, span_id, flags, TraceState(list(state)) if state else None)

    def generate_trace_id(self) -> int:
        ids = getattr(self._primed, "ids", None)
        return ids[0] if ids is not None else self._random.generate_trace_id()

    def generate_span_id(self) -> int:
        ids: tuple[int, int, int, TraceState | None] | None = getattr(self._primed, "ids", None)  # as prime() sets it
        if ids is None:
            return self._random.generate_span_id()
        self._primed.ids = None  # the span id is asked for last
        return ids[1]

    def is_trace_id_random(self) -> bool:
        ids = getattr(self._primed, "ids", None)
        return bool(ids[2] & TraceFlags.RANDOM_TRACE_ID) if ids is not None else True

    def should_sample(self, parent_context: Context | None, trace_id: int, name: str, kind: Any = None,
                      attributes: Any = None, links: Any = None, trace_state: Any = None) -> SamplingResult:
        ids = getattr(self._primed, "ids", None)
        if ids is None:
            state = get_current_span(parent_context).get_span_context().trace_state
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes, state)
        decision = Decision.RECORD_AND_SAMPLE if ids[2] & TraceFlags.SAMPLED else Decision.RECORD_ONLY
        return SamplingResult(decision, attributes, ids[3])

    def get_description(self) -> str:
        return "RecordedByTheTrainingProcess"


def _context(trace_id: int, span_id: int, remote: bool, flags: int = TraceFlags.SAMPLED,
             state: Any = None) -> SpanContext:
    return SpanContext(trace_id, span_id, remote, TraceFlags(flags), TraceState(list(state)) if state else None)


def _links(links: list[tuple[Any, ...]] | None) -> list[Link] | None:
    if not links:
        return None
    return [Link(_context(trace_id, span_id, remote, flags, state), attributes or None)
            for trace_id, span_id, remote, flags, state, attributes in links]


class Replayer:
    """Records in, SDK spans out, through ``telemetry``'s provider (built with ``ids`` as its id generator)."""

    def __init__(self, telemetry: Telemetry, ids: RecordedIds,
                 decode_fast: Callable[[bytes], tuple[Any, ...]] | None = None,
                 on_stacks: Callable[[int, str, Any], None] = lambda request_id, stacks, context: None) -> None:
        self.telemetry = telemetry
        self.ids = ids
        #: The C core's decoder of fast records (``_native.decode``); None: this drain reads marshal only, and
        #: does not say it reads them (``DRAIN_FIELDS["caps"]``), so none is written.
        self.decode_fast = decode_fast
        #: Where the training process's answers to the stuck detector's requests for stacks go.
        self.on_stacks = on_stacks
        self.open: dict[int, SDKSpan] = {}
        self.tracers: dict[int, Tracer] = {0: telemetry.tracer}
        self.replayed = 0
        self.ends_without_begin = 0
        self.flush_token = 0
        self.closed = False
        #: Records that did not decode as a record of their kind (``check_record``).
        self.bad = 0
        #: Called with each replayed span and its end time before it ends (plugins.py: the GPU state of a step).
        self.on_end: Callable[[SDKSpan, int], None] | None = None
        #: Once the training process has closed its pipeline or gone: when this drain stops exporting
        #: (monotonic), ``exit_timeout_s`` later, collector or not.
        self.exit_deadline: float | None = None
        #: The device spans of a training process whose markers a native thread resolves (``device_steps.py``).
        self.device_steps = DeviceSteps(telemetry.tracer,
                                        lambda: telemetry.stuck_threshold_s(sc.SPAN_DEVICE_STEP))
        #: The time between host steps where no device timeline watches it (``host_gaps.py``).
        self.host_gaps = HostGaps(telemetry.tracer, lambda: telemetry.stuck_threshold_s(sc.SPAN_STEP),
                                  lambda: self.device_steps.active)

    def apply_all(self, payloads: list[bytes]) -> None:
        decode_fast = self.decode_fast
        if self.exit_deadline is None and payloads and payloads[-1][:len(_CLOSE_PREFIX)] == _CLOSE_PREFIX:
            self.closing(self._close_deadline(payloads[-1]))  # the flush just before it waits no longer
        for payload in payloads:
            try:  # a fast record's first byte is its type, 1 to 3, which no marshal record starts with
                record = decode_fast(payload) if decode_fast is not None and payload[0] < 4 else marshal.loads(payload)
            except Exception:  # noqa: BLE001 - the decoders refuse damaged bytes with several types
                record = None
            problem = check_record(record)
            if problem is not None:
                self._refuse(record, problem)
                continue
            try:
                self.apply(record)  # type: ignore[arg-type]  # check_record passed: a non-empty tuple
            except Exception:  # noqa: BLE001 - one bad record must not stop the rest
                self._refuse(record, "the SDK refused it")

    def closing(self, deadline: float | None = None) -> float:
        """The training process closed its pipeline (by its ``deadline``, when its close record says) or is
        gone: what is left gets until then, or ``exit_timeout_s``, and a moment for the last export. Returns
        that exit deadline (the first one set stays)."""
        if self.exit_deadline is None:
            now = time.monotonic()
            budget = float(self.telemetry.options["exit_timeout_s"])
            self.exit_deadline = now + budget if deadline is None else min(now + budget,
                                                                            max(deadline, now) + _LAST_EXPORT_S)
        return self.exit_deadline

    @staticmethod
    def _close_deadline(payload: bytes) -> float | None:
        try:
            record = marshal.loads(payload)
        except Exception:  # noqa: BLE001 - checked again, and counted, when it is applied
            return None
        return record[1] if len(record) == 2 and type(record[1]) is float else None

    def _refuse(self, record: Any, problem: str) -> None:
        """A record that does not decode: counted as one span lost (a damaged end record's span is discarded)."""
        self.bad += 1
        if isinstance(record, tuple) and len(record) >= 2 and record[0] == END and isinstance(record[1], int):
            self.open.pop(record[1], None)
        log_once("drain-bad-record", "otel_training: the drain skipped a record it could not decode (%s); its span "
                 "is counted as dropped (further occurrences are counted, not logged)", problem, exc_info=False)

    def apply(self, record: tuple[Any, ...]) -> None:
        kind = record[0]
        if kind == END:
            self._end(record)
        elif kind == BEGIN:
            self._begin(record)
        elif kind == SCOPE:
            _, scope, name, version, schema_url, attributes = record
            self.tracers[scope] = self.telemetry.tracer_provider.get_tracer(name, version, schema_url, attributes)
        elif kind == FLUSH:
            # No longer than the training process waits for it (its deadline, on the machine's monotonic clock),
            # nor past this drain's own exit deadline once that process has closed or gone.
            timeout_s = record[2] if len(record) < 4 else min(record[2], record[3] - time.monotonic())
            if self.exit_deadline is not None:
                timeout_s = min(timeout_s, self.exit_deadline - time.monotonic())
            self.telemetry.force_flush(max(0.0, timeout_s))
            self.flush_token = record[1]
        elif kind == CLOSE:
            self.closed = True
            self.closing(record[1] if len(record) == 2 else None)
        elif kind == STACKS:
            self.on_stacks(record[1], record[2], record[3] if len(record) > 3 else None)
        elif kind == DEVICE:
            self.device_steps.device(record[1], record[2], record[3])
        elif kind == DEVICE_INFO:
            self.device_steps.info(record[1], record[2])
        elif kind == VALUES:
            self.telemetry.deliver_values(record[1], record[2], record[3])

    def _begin(self, record: tuple[Any, ...]) -> None:
        (_, span_id, trace_id, parent_id, remote, name, start, kind, attributes, links, scope, state, flags,
         parent_flags) = record
        self.ids.prime(trace_id, span_id, flags, state)
        # The parent as the SDK span it is here when it is open (as in-process: processors read its attributes,
        # the stuck alert its epoch), else by its ids alone (a remote parent, one begun before a drop).
        parent = self.open.get(parent_id) if parent_id and not remote else None
        if parent is not None and parent.get_span_context().trace_id == trace_id:
            context = set_span_in_context(parent)
        else:
            context = set_span_in_context(NonRecordingSpan(_context(trace_id, parent_id, remote, parent_flags,
                                                                    state))) if parent_id else Context()
        tracer = self.tracers.get(scope) or self.telemetry.tracer
        span: SDKSpan = tracer.start_span(name, context, SpanKind(kind), attributes, _links(links), start)  # type: ignore[assignment]  # the drain's tracers are the SDK's
        self.open[span_id] = span
        epoch = (parent.attributes or {}).get(sc.EPOCH) if parent is not None else None
        self.device_steps.host_began(span_id, span, epoch)
        self.host_gaps.host_began(span_id, span, epoch)

    def _end(self, record: tuple[Any, ...]) -> None:
        span = self.open.pop(record[1], None)
        if span is None:
            self.ends_without_begin += 1  # its begin record was dropped, counted by the writer
            return
        if len(record) > 3:
            _, _, _, updates, events, status, name, links = record
            if updates:
                span.set_attributes(updates)
            for event_name, timestamp, attributes in events or ():
                span.add_event(event_name, attributes, timestamp)
            if status is not None:
                span.set_status(Status(StatusCode(status[0]), status[1]))
            if name is not None:
                span.update_name(name)
            for link in _links(links) or ():
                span.add_link(link.context, link.attributes)
        if self.on_end is not None:
            self.on_end(span, record[2])
        self.device_steps.host_ended(record[1], span, record[2])
        self.host_gaps.host_ended(record[1], span, record[2])
        span.end(record[2])
        self.replayed += 1


class DrainTelemetry(Telemetry):
    """The pipeline in the drain: the training process's counters stay the training process's to report."""

    METRICS_SUFFIX = ".drain.jsonl"  # the training process writes metrics-r<rank>.jsonl

    def _register_counters(self) -> None:
        """None here: the training process reports drops, its own and the drain's."""


def publish(ring: Ring, telemetry: Telemetry, replayer: Replayer, lost: int = 0) -> None:
    """The drain's counts, where the training process reads them (``DRAIN_FIELDS``)."""
    exported, dropped, pending = telemetry.counts()  # the counts of the pipeline the drain built, published to the ring
    for field, value in (("replayed", replayer.replayed), ("orphans", replayer.ends_without_begin),
                         ("exported", exported), ("dropped", dropped),
                         ("pending", pending), ("spooled", telemetry.spans_spooled), ("lost", lost),
                         ("bad", replayer.bad),
                         ("flushed", replayer.flush_token)):
        ring.put(DRAIN_FIELDS[field], value)


def report_death(telemetry: Telemetry, open_spans: dict[int, SDKSpan], pid: int, *, alert: bool) -> None:
    """The training process died without closing its pipeline (SIGKILL, the OOM killer, ``os._exit``).

    Every span it could not end is ended ERROR, with a ``died`` event, and exported: its life's last step, its
    epoch and training loop reach the backend, and the report sees where and when the life ended and that it
    failed, instead of spans counted lost (issue 29). ``alert`` (``watchdog=True``), as the sidecar would: a
    ``died`` alert on each watched span it was in as well (``TrainingRankDied``)."""
    now = time.time_ns()
    watched = parse_span_names(telemetry.options["stuck_span_names"])  # name or pattern -> threshold
    tracer = telemetry.tracer_provider.get_tracer(sc.INSTRUMENTATION_SCOPE, schema_url=sc.SCHEMA_URL)
    epoch = next((span.attributes[sc.EPOCH] for span in open_spans.values()
                  if span.attributes and sc.EPOCH in span.attributes), None)
    for span in list(open_spans.values()):
        context = span.get_span_context()
        if alert and any(fnmatch.fnmatchcase(span.name, pattern) for pattern in watched):
            attributes = alert_attributes(sc.ALERT_KIND_DIED, sc.ALERT_SOURCE_WATCHDOG, 1, span.name,
                                          context.span_id, (now - (span.start_time or now)) / 1e9)
            if span.attributes and sc.STEP in span.attributes:
                attributes[sc.STEP] = span.attributes[sc.STEP]
            if epoch is not None:
                attributes[sc.EPOCH] = epoch
            attributes[sc.ALERT_PID] = pid
            end_alert_span(tracer, context, attributes)
        span.add_event(sc.ALERT_KIND_DIED, {sc.ALERT_PID: pid, sc.ALERT_SOURCE: sc.ALERT_SOURCE_WATCHDOG}, now)
        span.set_status(Status(StatusCode.ERROR, f"process {pid} died in this span"))
        span.end(now)
    logger.warning("otel_training: the training process %d died with %d span(s) open; they are ended as "
                   "died and exported", pid, len(open_spans))
    open_spans.clear()


#: What the drain ignores. A scheduler that stops a job signals every process of it (Slurm's scancel, a
#: container's stop): the drain outlives the training process's own handling of that signal, which ends
#: and flushes its spans, and stops by itself when that process has closed it or is gone. The training
#: process blocks these while it starts the drain (offload.py).
IGNORED_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
