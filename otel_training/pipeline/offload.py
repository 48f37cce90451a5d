"""``offload=True``: this process writes span records to a ring, a drain process builds and exports the spans.

Why: in-process, every span costs the training process 20-40 µs of CPU (SDK
span objects, attribute validation, the batch processor, encoding), and the
threads doing the export, the stuck watcher and the goodput settling hold the
GIL the training thread needs between its kernels. Offloaded, a span is two
records (about 260 bytes a step) written to shared memory (``_ring.py``); the drain
process (``drain.py``) replays them through the pipeline the options describe.

The handle behaves as ``Telemetry`` does: ``force_flush`` returns once the
drain has exported what was written before it (bounded), ``shutdown`` once the
drain has finished, and the counts (delivered, dropped, pending, spooled) are
the drain's, plus the records this process could not write. See docs/offload.md
for what changes (span processors added in this process see no spans).
"""

from __future__ import annotations

import logging
import marshal
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter

from otel_training import semconv as sc
from otel_training._contain import log_once
from otel_training._fork import reset_in_child
from otel_training._native_loader import native
from otel_training._native_loader import problem as native_problem
from otel_training._ring import CAP_FAST_RECORDS, DRAIN_FIELDS, Ring, supported
from otel_training._version import __version__
from otel_training.config.parsers import ConfigError
from otel_training.exporters.otlp_json import trace_file
from otel_training.exporters.spool import spool_file
from otel_training.pipeline.device_records import STAT_KEYS, DeviceRecorder, start_recorder
from otel_training.pipeline.drain import IGNORED_SIGNALS
from otel_training.pipeline.outputs import check_output_dir
from otel_training.pipeline.record_tracer import RecordTracerProvider, processor_refused
from otel_training.pipeline.records import CLOSE, FLUSH, VALUES, encode
from otel_training.pipeline.responder import Responder, cuda_uuid
from otel_training.pipeline.telemetry import Telemetry

if TYPE_CHECKING:
    from otel_training.processors.stuck import StuckSpanProcessor

logger = logging.getLogger("otel_training")
#: The directory ``otel-training run`` puts first on PYTHONPATH: the drain must not instrument itself.
_SITE_DIR = str(Path(__file__).resolve().parents[1] / "integrations" / "auto" / "_site")
_WAIT_POLL_S = 0.001


def check_offload(options: Mapping[str, Any]) -> None:
    """Refuse, before training, what offloading cannot do yet."""
    if options["native"] == "on" and native_problem() is not None:
        raise ConfigError(f"option native='on' (OTEL_TRAINING_NATIVE): {native_problem()}; rebuild the package "
                          "with a C compiler (pip install .), or set native to auto or off")
    why = supported(options["native"])
    if why is not None:
        raise ConfigError(f"option offload=True (OTEL_TRAINING_OFFLOAD): not available here: {why}")


def offload_by_default(native: str) -> bool:
    """Whether a zero-code launch (``otel-training run``, ``opentelemetry-instrument``) offloads when not told:
    wherever offload runs (Linux; aarch64 with the C core)."""
    return supported(native if native in ("auto", "on", "off") else "auto") is None


class OffloadTelemetry(Telemetry):
    """A ``Telemetry`` whose spans are records for a drain process (see the module docstring)."""

    def __init__(self, options: Mapping[str, Any], environ: Mapping[str, str] | None = None, *,
                 before_stuck_exit: Callable[[Telemetry], None] | None = None, **kwargs: Any) -> None:
        """``before_stuck_exit``: what ends the open spans before ``stuck_action="exit"`` exits this process
        (the assembly hands the lifecycle hooks' own, ``assembly/plugins.py``)."""
        check_offload(options)
        self._before_stuck_exit = before_stuck_exit
        self._ring: Ring | None = None
        self._drain: subprocess.Popen[bytes] | None = None
        self._drain_gone = False
        self._flush_token = 0
        self._flush_lock = threading.Lock()
        self._recorders: list[DeviceRecorder] = []
        super().__init__(options, environ, **kwargs)
        if self.disabled:
            return  # nothing is recorded: the SDK's provider, with no exporter, stays
        sampler = self.tracer_provider.sampler  # the SDK's, from the environment
        self._ring = ring = Ring.create(self.options["offload_ring_mb"] * 2**20, self.options["native"])
        ring.wait_s = self.options["span_queue_max_wait_s"] if self.options["span_queue_policy"] == "wait" else 0.0
        ring.alive = self._drain_alive
        self._drain = self._start_drain(ring)
        if self.options["spool_dir"] and self.exporter_name == "otlp":  # the drain spools, in a file of its own
            self.spool_path = spool_file(self.options["spool_dir"], self.rank, self._drain.pid)
        self.tracer_provider = RecordTracerProvider(  # type: ignore[assignment]  # offloaded, the provider makes records: the SDK's calls, not its class
            ring.write, self.resource, sampler, write_control=self._write_control, flush=self._flush_drain,
            close=self._close_drain, fast=ring.fast_records(), lineage=self.lineage)
        self.tracer = self.tracer_provider.get_tracer(sc.INSTRUMENTATION_SCOPE, __version__, schema_url=sc.SCHEMA_URL)
        #: The stuck thresholds the options set, for the device timeline's time between steps (the detector
        #: itself runs in the drain; adaptive thresholds are learned there, so here they stay at their start).
        self._stuck_thresholds: StuckSpanProcessor | None = None
        if options["stuck_threshold_s"] is not None or options["stuck_adaptive"]:
            from otel_training.processors.stuck import StuckSpanProcessor

            self._stuck_thresholds = StuckSpanProcessor.from_options(options, watcher=False, stacks=False)
        reset_in_child(self, OffloadTelemetry._forget_in_child)

    def stuck_threshold_s(self, span_name: str) -> float | None:
        """The thresholds the options set (the detector runs in the drain; adaptive ones are learned there, so
        here they stay at their start)."""
        stuck = self._stuck_thresholds
        threshold = stuck.threshold_for(span_name) if stuck is not None else None
        return None if threshold is None else threshold.seconds

    def device_recorder(self, label: str, name: str) -> DeviceRecorder | None:
        """The native device resolver (``device_records.py``) once the drain reads its records: the C core, a
        drain that has said it reads fast records. None otherwise: the Python timeline then times the steps."""
        ring = self._ring
        if ring is None or not ring.native or ring.closed or not ring.get(DRAIN_FIELDS["caps"]) & CAP_FAST_RECORDS:
            return None
        recorder = start_recorder(native(self.options["native"]), ring.fast_records(), label, name, ring.write)
        if recorder is not None:
            self._recorders.append(recorder)
        return recorder

    def device_stats(self) -> dict[str, int]:
        """The native device resolvers' counts (``DeviceRecorder.stats``), summed; zeros without one."""
        total = dict.fromkeys(STAT_KEYS, 0)
        for recorder in self._recorders:
            for key, value in recorder.stats().items():
                total[key] = total.get(key, 0) + value
        return total

    def _make_span_exporter(self, environ: Mapping[str, str]) -> SpanExporter | None:
        """None: the drain exports. The trace and spool directories are still checked here, before training."""
        if self.exporter_name == "file":
            check_output_dir(self.options["output_dir"])
            self.trace_path = trace_file(self.options["output_dir"], self.rank)
        if self.options["spool_dir"] and self.exporter_name == "otlp":
            check_output_dir(self.options["spool_dir"], "spool_dir", "spool")  # the drain's file: once it runs
        return None

    def _start_drain(self, ring: Ring) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        path = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry and entry != _SITE_DIR]
        env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), *path])
        # Blocked from its fork on (a child inherits the forking thread's signal mask, across exec too) until
        # the drain ignores them (drain.py): a job stopped in the drain's first second does not lose it. This
        # thread blocks them only for the fork; one arriving meanwhile waits, or goes to another thread.
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, IGNORED_SIGNALS)
        # The drain's stuck detector asks this process for its stacks, or its exit, through this pipe
        # (pipeline/responder.py).
        asked, ask = os.pipe()
        try:
            process = subprocess.Popen([sys.executable, "-m", "otel_training.assembly.drain", str(ring.fd)],
                                       stdin=subprocess.PIPE, env=env, pass_fds=(ring.fd, ask),
                                       start_new_session=True)
        except BaseException:
            os.close(asked)
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
            os.close(ask)  # the drain's copy is the only one: its exit ends the responder
        self._responder = Responder(asked, ring.write, self._exit_for_stuck_action)
        # The drain runs no sidecar of its own: it does the sidecar's work for this process (responder.py).
        # The lineage is stamped here, where set_lineage() changes it (record_tracer.py): the drain's stamps none.
        hello = {"options": {**self.options, "offload": False, "watchdog": False, "pipeline_id": None,
                             "trigger_id": None, "trigger_training_id": None},
                 "resource": dict(self.resource.attributes), "schema_url": self.resource.schema_url,
                 "pid": os.getpid(), "requests_fd": ask, "watchdog": self.options["watchdog"],
                 "device_uuids": self._device_uuids()}
        assert process.stdin is not None
        try:
            process.stdin.write(pickle.dumps(hello))
            process.stdin.close()
        except OSError:
            pass  # it died at once: found by ``_drain_alive``, its spans counted as dropped
        os.close(ring.fd)  # the drain has its own copy; the mapping keeps the memory here
        return process

    def _device_uuids(self) -> dict[int, str]:
        """{CUDA ordinal: UUID} of the rank's device, for the drain's GPU sampler, where this process already knows
        it (CUDA initialised before the pipeline: rare; otherwise the drain asks once device steps begin, through
        the responder). Never imports torch or initialises CUDA."""
        if not self.options.get("gpu_state_interval_s") or "torch" not in sys.modules:
            return {}
        from otel_training.hardware.setup import device_ordinal

        ordinal = device_ordinal(self.resource.attributes.get(sc.TRAINING_LOCAL_RANK), os.environ)
        uuid = cuda_uuid(ordinal)
        return {ordinal: uuid} if uuid else {}

    def _exit_for_stuck_action(self, code: int) -> None:
        """``stuck_action="exit"``, asked by the drain's detector: as in-process, end the open spans (the stuck
        step first), flush within the exit budget and exit with ``code`` for the launcher to restart."""
        logger.warning("otel_training: exiting with code %d (a stuck span) so the launcher restarts this rank", code)
        try:
            if self._before_stuck_exit is not None:
                self._before_stuck_exit(self)
            self.force_flush(timeout_s=self.options["exit_timeout_s"])
        finally:
            os._exit(code)

    def _drain_alive(self) -> bool:
        """False once the drain has exited: from then on every record is dropped at once, and counted."""
        drain = self._drain
        if drain is None or self._drain_gone:
            return False
        code = drain.poll()
        if code is None:
            return True
        self._drain_gone = True
        if self._ring is not None:
            self._ring.close_writer()
        if self._ring is None or self._ring.get(DRAIN_FIELDS["done"]) != 1:
            log_once("offload-drain-gone", "otel_training: the drain process exited (status %s): the spans it had "
                     "not exported, and those written from now on, are counted as dropped", code, exc_info=False)
        return False

    # -- flush and close, as the record tracer provider's ---------------------
    def deliver_values(self, span_id: int, target: int, values: dict[str, Any]) -> None:
        """To the drain, whose exporting pipeline holds the span for them (a values record: dropped, and counted
        in the drain as values that never came, when the ring is full)."""
        payload = encode((VALUES, span_id, target, values))
        if payload is not None and self._ring is not None:
            self.tracer_provider.emit(payload, None)  # type: ignore[attr-defined]  # the RecordTracerProvider set in __init__ (a ring: _ring is set)

    def _write_control(self, payload: bytes, timeout_s: float) -> bool:
        """A control record waits for room while the drain reads, whatever the span queue policy."""
        ring = self._ring
        return ring is not None and ring.write(payload, None, time.monotonic() + timeout_s)

    def _flush_drain(self, timeout_s: float) -> bool:
        ring = self._ring
        if ring is None or ring.closed:
            return False
        deadline = time.monotonic() + timeout_s
        with self._flush_lock:
            self._flush_token += 1
            token = self._flush_token
        # The deadline too (CLOCK_MONOTONIC is the machine's, the same in the drain): the drain stops flushing
        # when this process stops waiting, not a whole timeout after it read the record.
        if not self._write_control(marshal.dumps((FLUSH, token, timeout_s, deadline)), timeout_s):
            return False
        return self._wait(lambda: ring.get(DRAIN_FIELDS["flushed"]) >= token, deadline)

    def _close_drain(self) -> bool:
        ring = self._ring
        if ring is None or ring.closed:
            return False
        deadline = self.shutdown_deadline or time.monotonic() + self.options["exit_timeout_s"]
        # With this process's deadline (the machine's monotonic clock): the drain is done by then, not a whole
        # exit budget later, so a job whose output it shares (a launcher's capture, a `| tee`) ends on time.
        done = self._write_control(marshal.dumps((CLOSE, deadline)), max(0.0, deadline - time.monotonic())) and self._wait(
            lambda: ring.get(DRAIN_FIELDS["done"]) == 1, deadline)
        ring.close_writer()
        if done and self._drain is not None:
            try:  # it exits right after saying it is done: reap it, so no zombie stays behind
                self._drain.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        return done

    def drain_ready(self, timeout_s: float = 10.0) -> bool:
        """Wait (bounded) until the drain process runs its pipeline; False if it did not in ``timeout_s``.

        Nothing needs this: records written before are read once it runs. It is for measuring the steady
        state (benches) and for tests: the C core's fast records are written only once the drain runs.
        """
        ring = self._ring
        return ring is not None and self._wait(lambda: ring.get(DRAIN_FIELDS["pid"]) != 0,
                                               time.monotonic() + timeout_s)

    def _wait(self, condition: Callable[[], bool], deadline: float) -> bool:
        while not condition():
            if time.monotonic() >= deadline or not self._drain_alive():
                return bool(condition())
            time.sleep(_WAIT_POLL_S)
        return True

    def _forget_in_child(self) -> None:
        """A forked child: the ring and the drain are the parent's; flush and shutdown leave them alone."""
        if self._ring is not None:
            self._ring.forget_in_child()
        self._ring = None  # its counts are the parent's to report
        self._drain = None
        self._drain_gone = True

    # -- accounting ---------------------------------------------------------
    def counts(self) -> tuple[int, int, int]:
        ring = self._ring
        if ring is None:
            return super().counts()
        # A span is lost when its end record was dropped or could not be encoded, or its begin was dropped
        # (the drain then reads an end without a begin: an orphan); a span whose begin was dropped and that
        # never ends is not counted, as an open span is not in-process. Once the drain is gone, what it
        # had not replayed is lost too.
        self._drain_alive()
        get, drain = ring.get, DRAIN_FIELDS
        # A record the drain could not decode loses its span too (counted once: a damaged end record's span is
        # discarded; a damaged begin record's end then arrives alone, an orphan, so at most one span is counted
        # twice, and only for a record too damaged to tell its kind).
        orphans, bad = get(drain["orphans"]), get(drain["bad"])
        lost = ring.dropped_ends + self.tracer_provider.ring_drops + orphans  # type: ignore[attr-defined]  # the RecordTracerProvider set with the ring
        # A device record the full ring refused leaves its step's device span unstarted or unended: counted too.
        dropped = lost + get(drain["dropped"]) + get(drain["lost"]) + bad + self.device_stats()["dropped"]
        unread = max(0, ring.ends_written - get(drain["replayed"]) - orphans - bad)
        if self._drain_gone and get(drain["done"]) != 1:
            return get(drain["exported"]), dropped + unread + get(drain["pending"]), 0
        return get(drain["exported"]), dropped, unread + get(drain["pending"])

    def _observe_queue_wait(self, options: CallbackOptions) -> list[Observation]:
        ring = self._ring
        return [Observation(ring.waited_s if ring is not None else 0.0)]

    @property
    def spans_spooled(self) -> int:
        return self._ring.get(DRAIN_FIELDS["spooled"]) if self._ring is not None else 0

    def add_span_processor(self, processor: SpanProcessor) -> None:
        """Span processors run in the drain process: one added here would never see a span."""
        raise ConfigError(processor_refused(type(processor).__name__))


