"""The device timeline: a step's time as the accelerator spent it, not as the host launched it.

CUDA work is asynchronous. The host launches a step's kernels and runs ahead,
then blocks wherever it synchronises (a pinned-memory copy in the DataLoader,
``loss.item()`` after the optimizer step, a full launch queue), so a host span
measures launch time and the device's work lands in the wrong span or in none.

Where a step runs device work, the step records a device event (a marker) on
the current stream when it begins and when it ends, at a cost of a few
microseconds and never a synchronisation. A resolver thread polls the oldest
marker (markers on one stream complete in order) and turns completed ones into
wall-clock timestamps. From them it emits the step's device execution as a
``training.device_step`` span, child of the host ``training.step``:

* started, backdated to the device start, as soon as the begin marker
  completes, so the stuck detector watches the device work while it runs: a
  stalled kernel, a hung collective or a dead GPU is alerted for *that* step,
  whatever the host is doing (blocked in ``.item()``, launching ahead into later
  steps, idle). Only one device step is open at a time, since the device runs
  them in order;
* ended at the end marker's completion (the stuck detector then says
  ``recovered`` if it had alerted).

The host step keeps its launch time and says ``training.step.device_timed``:
statistics, goodput and the stuck detector then use the device span.

The resolver also watches the host between steps: with no device work pending,
a host outside any step for longer than the step's stuck threshold gets a
``training.between_steps`` span (backdated to the end of the last step), which
the stuck detector alerts on and which ends when the next step begins.

The device sits behind ``Device``, a small interface (a label and name,
``record``, ``completed_ns``, ``release``), so the logic is tested on CPU with a
fake asynchronous device; ``otel_training.events.cuda`` is the real one. Nothing here runs when no device is in use.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import trace as trace_api
from opentelemetry.trace import NonRecordingSpan, Span, Status, StatusCode

from otel_training import semconv as sc
from otel_training._contain import log_once
from otel_training._fork import reset_in_child
from otel_training.pipeline.device_steps import (
    RATE_KEYS,
    between_steps_attributes,
    device_step_attributes,
    start_time_of,
)

if TYPE_CHECKING:
    from otel_training.events.runtime import EventsRuntime

#: How often the resolver looks at the oldest marker while device work is pending. Timestamps come
#: from the device's own clock, so this bounds only how late a device step is seen to start or end.
POLL_S = 0.005
#: How often it looks when nothing is pending (a new step, the host-gap watch).
IDLE_POLL_S = 0.02


class Device(Protocol):
    """One accelerator stream, as the timeline needs it."""

    #: The device as torch names it ("cuda:0"), and its model name.
    label: str
    name: str

    def record(self) -> Any | None:
        """On the training thread: enqueue a marker on the current stream, without synchronising.

        None records nothing (a CUDA graph is being captured, another device is current).
        """

    def completed_ns(self, marker: Any) -> int | None:
        """On the resolver thread: the wall-clock ns at which ``marker`` completed, None while pending."""

    def release(self, marker: Any) -> None:
        """The marker is resolved and may be reused."""


class _Step:
    """One step's markers and its device span, from the host's begin to the device's end."""

    __slots__ = ("host", "begin", "end", "ready_ns", "host_end_ns", "thread_id", "epoch", "span", "launched")

    def __init__(self, begin: Any, thread_id: int, epoch: Any) -> None:
        self.host: Any = None  # the host step span (set right after it starts)
        self.begin = begin  # None while the step awaits its input (``input_ready``)
        self.end: Any = None
        self.ready_ns = 0
        self.host_end_ns = 0
        self.thread_id = thread_id
        self.epoch = epoch
        self.span: Span | None = None
        self.launched = False


#: A marker that could not be recorded (a capture began inside the step): the host's time stands in.
_UNRECORDED = object()


class DeviceTimeline:
    """Markers in, device spans out; one per pipeline and device."""

    def __init__(self, device: Device, runtime: EventsRuntime, *, poll_s: float | None = None,
                 idle_poll_s: float | None = None) -> None:
        self.device = device
        self._runtime = runtime
        self._tracer = runtime.tracer
        self._poll_s = POLL_S if poll_s is None else poll_s
        self._idle_poll_s = IDLE_POLL_S if idle_poll_s is None else idle_poll_s
        # Training thread -> resolver: deque appends and pops are thread-safe.
        self._pending: collections.deque[_Step] = collections.deque()
        self._newest: _Step | None = None
        self._last_end_ns: int | None = None
        self._last_step: Any = None
        self._gap: Span | None = None
        self.failed = False
        self.resolved = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otel-training-device", daemon=True)
        self._thread.start()
        reset_in_child(self, DeviceTimeline._forked)
        runtime.telemetry.on_shutdown(self.close)

    # -- the training thread: one marker record, a deque append ---------------
    def begin_step(self, epoch: Any, awaiting_input: bool = False) -> _Step | None:
        """Record the step's begin marker; None when nothing was recorded (host timing for this step).

        ``awaiting_input``: the step opens with a fetch of its batch, and its device work can
        start only once the batch is in; the marker is recorded by ``input_ready``, so a device
        idle while the host waits for data is data loading, not device time.
        """
        if self.failed:
            return None
        if awaiting_input:
            return _Step(None, threading.get_ident(), epoch)
        marker = self.device.record()
        if marker is None:
            return None
        return _Step(marker, threading.get_ident(), epoch)

    def started(self, step: _Step, host_span: Any) -> None:
        step.host = host_span
        if self.failed:  # failed since begin_step: this step is timed on the host after all
            host_span.set_attribute(sc.STEP_DEVICE_TIMED, False)
            return
        self._pending.append(step)
        self._newest = step

    def input_ready(self, step: _Step) -> None:
        if step.begin is None:
            step.ready_ns = time.time_ns()
            marker = None if self.failed else self.device.record()
            step.begin = _UNRECORDED if marker is None else marker

    def end_step(self, step: _Step) -> None:
        if step.begin is None:
            self.input_ready(step)
        step.host_end_ns = time.time_ns()
        marker = None if self.failed else self.device.record()
        step.end = _UNRECORDED if marker is None else marker

    # -- the resolver thread ----------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                progressed = self.poll()
            except Exception:  # noqa: BLE001 - a broken device must not leave steps half-timed forever
                self._fail("the device timeline failed; steps are timed on the host from now on")
                return
            if not progressed:
                self._stop.wait(self._poll_s if self._pending else self._idle_poll_s)

    def poll(self, now_ns: int | None = None) -> bool:
        """Resolve what has completed, oldest first; True if anything moved."""
        progressed = False
        pending = self._pending
        while pending:
            step = pending[0]
            if step.span is None:
                if step.begin is None:
                    break  # the host still waits for the step's input
                if step.begin is _UNRECORDED:
                    begun: int | None = max(step.ready_ns, self._last_end_ns or 0)
                else:
                    begun = self.device.completed_ns(step.begin)
                if begun is None:
                    break
                self._start(step, begun)
                progressed = True
            end = step.end
            if end is None:
                break  # the host is still inside the step
            if not step.launched:
                step.launched = True
                step.span.set_attribute(sc.STEP_LAUNCHED, True)  # type: ignore[union-attr]  # not None: _start() set it, on this poll or an earlier one
            ended: int | None  # declared apart: the assignment below narrows it to int
            if end is _UNRECORDED:
                ended = max(step.host_end_ns, start_time_of(step.span))
            else:
                ended = self.device.completed_ns(end)
                if ended is None:
                    break
            self._finish(step, ended)
            pending.popleft()
            progressed = True
        self._watch_gap(time.time_ns() if now_ns is None else now_ns)
        return progressed

    def _start(self, step: _Step, begun_ns: int) -> None:
        host = step.host
        self._end_gap(start_time_of(host))  # the next step began: the host is back in a step
        # The device cannot start a step before the host launched it, nor before its previous step
        # ended; clamping keeps a calibration error of microseconds from reordering them.
        begun_ns = max(begun_ns, start_time_of(host), self._last_end_ns or 0)
        idle = (begun_ns - self._last_end_ns) / 1e9 if self._last_end_ns is not None else None
        attributes = device_step_attributes(host.attributes, self.device.label, self.device.name, step.thread_id,
                                            step.epoch, idle, self._last_step)
        context = trace_api.set_span_in_context(host)
        # Its trace was charged for it on the training thread (StepDuration).
        step.span = self._tracer.start_span(sc.SPAN_DEVICE_STEP, context=context, attributes=attributes,
                                            start_time=begun_ns)

    def _finish(self, step: _Step, ended_ns: int) -> None:
        span = step.span
        assert span is not None
        ended_ns = max(ended_ns, start_time_of(span))
        host_attributes = step.host.attributes or {}
        # What the step processed, for the per-second rates of the step time that is now this one.
        span.set_attributes({key: host_attributes[key] for key in RATE_KEYS if key in host_attributes})
        span.end(end_time=ended_ns)
        for marker in (step.begin, step.end):
            if marker is not _UNRECORDED:
                self.device.release(marker)
        self._last_end_ns = ended_ns
        self._last_step = host_attributes.get(sc.STEP, self._last_step)
        self.resolved += 1

    def _watch_gap(self, now_ns: int) -> None:
        """Nothing in a step on the device for longer than the step threshold, with no device step open.

        Either the host is outside any step with no device work pending (logging to a hung
        filesystem, an unhooked evaluation), or the device has not begun the next step because it
        is still busy with work queued outside the steps (a hung kernel of an evaluation).
        """
        rt = self._runtime
        if self._gap is not None or rt.host_work > 0 or rt.training is False:
            return  # a checkpoint save or evaluation is no gap, nor is the teardown after training
        pending = self._pending
        about: _Step | None  # declared apart: the assignment below narrows it to _Step
        if pending:
            about = pending[0]
            if about.span is not None:
                return  # a device step is open, and watched itself
            since = self._last_end_ns or start_time_of(about.host)
            step_before = self._last_step
        else:
            about = self._newest
            if about is None or about.end is None:
                return
            since = max(about.host_end_ns, self._last_end_ns or 0)  # from when both the host and the device were done
            step_before = (about.host.attributes or {}).get(sc.STEP)
        since = max(since, rt.host_work_ended_ns)  # or the host work since, which was no gap
        threshold = self._step_threshold_s()
        if threshold is None or now_ns - since <= threshold * 1e9:
            return
        host = about.host
        attributes = between_steps_attributes(host.attributes, self.device.label, about.thread_id, step_before,
                                              self._last_step, about.epoch)
        parent = host.parent
        context = trace_api.set_span_in_context(NonRecordingSpan(parent)) if parent is not None else None
        self._gap = self._tracer.start_span(sc.SPAN_BETWEEN_STEPS, context=context, attributes=attributes,
                                            start_time=since)

    def _end_gap(self, ended_ns: int) -> None:
        if self._gap is not None:
            self._gap.end(end_time=max(ended_ns, start_time_of(self._gap)))
            self._gap = None

    def _step_threshold_s(self) -> float | None:
        return self._runtime.telemetry.stuck_threshold_s(sc.SPAN_DEVICE_STEP)

    # -- lifecycle ----------------------------------------------------------------
    def close(self, timeout_s: float | None = None) -> None:
        """Resolve what the device finishes in time; a step still running is ended as such.

        Bounded by a quarter of ``exit_timeout_s`` (the rest is for exporting): a healthy loop
        has only the few steps the host ran ahead of the device left at exit.
        """
        if timeout_s is None:
            timeout_s = self._runtime.telemetry.shutdown_share_s(0.25)
        deadline = time.monotonic() + timeout_s
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            return  # the resolver is inside a device call: one poller only, and do not wait for it
        try:
            while self._pending and not self.failed and time.monotonic() < deadline:
                if not self.poll():
                    time.sleep(self._poll_s)
        except Exception:  # noqa: BLE001 - a broken device at shutdown: its open steps are ended as failed, exit goes on
            self._fail("the device timeline failed at shutdown")
        self._abandon("the device work of this step had not completed at shutdown")

    def _fail(self, message: str) -> None:
        self.failed = True
        log_once("device-timeline", "otel_training: %s", message)
        self._abandon("the device timeline failed before this step completed on the device")

    def _abandon(self, reason: str) -> None:
        """End what is open: a device span that never saw its end says so, rather than vanishing."""
        now = time.time_ns()
        while self._pending:
            step = self._pending.popleft()
            if step.span is not None:
                step.span.set_status(Status(StatusCode.ERROR, reason))
                step.span.end(end_time=max(now, start_time_of(step.span)))
        self._end_gap(now)

    def _forked(self) -> None:
        """A forked child has neither the resolver thread nor a usable device."""
        self.failed = True
        self._pending.clear()
        self._gap = None


# -- finding the device ---------------------------------------------------------------
