"""The time between host steps, watched in the drain when no device timeline watches it (issue 27).

Why: a step span closes at ``optimizer.step()``, so what runs after it and before the next step (a logging
all-reduce, a barrier around a checkpoint, a slow metric) was watched by nothing on the CPU: a rank blocked
there stalls every other rank, which wait in the next collective, and it got no alert of its own. When the
gap after a step grows past the step's stuck threshold while no host work is open (a checkpoint, an
evaluation: ``HOST_WORK``) and the training loop has not ended, this starts a ``training.between_steps``
span backdated to the step's end; the stuck detector alerts it as it alerts a stuck step, with the training
process's stacks and the collective it is in (the responder answers while the training thread is blocked),
and its end (the next step's begin, or host work beginning) is the recovery. With a device timeline in use
the device steps' own watch does this (``device_steps.py``), judging device and host together.

Expected pauses page no more than before: host work spans end the watch (the torch instrumentor marks
checkpoints, and evaluations it sees as fetches without gradients), the end of the training loop (its train
span's end, or ``destroy_process_group``) ends it, and the threshold is the step's, learned where thresholds
are adaptive. Only where stuck detection is on (a threshold set, or adaptive).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.trace import Span as SDKSpan
from opentelemetry.trace import NonRecordingSpan, Span, Tracer, set_span_in_context

from otel_training import semconv as sc
from otel_training.pipeline.device_steps import HOST_WORK, start_time_of


class HostGaps:
    """Host step spans in, a ``training.between_steps`` span out when the time after one grows too long."""

    def __init__(self, tracer: Tracer, threshold_s: Callable[[], float | None],
                 device_watches: Callable[[], bool] = lambda: False) -> None:
        self._tracer = tracer
        self._threshold_s = threshold_s
        #: True once a device timeline watches the time between steps (then this stands aside).
        self._device_watches = device_watches
        self._open: dict[int, Any] = {}  # the epoch of each step span begun and not ended, by span id
        self._last: SDKSpan | None = None  # the step that ended last, when none is open
        self._since_ns = 0  # since when nothing watched has run: the last step's end, or host work's
        self._epoch: Any = None
        self._host_work = 0
        self._training: bool | None = None
        self._gap: Span | None = None
        #: Gaps alerted so far (tests, the drain's log).
        self.gaps = 0

    def host_began(self, span_id: int, span: SDKSpan, epoch: Any) -> None:
        name = span.name
        if name == sc.SPAN_STEP:
            self._open[span_id] = epoch
            self._end_gap(start_time_of(span))
        elif name == sc.SPAN_TRAIN:
            self._training = True
        elif name == sc.SPAN_DISTRIBUTED_DESTROY:  # the teardown: training is over (a zero-code job has no train span)
            self._training = False
            self._end_gap(start_time_of(span))
        elif name in HOST_WORK:
            self._host_work += 1
            self._end_gap(start_time_of(span))  # known work: not a hang

    def host_ended(self, span_id: int, span: SDKSpan, end_ns: int) -> None:
        if span_id in self._open:
            epoch = self._open.pop(span_id)
            if not self._open:
                self._last, self._since_ns, self._epoch = span, end_ns, epoch
        elif span.name == sc.SPAN_TRAIN:
            self._training = False
            self._end_gap(end_ns)
        elif span.name in HOST_WORK:
            self._host_work = max(0, self._host_work - 1)
            if not self._host_work:
                self._since_ns = max(self._since_ns, end_ns)  # the time after host work counts from its end

    def tick(self, now_ns: int) -> None:
        """Start the gap span once nothing watched has run for longer than the step's threshold."""
        if (self._gap is not None or self._open or self._host_work or self._training is False
                or self._last is None or self._device_watches()
                or (self._last.attributes or {}).get(sc.STEP_DEVICE_TIMED)):  # a device timeline watches it
            return
        threshold = self._threshold_s()
        if threshold is None or now_ns - self._since_ns <= threshold * 1e9:
            return
        step = self._last
        step_attributes = step.attributes or {}
        attributes: dict[str, Any] = {
            sc.EVENT_TARGET: step_attributes.get(sc.EVENT_TARGET, sc.TARGET_TRAINER),
            sc.EVENT_NAME: "#between_steps",
        }
        for key in (sc.STEP, sc.EPOCH, sc.THREAD_ID, sc.INSTRUMENTATION_SOURCE):
            if key in step_attributes:
                attributes[key] = step_attributes[key]
        if self._epoch is not None and sc.EPOCH not in attributes:
            attributes[sc.EPOCH] = self._epoch
        parent = step.parent
        context = set_span_in_context(NonRecordingSpan(parent)) if parent is not None else None
        self._gap = self._tracer.start_span(sc.SPAN_BETWEEN_STEPS, context=context, attributes=attributes,
                                            start_time=self._since_ns)
        self.gaps += 1

    def abandon(self, now_ns: int) -> None:
        """The training process closed its pipeline or ended: an open gap ends then."""
        self._end_gap(now_ns)
        self._last = None

    def _end_gap(self, ended_ns: int) -> None:
        if self._gap is not None:
            self._gap.end(end_time=max(ended_ns, start_time_of(self._gap)))
            self._gap = None
