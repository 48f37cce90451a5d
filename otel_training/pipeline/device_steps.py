"""The device spans of an offloaded training process, made in the drain from its device records.

Why here: with the C core, the training process's device resolver is a native thread that writes only
``(DEVICE, token, which, ns)`` records (``device_records.py``); OpenTelemetry stays in Python, in the drain.
This does what ``events/device.py`` does in-process, from the records: a ``training.device_step`` span,
child of the host step whose id is the token, started backdated to the device's begin as soon as it is known
(so the stuck detector watches the device work while it runs) and ended at the device's end; and a
``training.between_steps`` span when neither the host nor the device has been in a step for longer than the
step's stuck threshold while no host work (a checkpoint, an evaluation) is open. The attributes are built by
the functions ``events/device.py`` uses too (``device_step_attributes``, ``between_steps_attributes``).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from typing import Any, cast

from opentelemetry.sdk.trace import Span as SDKSpan
from opentelemetry.trace import NonRecordingSpan, Span, Status, StatusCode, Tracer, set_span_in_context

from otel_training import semconv as sc
from otel_training.pipeline.records import DEVICE_BEGIN, DEVICE_END

logger = logging.getLogger("otel_training")

#: Host work between steps: while one of these is open the time between steps is no hang; the train span's
#: end ends the watch (``events/span_kinds.HostWork``, whose spans these are).
HOST_WORK = frozenset({sc.SPAN_INIT, sc.SPAN_LOAD_DATASET, sc.SPAN_LOAD_CHECKPOINT, sc.SPAN_SAVE_CHECKPOINT,
                       sc.SPAN_PERSIST_CHECKPOINT, sc.SPAN_EVALUATE, sc.SPAN_PREDICT})
#: Host step attributes copied onto its device step: the per-second rates use the device time.
RATE_KEYS = (sc.TOKENS, sc.SAMPLES, sc.BATCH_SIZE)


def device_step_attributes(host_attributes: Any, label: str, name: str, thread_id: int | None, epoch: Any,
                           idle_before_s: float | None, last_step: Any) -> dict[str, Any]:
    """A ``training.device_step`` span's attributes, from its host step's."""
    host_attributes = host_attributes or {}
    attributes: dict[str, Any] = {
        sc.EVENT_TARGET: host_attributes.get(sc.EVENT_TARGET, sc.TARGET_TRAINER),
        sc.EVENT_NAME: "#device_step",
        sc.DEVICE: label,
        sc.DEVICE_NAME: name,
        sc.STEP_LAUNCHED: False,
    }
    if thread_id is not None:
        attributes[sc.THREAD_ID] = thread_id
    for key in (sc.STEP, sc.INSTRUMENTATION_SOURCE):
        if key in host_attributes:
            attributes[key] = host_attributes[key]
    if epoch is not None:
        attributes[sc.EPOCH] = epoch
    if idle_before_s is not None:
        attributes[sc.DEVICE_IDLE_BEFORE_S] = idle_before_s
    if last_step is not None:
        attributes[sc.DEVICE_LAST_COMPLETED_STEP] = last_step
    return attributes


def between_steps_attributes(host_attributes: Any, label: str, thread_id: int | None, step_before: Any,
                             last_step: Any, epoch: Any) -> dict[str, Any]:
    """A ``training.between_steps`` span's attributes."""
    host_attributes = host_attributes or {}
    attributes: dict[str, Any] = {
        sc.EVENT_TARGET: host_attributes.get(sc.EVENT_TARGET, sc.TARGET_TRAINER),
        sc.EVENT_NAME: "#between_steps",
        sc.DEVICE: label,
    }
    if thread_id is not None:
        attributes[sc.THREAD_ID] = thread_id
    if step_before is not None:
        attributes[sc.STEP] = step_before
    if last_step is not None:
        attributes[sc.DEVICE_LAST_COMPLETED_STEP] = last_step
    if epoch is not None:
        attributes[sc.EPOCH] = epoch
    return attributes


def start_time_of(span: Any) -> int:
    """A span's start time in ns (0 for one without: a non-recording span)."""
    return getattr(span, "start_time", None) or 0


class _Step:
    __slots__ = ("host", "epoch", "span", "host_end_ns", "begun_ns")

    def __init__(self, host: SDKSpan, epoch: Any) -> None:
        self.host = host
        self.epoch = epoch
        self.span: SDKSpan | None = None
        self.host_end_ns = 0
        self.begun_ns: int | None = None


class DeviceSteps:
    """Device records in, device spans out, in the drain (one per drain: one device per training process)."""

    def __init__(self, tracer: Tracer, threshold_s: Callable[[], float | None]) -> None:
        self._tracer = tracer
        self._threshold_s = threshold_s
        self.label = "cuda"
        self.name = ""
        self.active = False  # a device info record came: the training process resolves markers natively
        self._steps: collections.OrderedDict[int, _Step] = collections.OrderedDict()  # host span id -> step
        self._newest: _Step | None = None
        self._last_end_ns: int | None = None
        self._last_step: Any = None
        self._gap: Span | None = None
        self._host_work = 0
        self._host_work_end_ns = 0  # when the last host work ended: the time between steps counts from there too
        self._training: bool | None = None
        self.failed = False
        self.resolved = 0
        #: Called with each device span and its end before it ends (the GPU state's step join, ``plugins.py``).
        self.on_end: Callable[[SDKSpan, int], None] | None = None

    def info(self, label: str, name: str) -> None:
        self.label, self.name, self.active = label, name, True

    # -- the host's spans, as the replayer starts and ends them ----------------------------------------
    def host_began(self, span_id: int, span: SDKSpan, epoch: Any) -> None:
        name = span.name
        if name == sc.SPAN_STEP and self.active:
            if (span.attributes or {}).get(sc.STEP_DEVICE_TIMED) and not self.failed:
                self._end_gap(start_time_of(span))  # the next step began: the host is back in a step
                self._steps[span_id] = self._newest = _Step(span, epoch)
            elif not self.failed:  # the training process stopped timing on the device: what waits never comes
                self.failed = True
                self.abandon("the device timeline stopped before this step completed on the device",
                             start_time_of(span))
        elif name == sc.SPAN_TRAIN:
            self._training = True
        elif name in HOST_WORK:
            self._host_work += 1

    def host_ended(self, span_id: int, span: SDKSpan, end_ns: int) -> None:
        step = self._steps.get(span_id)
        if step is not None:
            step.host_end_ns = end_ns
            if step.span is not None:
                step.span.set_attribute(sc.STEP_LAUNCHED, True)
        elif span.name == sc.SPAN_TRAIN:
            self._training = False
        elif span.name in HOST_WORK:
            self._host_work = max(0, self._host_work - 1)
            if not self._host_work:
                self._host_work_end_ns = max(self._host_work_end_ns, end_ns)

    # -- the device records --------------------------------------------------------------------------
    def device(self, token: int, which: int, ns: int) -> None:
        if which not in (DEVICE_BEGIN, DEVICE_END):
            self._fail()
            return
        step = self._steps.get(token)
        if step is None:
            return  # its host span's begin was dropped (counted by the writer), or the timeline failed
        if which == DEVICE_BEGIN:
            step.begun_ns = ns
            if next(iter(self._steps)) == token:
                self._start(step)
            return
        # The device runs steps in order: one begun before this one whose end never came lost its record (a
        # full ring). It can end no later than this one did; said so rather than left open for good.
        while True:
            oldest_token, oldest = next(iter(self._steps.items()))
            if oldest_token == token:
                break
            del self._steps[oldest_token]
            if oldest.span is not None:
                oldest.span.set_status(Status(StatusCode.ERROR, "this step's device end was not recorded (its "
                                              "record did not fit in the offload ring)"))
                oldest.span.end(end_time=max(step.begun_ns or ns, start_time_of(oldest.span)))
        if step.span is None:
            if step.begun_ns is None:
                step.begun_ns = ns
            self._start(step)
        self._finish(token, step, ns)
        # Device steps run in order: the next one's begin may have come already.
        for following in self._steps.values():
            if following.span is None and following.begun_ns is not None:
                self._start(following)
            break

    def _start(self, step: _Step) -> None:
        host = step.host
        self._end_gap(start_time_of(host))
        # The device cannot start a step before the host launched it, nor before its previous step ended.
        begun = max(step.begun_ns or 0, start_time_of(host), self._last_end_ns or 0)
        host_attributes = host.attributes or {}
        idle = (begun - self._last_end_ns) / 1e9 if self._last_end_ns is not None else None
        attributes = device_step_attributes(host_attributes, self.label, self.name,
                                            cast("int | None", host_attributes.get(sc.THREAD_ID)), step.epoch, idle,
                                            self._last_step)
        attributes[sc.STEP_LAUNCHED] = bool(step.host_end_ns)
        step.span = self._tracer.start_span(sc.SPAN_DEVICE_STEP, context=set_span_in_context(host),  # type: ignore[assignment]  # the drain's tracer is the SDK's: an SDK span
                                            attributes=attributes, start_time=begun)

    def _finish(self, token: int, step: _Step, ended_ns: int) -> None:
        span = step.span
        assert span is not None
        ended_ns = max(ended_ns, start_time_of(span))
        host_attributes = step.host.attributes or {}
        span.set_attribute(sc.STEP_LAUNCHED, True)
        span.set_attributes({key: host_attributes[key] for key in RATE_KEYS if key in host_attributes})
        if self.on_end is not None:
            self.on_end(span, ended_ns)
        span.end(end_time=ended_ns)
        self._steps.pop(token, None)
        self._last_end_ns = ended_ns
        self._last_step = host_attributes.get(sc.STEP, self._last_step)
        self.resolved += 1

    # -- the time between steps --------------------------------------------------------------------------
    def tick(self, now_ns: int) -> None:
        """Nothing in a step on the device for longer than the step threshold, with no device step open."""
        if not self.active or self.failed or self._gap is not None or self._host_work > 0 or self._training is False:
            return
        steps = self._steps
        about: _Step | None  # narrowed to _Step by each branch
        if steps:
            about = next(iter(steps.values()))
            if about.span is not None:
                return  # a device step is open, and watched itself
            # From when the host launched it, too: its begin record may just not have come yet.
            since = max(self._last_end_ns or 0, start_time_of(about.host))
            step_before = self._last_step
        else:
            about = self._newest
            if about is None or not about.host_end_ns:
                return
            since = max(about.host_end_ns, self._last_end_ns or 0)
            step_before = (about.host.attributes or {}).get(sc.STEP)
        since = max(since, self._host_work_end_ns)  # or the host work since, which was no gap
        threshold = self._threshold_s()
        if threshold is None or now_ns - since <= threshold * 1e9:
            return
        host = about.host
        host_attributes = host.attributes or {}
        attributes = between_steps_attributes(host_attributes, self.label,
                                              cast("int | None", host_attributes.get(sc.THREAD_ID)), step_before,
                                              self._last_step, about.epoch)
        parent = host.parent
        context = set_span_in_context(NonRecordingSpan(parent)) if parent is not None else None
        self._gap = self._tracer.start_span(sc.SPAN_BETWEEN_STEPS, context=context, attributes=attributes,
                                            start_time=since)

    def _end_gap(self, ended_ns: int) -> None:
        if self._gap is not None:
            self._gap.end(end_time=max(ended_ns, start_time_of(self._gap)))
            self._gap = None

    # -- the end -------------------------------------------------------------------------------------------
    def _fail(self) -> None:
        logger.warning("otel_training: the device resolver failed (a CUDA error); steps are timed on the host "
                       "from now on")
        self.failed = True
        self.abandon("the device timeline failed before this step completed on the device")

    def abandon(self, reason: str, now_ns: int | None = None) -> None:
        """End what is open: a device span that never saw its end says so, rather than vanishing."""
        import time

        now = time.time_ns() if now_ns is None else now_ns
        for step in self._steps.values():
            if step.span is not None and step.span.end_time is None:
                step.span.set_status(Status(StatusCode.ERROR, reason))
                step.span.end(end_time=max(now, start_time_of(step.span)))
        self._steps.clear()
        self._end_gap(now)
