"""The watchdog process: reports what the training process cannot report itself.

A watcher thread cannot run while C code holds the GIL, and nothing runs after
SIGKILL or the OOM killer. This process reads the training process's slot
(``watchdog.slot``) a few times a second and waits on a pidfd for its death, and
exports, with the training process's resource and through the same exporter
settings:

* ``stuck`` when a watched span is open past its threshold plus a grace period
  and the in-process detector has not alerted on it (so the process is frozen),
  repeated every escalation interval, and ``recovered`` if the span ends. A
  process that comes back continues the episode (its detector's alerts are
  repeats, counted on from the watchdog's) and raises its one recovery;
* ``died`` when the training process exits without a clean shutdown, with the
  span that was open, if any.

Stacks of a frozen process come from ``py-spy dump`` when it is installed (and
ptrace is allowed); the alert says why when they could not be taken.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags

from otel_training import semconv as sc
from otel_training._stacks import bounded
from otel_training.pipeline import exporters as factory
from otel_training.processors.stuck_alerts import alert_attributes, end_alert_span
from otel_training.watchdog.slot import STATE_CLOSED, SlotReader, SlotState

logger = logging.getLogger("otel_training.watchdog")

# Settings travel in the reserved OTEL_TRAINING__ prefix (not options of configure()).
ENV_SLOT = "OTEL_TRAINING__WATCHDOG_SLOT"
ENV_PID = "OTEL_TRAINING__WATCHDOG_PID"
ENV_RESOURCE = "OTEL_TRAINING__WATCHDOG_RESOURCE"
ENV_EXPORTER = "OTEL_TRAINING__WATCHDOG_EXPORTER"
ENV_TRACE_PATH = "OTEL_TRAINING__WATCHDOG_TRACE_PATH"
ENV_GRACE_S = "OTEL_TRAINING__WATCHDOG_GRACE_S"
ENV_POLL_S = "OTEL_TRAINING__WATCHDOG_POLL_S"
ENV_ESCALATION_S = "OTEL_TRAINING__WATCHDOG_ESCALATION_S"

PY_SPY_TIMEOUT_S = 10.0


def find_py_spy() -> str | None:
    """py-spy on PATH or next to this interpreter (a virtualenv's bin/)."""
    return shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))


def py_spy_stacks(pid: int) -> tuple[str | None, str | None]:
    """(stacks, error): every thread's stack of ``pid`` by py-spy, which reads memory and needs no GIL."""
    executable = find_py_spy()
    if executable is None:
        return None, "py-spy not found (pip install py-spy to get the stacks of a frozen process)"
    try:
        result = subprocess.run([executable, "dump", "--pid", str(pid)], capture_output=True, text=True,
                                timeout=PY_SPY_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, f"py-spy failed: {error}"
    if result.returncode != 0:
        return None, f"py-spy exited with {result.returncode} (ptrace permission?): {result.stderr.strip()[:500]}"
    return bounded(result.stdout), None


class Watchdog:
    def __init__(self, slot: SlotReader, pid: int, provider: TracerProvider, *, grace_s: float = 1.0,
                 poll_s: float = 0.1, escalation_s: float | None = None,
                 span_exporter: SpanExporter | None = None) -> None:
        self.slot = slot
        self.span_exporter = span_exporter
        self.pid = pid
        self.provider = provider
        self.tracer = provider.get_tracer(sc.INSTRUMENTATION_SCOPE, schema_url=sc.SCHEMA_URL)
        self.grace_s = grace_s
        self.poll_s = poll_s
        self.escalation_s = escalation_s
        self._reported_span = 0
        self._reported_state: SlotState | None = None
        self._count = 0
        self._next_ns = 0

    def run(self) -> int:
        """Watch until the training process exits; returns this process's exit code."""
        try:
            pidfd = os.pidfd_open(self.pid)
        except (OSError, AttributeError):
            pidfd = None
        while True:
            if pidfd is not None:
                died = bool(select.select([pidfd], [], [], self.poll_s)[0])
            else:
                # No pidfd (kernel < 5.3): we are its child, so its death reparents us.
                time.sleep(self.poll_s)
                died = os.getppid() != self.pid
            state = self.slot.read()
            if state.state == STATE_CLOSED:
                # A clean exit, seen now or only after the process had gone (this loop was busy with
                # py-spy, or between polls): the span we reported ended first, so it recovered.
                self._recovery(state, time.monotonic_ns())
                return 0
            if died:
                now = time.monotonic_ns()
                self._count = self._count + 1 if self._reported_span == state.span_id else 1
                self._alert(sc.ALERT_KIND_DIED, state, now, None, None)
                if state.open:
                    self._export_dead_span(state, now)
                return 0
            self._check(state)

    def _recovery(self, state: SlotState, now: int) -> None:
        """The recovery of the span we reported, once it ended, unless the process's detector took it over."""
        if self._reported_span and state.alerted_span_id == self._reported_span:
            # The process came back and its detector took the episode over: it repeats the alert and
            # says when the span recovers; one episode, one recovery, whoever spoke first.
            self._reported_span = 0
        if self._reported_span and (state.span_id != self._reported_span or not state.open):
            # The span we reported ended (or another began): the process came back.
            ended = state.end_ns if state.span_id == self._reported_span else now
            self._alert(sc.ALERT_KIND_RECOVERED, self._reported_state, ended, None, None)  # type: ignore[arg-type]  # set with _reported_span
            self._reported_span = 0

    def _check(self, state: SlotState) -> None:
        now = time.monotonic_ns()
        self._recovery(state, now)
        if not state.open or state.alerted_span_id == state.span_id:
            return
        grace_ns = int(self.grace_s * 1e9)
        if self._reported_span != state.span_id:
            if now < state.begin_ns + state.threshold_ns + grace_ns:
                return
            self._reported_span, self._reported_state, self._count = state.span_id, state, 0
        elif now < self._next_ns:
            return
        self._count += 1
        stacks, error = py_spy_stacks(self.pid)
        self._alert(sc.ALERT_KIND_STUCK, state, now, stacks, error)
        self.slot.reported(state.span_id, self._count)
        escalation_ns = int((self.escalation_s or state.threshold_ns / 1e9) * 1e9)
        self._next_ns = now + max(escalation_ns, int(self.poll_s * 1e9))

    def _alert(self, kind: str, state: SlotState, now_ns: int, stacks: str | None, error: str | None) -> None:
        alerted = None
        if state.open or kind == sc.ALERT_KIND_RECOVERED:
            alerted = SpanContext(state.trace_id, state.span_id, is_remote=True,
                                  trace_flags=TraceFlags(TraceFlags.SAMPLED))
            attributes = alert_attributes(kind, sc.ALERT_SOURCE_WATCHDOG, self._count, state.name, state.span_id,
                                          (now_ns - state.begin_ns) / 1e9, state.threshold_ns / 1e9, "slot")
            if state.step is not None:
                attributes[sc.STEP] = state.step
            if state.epoch is not None:
                attributes[sc.EPOCH] = state.epoch
        else:
            attributes = alert_attributes(kind, sc.ALERT_SOURCE_WATCHDOG, self._count)
        attributes[sc.ALERT_PID] = state.pid or self.pid
        if kind == sc.ALERT_KIND_STUCK:
            if stacks is not None:
                attributes[sc.ALERT_STACKS] = stacks
                attributes[sc.ALERT_STACKS_SOURCE] = "py-spy"
            if error is not None:
                attributes[sc.ALERT_STACKS_ERROR] = error
        end_alert_span(self.tracer, alerted, attributes)
        logger.warning("otel_training watchdog: pid %d %s %s", self.pid, kind,
                       f"in {state.name} step {state.step}" if state.open else "")


    def _export_dead_span(self, state: SlotState, now_ns: int) -> None:
        """The span the process died in, which it could never end: rebuilt from the slot, ended ERROR.

        Without it the died alert (and the rank's last step) would point at a parent
        that never reaches the backend.
        """
        if self.span_exporter is None:
            return
        wall_now = time.time_ns()
        attributes: dict[str, Any] = {}
        if state.step is not None:
            attributes[sc.STEP] = state.step
        if state.epoch is not None:
            attributes[sc.EPOCH] = state.epoch
        span = ReadableSpan(
            name=state.name,
            context=SpanContext(state.trace_id, state.span_id, is_remote=False,
                                trace_flags=TraceFlags(TraceFlags.SAMPLED)),
            resource=self.provider.resource,
            attributes=attributes,
            events=[Event(sc.ALERT_KIND_DIED, {sc.ALERT_PID: state.pid or self.pid,
                                               sc.ALERT_SOURCE: sc.ALERT_SOURCE_WATCHDOG}, wall_now)],
            status=Status(StatusCode.ERROR, f"process {state.pid or self.pid} died in this span"),
            start_time=wall_now - (now_ns - state.begin_ns),
            end_time=wall_now,
            instrumentation_scope=InstrumentationScope(sc.INSTRUMENTATION_SCOPE, schema_url=sc.SCHEMA_URL),
        )
        try:
            self.span_exporter.export([span])
        except Exception:
            logger.warning("otel_training watchdog: could not export the span pid %d died in", self.pid,
                           exc_info=True)


def build_parser() -> argparse.ArgumentParser:
    env = os.environ
    parser = argparse.ArgumentParser(prog="python -m otel_training.watchdog",
                                     description="Report a frozen or killed training process (see docs/stuck-detection.md).")
    parser.add_argument("--slot", default=env.get(ENV_SLOT), help=f"slot file (env {ENV_SLOT})")
    parser.add_argument("--pid", type=int, default=env.get(ENV_PID), help=f"training process (env {ENV_PID})")
    parser.add_argument("--resource", default=env.get(ENV_RESOURCE, "{}"),
                        help=f"resource attributes as JSON (env {ENV_RESOURCE})")
    parser.add_argument("--exporter", default=env.get(ENV_EXPORTER, "file"), choices=("file", "otlp", "console", "none"))
    parser.add_argument("--trace-path", default=env.get(ENV_TRACE_PATH), help=f"file exporter path (env {ENV_TRACE_PATH})")
    parser.add_argument("--grace", type=float, default=float(env.get(ENV_GRACE_S, "1.0")),
                        help="seconds past the threshold before speaking for a frozen process")
    parser.add_argument("--poll", type=float, default=float(env.get(ENV_POLL_S, "0.1")), help="slot read interval (s)")
    parser.add_argument("--escalation", type=float, default=float(env[ENV_ESCALATION_S]) if env.get(ENV_ESCALATION_S)
                        else None, help="repeat interval (default: the threshold)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.slot or not args.pid:
        print("otel_training.watchdog: --slot and --pid are required", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    resource = Resource(json.loads(args.resource))
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    # The training process's exporter, rebuilt from its settings (the OTLP variables are inherited).
    exporter = factory.span_exporter(args.exporter, os.environ, args.trace_path)
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))  # one alert, exported at once
    try:
        return Watchdog(SlotReader(args.slot), args.pid, provider, grace_s=args.grace, poll_s=args.poll,
                        escalation_s=args.escalation, span_exporter=exporter).run()
    finally:
        provider.shutdown()
        try:
            os.unlink(args.slot)
        except OSError:
            pass
