"""One ``training.step`` span per training iteration of an unmodified PyTorch loop.

``optimizer.step()`` is a few milliseconds of a step that is mostly data fetch, forward and backward, so the span
cannot be the optimizer call. It opens when the iteration begins (the first ``DataLoader`` fetch, forward pass of a
module in training mode, or backward pass after the previous step ended) and closes at the iteration's last
optimizer step, seen through torch's global optimizer hooks, which every optimizer subclass calls.

Gradient accumulation (backward passes counted, ``training.substep`` children from two on), several optimizers
stepping in one iteration (the step closes at the last one seen in a complete iteration) and AMP's ``GradScaler``
skipping ``optimizer.step()`` (``training.step.skipped``) are handled as docs/auto-instrumentation.md describes.

The step span is begun detached: it nests under the user's current span (epoch, train) and the data-wait spans nest
under it, but it never becomes the current span of the user's code, so a step closed at an odd moment cannot leave
the user's context in a wrong state. Work nested in it (a checkpoint, a collective) runs in a private copy of the
context where the step is current (``nested_work.py``), made the first time a step needs one.

Only one thread drives steps: the first thread that begins one. Every entry point here is contained: an internal
error is logged once, never raised into the training loop.

A tracker given a ``claim`` callable starts *dormant* (``dormancy.py``).
"""

from __future__ import annotations

import contextvars
import threading
import time
from typing import TYPE_CHECKING, Any

import torch
from opentelemetry.trace import TracerProvider

from otel_training import semconv as sc
from otel_training._contain import contain, contained
from otel_training._sdk_compat import instrumentation_check
from otel_training.events.past_spans import record_span
from otel_training.events.predefined import TrainerProcess
from otel_training.events.runtime import EventsRuntime
from otel_training.events.span_kinds import StepDuration, new_step
from otel_training.integrations.torch.dormancy import Claim, Dormancy
from otel_training.integrations.torch.loader_length import LoaderLengths
from otel_training.integrations.torch.loop_spans import LoopSpans
from otel_training.integrations.torch.nested_work import NestedWork

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

    from otel_training.integrations.torch.collectives import CollectiveTracker
    from otel_training.pipeline.telemetry import Telemetry

SOURCE = "torch"
#: Waits for a batch shorter than this add to the step's ``training.step.data_wait_s`` but get no span of their own:
#: a prefetching DataLoader answers in microseconds, and a span per fetch would cost more than the wait.
DATA_WAIT_SPAN_MIN_NS = 1_000_000

#: Whether the current context allows recording (not inside ``suppress_instrumentation()``).
instrumentation_enabled = instrumentation_check()
#: ``torch.is_grad_enabled``, looked up once: torch has a module ``__getattr__``, so the interpreter (3.11) does
#: not specialise ``torch.<name>`` reads, each a generic lookup on every step.
grad_enabled = torch.is_grad_enabled


class StepTracker(Dormancy, NestedWork):
    """The step state machine; the instrumentor feeds it hook calls."""

    def __init__(self, claim: Claim | None = None, tracer_provider: TracerProvider | None = None) -> None:
        super().__init__(claim)
        self.trainer = TrainerProcess(tracer_provider=tracer_provider)
        #: Set by framework callbacks that emit their own step spans.
        self.suspended = False
        #: ``optimizer.step()`` calls in any thread (tells a GradScaler skip apart).
        self.optimizer_calls = 0
        self._owner: int | None = None
        self._number = 0
        self._step: StepDuration | None = None
        self._ctx: contextvars.Context | None = None
        self._expected: frozenset[int] | None = None
        self._just_closed = False
        self._forward_handle: RemovableHandle | None = None
        self._telemetry: Telemetry | None = None
        #: The steps' runtime, looked up once, not every step, until its pipeline closes (``_pipeline_closing``).
        self._rt: EventsRuntime | None = None
        self._awaiting_input = False
        self._nested: dict[int, int] = {}  # optimizer id -> step() calls in progress
        #: Whether a DataLoader iterator has nothing left (``loader_length.py``).
        self._lengths = LoaderLengths()
        #: The optimizer and fetch hooks' suppression check and data-wait threshold: the C core reads them too.
        self._enabled = instrumentation_enabled
        self._wait_span_min_ns = DATA_WAIT_SPAN_MIN_NS
        #: The counts a step's end sets, the step number's attribute and torch's gradient check, read by ``_close``,
        #: ``_open`` and ``fetch_begin`` from one place, in Python and in the C core.
        self._end_keys = (sc.STEP_SUBSTEPS, sc.STEP_OPTIMIZER_STEPS, sc.STEP_SKIPPED, sc.STEP_DATA_WAIT_S)
        self._step_key = sc.STEP
        self._grad_enabled = grad_enabled
        #: The process groups' collectives (``collectives.CollectiveTracker``), once a group exists.
        self.collectives: CollectiveTracker | None = None
        #: The run's own training.train, epoch and evaluation spans, which the steps nest in (``loop_spans.py``).
        self.loop = LoopSpans(self.trainer)
        self._reset()

    def _reset(self) -> None:
        self._start_ns = 0
        self._backward_ends: list[int] = []
        self._stepped: set[int] = set()
        self._optimizer_steps = 0
        self._fetched = False
        self._complete = False
        self._wait_ns = 0

    def _records_here(self) -> bool:
        return instrumentation_enabled() and self._here()

    def _here(self) -> bool:
        """``_records_here`` after the caller's ``instrumentation_enabled()`` check (the wrapped fetch and backward):
        each check and frame costs about a microsecond in a real loop, where torch evicted our code from caches."""
        if self.suspended or (self.dormant and self._still_dormant()):
            return False
        ident = threading.get_ident()
        if self._owner is None:
            self._owner = ident
        return ident == self._owner

    def _contained(self, hook: str) -> contain:
        """A hook's containment: its internal error is logged once, never raised into the loop."""
        return contain(f"{__name__}.StepTracker.{hook}", "otel_training: internal error in %s; training continues",
                       f"StepTracker.{hook}")

    def _failed(self, hook: str) -> None:
        """``_contained(hook)`` from the hooks' inline handlers (a wrapper would be a frame more, six a step)."""
        self._contained(hook).failed()

    def _open(self, awaiting_input: bool = False, rt: EventsRuntime | None = None) -> None:
        """``awaiting_input``: opened by the fetch of its batch, so its device time starts at ``fetch_end``;
        ``rt``: the runtime, when the caller has just begun training work (``_training``)."""
        if self.loop.evaluation is not None:
            self.loop.end_evaluation()
        if self._forward_handle is not None:
            self.disarm_forward()
        self._just_closed = False
        if rt is None:
            rt = self._training()
        step = self._make_step(self._step_key, self._number)
        parent = self.loop.parent
        if parent is None:
            step.begin_detached(awaiting_input, rt)
        else:  # in the loop's context, where its epoch (or train) span is current: begun under it directly
            step.begin_detached(awaiting_input, rt, True, parent)
        self._start_ns = time.time_ns()
        self._step, self._ctx = step, None  # its context: made when work nests in it (_begin_in_step)
        self._awaiting_input = awaiting_input

    def _make_step(self, key: str, number: int) -> StepDuration:
        """Step ``number`` (attribute ``key``), not begun; the C core copies the first one made, not ``__init__``."""
        return new_step(self.trainer, sc.SPAN_STEP, "#step",  # valid attributes: no conversion
                        {key: number, sc.INSTRUMENTATION_SOURCE: SOURCE})

    def _training(self) -> EventsRuntime:
        """Training work: the run's ``training.train`` begins once, and everything ends when the pipeline closes."""
        rt = self._rt
        if rt is None:
            rt = self.trainer.events_runtime()
            if rt.telemetry is not self._telemetry:
                self._telemetry = rt.telemetry
                rt.telemetry.on_shutdown(self._pipeline_closing)
                rt.telemetry.on_failure(self._interrupted)
            if not rt.telemetry.is_shut_down:  # a closed pipeline's runtime is asked again next time
                self._rt = rt
        self.loop.training()
        return rt

    def close(self) -> None:
        """End the open step (on shutdown, uninstrument and suspend: not a step's own end, ``_close``)."""
        with self._contained("close"):
            self._close()

    def _close(self) -> None:
        step = self._step
        if step is None:
            return
        self._step = self._ctx = None
        if self._complete and self._expected is None:
            self._expected = frozenset(self._stepped)
        substeps = len(self._backward_ends)
        if self.collectives is not None:
            step.extra_args(**self.collectives.step_attributes())
        if substeps >= 2:
            start = self._start_ns
            for index, end in enumerate(self._backward_ends):
                record_span(sc.SPAN_SUBSTEP, "#substep", start, end,
                            {sc.SUBSTEP: index, sc.STEP: self._number}, parent=step.span,
                            events=self.trainer.events_runtime())
                start = end
        substeps_key, optimizer_steps_key, skipped_key, data_wait_key = self._end_keys
        step.end({  # the step's counts, set as it ends
            substeps_key: substeps,
            optimizer_steps_key: self._optimizer_steps,
            skipped_key: self._optimizer_steps == 0,
            data_wait_key: self._wait_ns / 1e9,
        })
        self._number += 1
        fetched = self._fetched
        self._reset()
        self._just_closed = True
        if not fetched:  # a DataLoader-driven loop's next fetch opens the next step
            self.arm_forward()

    def _boundary(self, fetch: bool) -> None:
        """A new iteration may begin here: close a step waiting for its boundary."""
        if self._step is not None and self._complete and (fetch or not self._fetched):
            self._close()

    # -- the forward pre-hook, armed while no step is open; by the instrumentor too, and the C core ------------
    def _claimed(self) -> None:
        self.arm_forward()

    @property
    def number(self) -> int:
        """Steps ended so far, the open (or next) step's number: the collectives name their step by it."""
        return self._number

    def arm_forward(self) -> None:
        """Watch module forwards for the next step's start (no-op while suspended, dormant or armed)."""
        if self._forward_handle is None and not self.suspended and not self.dormant:
            self._forward_handle = torch.nn.modules.module.register_module_forward_pre_hook(self._on_forward)

    def disarm_forward(self) -> None:
        handle, self._forward_handle = self._forward_handle, None
        if handle is not None:
            handle.remove()

    @contained(default=None)
    def _on_forward(self, module: Any, args: Any) -> None:
        if not (module.training and grad_enabled()) or not self._records_here():
            return
        if self._step is not None:
            if self._fetched:  # a DataLoader drives the loop: forward is no boundary
                self.disarm_forward()
                return
            self._boundary(fetch=False)
        if self._step is None:
            self._open()

    def fetch_begin(self, iterator: Any) -> int | None:
        """Before ``DataLoader`` hands out a batch (its wrapper checked suppression): the wait's wall-clock start."""
        try:
            if self.dormant and self._still_dormant():
                return None
            exhausted = self._lengths.exhausted(iterator)
            here = not self.suspended  # _here(), inline (not dormant: checked above)
            if here:
                ident = threading.get_ident()
                if self._owner is None:
                    self._owner = ident
                here = ident == self._owner
            if here:
                step = self._step
                if step is not None and self._complete:  # the boundary a completed step waited for
                    self._close()
                    step = None
                if step is None and not exhausted:
                    if self._grad_enabled():
                        loop = self.loop
                        rt = self._rt if self._rt is not None and loop.started else self._training()
                        epoch_of = loop.epoch_iterator
                        if epoch_of is None or epoch_of() is not iterator:  # fetched()'s own check, inline
                            loop.fetched(iterator)
                        self._open(True, rt)
                    elif self._number:  # batches without gradients after training began: an evaluation
                        self.loop.begin_evaluation()
                self._fetched = self._step is not None
            return None if exhausted else time.time_ns()  # a fetch that only raises StopIteration is no wait
        except Exception:  # noqa: BLE001 - inside the user's DataLoader fetch: _failed logs it, never raised into the loop
            self._failed("fetch_begin")
            return None

    def fetch_end(self, started: int | None, error: BaseException | None = None) -> None:
        """Account the wait to the step; a span only when it blocked (or failed)."""
        if started is None:
            return
        try:
            ended = time.time_ns()
            step = self._step if threading.get_ident() == self._owner else None
            if step is not None:
                self._wait_ns += ended - started
                if self._awaiting_input:  # the batch is in: the step's device work may begin
                    self._awaiting_input = False
                    if step.device_step is not None:
                        step.input_ready()
            if ended - started >= self._wait_span_min_ns or (error is not None
                                                             and not isinstance(error, StopIteration)):
                self._wait_span(started, ended, step, error)
        except Exception:  # noqa: BLE001 - inside the user's DataLoader fetch: _failed logs it, never raised into the loop
            self._failed("fetch_end")

    def _wait_span(self, started: int, ended: int, step: StepDuration | None,
                   error: BaseException | None = None) -> None:
        """A wait long enough for its own ``training.data_wait`` span (or one that failed), in the open step."""
        record_span(sc.SPAN_DATA_WAIT, "#data_wait", started, ended, {sc.INSTRUMENTATION_SOURCE: SOURCE},
                    parent=step.span if step is not None else self.loop.span, error=error,
                    events=self.trainer.events_runtime())

    def backward_begin(self) -> None:
        """Before ``torch.autograd.backward`` (its wrapper checked suppression)."""
        try:
            if self._claim is not None:
                self.claim_if_dormant()
            step = self._step
            # _here(), inline for the usual case: a step is open only while the tracker records
            if step is None or threading.get_ident() != self._owner:
                if not self._here():
                    return
            if step is not None and self._complete and not self._fetched:  # _boundary(fetch=False), inline
                self._close()
                step = None
            if step is None:
                self._open()
        except Exception:  # noqa: BLE001 - inside the user's backward(): _failed logs it, never raised into the loop
            self._failed("backward_begin")

    def backward_end(self) -> None:
        try:
            # A step is open only while the tracker records (never dormant or suspended): the thread decides.
            if self._step is not None and threading.get_ident() == self._owner:
                self._backward_ends.append(time.time_ns())
        except Exception:  # noqa: BLE001 - inside the user's backward(): _failed logs it, never raised into the loop
            self._failed("backward_end")

    def optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            self.optimizer_calls += 1
            # a subclass's step() calling super().step() runs torch's hooks twice, nested: the outermost counts
            key = id(optimizer)
            self._nested[key] = self._nested.get(key, 0) + 1
            if self._claim is not None:
                self.claim_if_dormant()
            if self._step is not None or not instrumentation_enabled() or not self._here():
                return
            if not self._just_closed:
                self._open()  # a loop that sets gradients by hand: the iteration is the optimizer step
        except Exception:  # noqa: BLE001 - torch's optimizer step pre-hook: _failed logs it, never raised into optimizer.step()
            self._failed("optimizer_pre")

    def optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            key = id(optimizer)
            depth = self._nested.pop(key, 1) - 1
            if depth > 0:
                self._nested[key] = depth
                return  # the inner step() of a subclass's super().step()
            # _here(), inline for the usual case: a step is open only while the tracker records.
            if self._step is not None and threading.get_ident() == self._owner:
                if self._enabled():  # the check the C core's hook calls too
                    self._stepped_once(optimizer, skipped=False)
            elif self._enabled() and self._here():
                self._stepped_once(optimizer, skipped=False)
        except Exception:  # noqa: BLE001 - torch's optimizer step post-hook: _failed logs it, never raised into optimizer.step()
            self._failed("optimizer_post")

    @contained(default=None)
    def scaler_skipped(self, optimizer: Any) -> None:
        """``GradScaler.step`` returned without calling ``optimizer.step()``."""
        if self._records_here():
            self._stepped_once(optimizer, skipped=True)

    def _stepped_once(self, optimizer: Any, skipped: bool) -> None:
        key = id(optimizer)
        if self._step is None:
            # An optimizer stepping right after the step closed belongs to that iteration: later steps wait for it.
            if self._just_closed:
                self._expected = (self._expected or frozenset()) | {key}
            return
        self._stepped.add(key)
        if not skipped:
            self._optimizer_steps += 1
        self._complete = True
        if self._expected is not None and self._stepped >= self._expected:
            self._close()
        elif not self._fetched:
            self.arm_forward()

    def _pipeline_closing(self) -> None:
        """The pipeline shuts down: the open evaluation, step, epoch and training end (exported, not lost)."""
        self._rt = None
        self.loop.end_evaluation()
        self.close()
        self.loop.close()

    def _interrupted(self) -> None:
        """The way out (an exception, a signal) ends the open step, not ``_close``: its collectives as they stand."""
        if self._step is not None and self.collectives is not None:
            self._step.extra_args(**self.collectives.interrupted_attributes())

    def shutdown(self) -> None:
        self.loop.end_evaluation()
        self.close()
        self.loop.close()
        self.disarm_forward()
        if self.collectives is not None:
            self.collectives.close()

