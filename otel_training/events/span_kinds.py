"""The span kinds the device timeline needs to know about: training steps and host work between them.

A step is timed on the device's timeline as well as the host's; host work
(a checkpoint, an evaluation, set-up, the training loop itself) tells the
device timeline that the time between steps is not a hang.
"""

from __future__ import annotations

import time
import types
from collections.abc import Callable, Mapping
from time import monotonic as _monotonic
from typing import Any

from otel_training import _native_loader
from otel_training import semconv as sc
from otel_training._contain import contain
from otel_training._sdk_compat import trace_id_of
from otel_training.events import device_probe
from otel_training.events.duration import _CURRENT, Duration
from otel_training.events.runtime import EventsRuntime
from otel_training.events.span_factory import begin_failed, end_failed

#: The device timeline's containments: they run at every step, so each is an inline try (free when nothing
#: raises, where a ``with contain(...)`` block costs two calls a step) whose handler logs with this one.
_INPUT_READY_FAILED = contain("StepDuration.input_ready", "otel_training: internal error timing a step on the "
                              "device; training continues")
_STEP_BEGIN_FAILED = contain("StepDuration.begin", "otel_training: internal error timing a step on the device; "
                             "training continues")


def _with_defaults(function: Callable[..., Any], **defaults: Any) -> Callable[..., Any]:
    """``function`` itself (its code, no wrapper frame) with other defaults for its trailing parameters."""
    code = function.__code__
    names = code.co_varnames[:code.co_argcount]
    values = dict(zip(names[len(names) - len(function.__defaults__ or ()):], function.__defaults__ or ()))
    values.update(defaults)
    copy = types.FunctionType(code, function.__globals__, function.__name__, tuple(values[name] for name in
                              names[len(names) - len(values):]), function.__closure__)
    copy.__kwdefaults__, copy.__qualname__, copy.__doc__ = function.__kwdefaults__, function.__qualname__, \
        function.__doc__
    return copy


class StepDuration(Duration):
    """A training step, timed on the device's timeline too when it runs device work.

    CUDA work is asynchronous, so the host span measures launch time. With a
    device in use (``events.device``), begin and end also record a device marker
    (a few µs, no synchronisation), the host span says
    ``training.step.device_timed``, and the resolver thread emits the step's
    device execution as a ``training.device_step`` child. Without one, this is a
    plain Duration plus one attribute read.
    """

    __slots__ = ()

    #: A phase of a step is a plain Duration (the device timeline times whole steps).
    _STAGE_CLASS = Duration

    def begin_awaiting_input(self) -> Duration:
        """Begin a step that opens by fetching its batch: its device time starts at ``input_ready()``.

        A host blocked for data while the device is idle is then data loading, not device time.
        """
        return self.begin_detached(True, None, False)

    def input_ready(self) -> None:
        """The step's input is in: its device work starts now (after ``begin_awaiting_input``)."""
        pending = self.device_step
        if pending is not None:
            try:
                pending[0].input_ready(pending[1])
            except Exception:  # noqa: BLE001 - per step, inline: logged once, the step goes on timed on the host
                _INPUT_READY_FAILED.failed()

    def begin_detached(self, awaiting_input: bool = False,
                       rt: EventsRuntime | None = None, detached: bool = True,
                       under: Duration | None = None) -> Duration:
        """Begin without becoming the caller's current span; ``context()`` gives a context where it is.

        For the torch instrumentor, whose steps open and close at hook calls: a step closed at an odd moment
        cannot leave the user's context in a wrong state, and a step with no work nested in it costs no
        context switch at all. ``awaiting_input``: as ``begin_awaiting_input``; ``rt``: the runtime, when the
        caller has just looked it up. ``detached=False`` (``begin()``, ``with``) makes it current after all:
        every way of beginning a step runs this one method, one frame. ``under``: the begun Duration current
        where the step begins (``Duration._begin``), for a caller that knows it.
        """
        step = timeline = None
        if self._span is None:
            try:
                if rt is None:  # Process.events_runtime(), inline for its usual case: the runtime it keeps
                    rt = self._process._runtime  # noqa: SLF001 - Process.events_runtime()'s kept runtime, read inline: the same layer's hot path
                    if rt is None or rt.closed:
                        rt = self._process.events_runtime()
                timeline = rt.device
                # may_probe's own clock check first, inline: between probes a step asks nothing more
                if timeline is None and _monotonic() >= rt.device_probe_at and device_probe.may_probe(rt):
                    timeline = device_probe.probe(rt)
                if timeline:
                    parent = _CURRENT.get() if under is None else under
                    step = timeline.begin_step(parent._attributes.get(sc.EPOCH) if parent is not None else None,  # noqa: SLF001 - the parent Duration's attributes: the same class hierarchy's state
                                               awaiting_input)
                    if step is not None:
                        self._attributes[sc.STEP_DEVICE_TIMED] = True
            except Exception:  # noqa: BLE001 - per step, inline: logged once, the step begins host-timed
                _STEP_BEGIN_FAILED.failed()
        self._begin(rt, detached, under)
        span = self._span
        if step is not None and span is not None and span.is_recording():
            # Its device step joins this trace: charge the budget here, once. The SDK's spans and ours have a
            # parent; another implementation's recording span may not (read without raising into the step).
            if getattr(span, "parent", None) is not None:
                rt.charge(trace_id_of(span.get_span_context()))  # type: ignore[union-attr]  # not None: a step was begun, so the try above set rt
            timeline.started(step, span)  # type: ignore[union-attr, arg-type]  # set: a step was begun; its step is the same timeline's
            self.device_step = (timeline, step)
        return self

    #: ``begin()`` and ``with trainer.step()``: ``begin_detached`` itself, made current (``detached=False`` by
    #: default), so a step begins in one frame of ours rather than two.
    begin = __enter__ = _with_defaults(begin_detached, awaiting_input=False, rt=None, detached=False, under=None)


_new = object.__new__
_init = Duration.__init__


def new_step(process: Any, name: str, event_name: str, attributes: dict[str, Any]) -> StepDuration:
    """``StepDuration(process, name, None, event_name=event_name, attributes=attributes)``, for an integration
    that makes one every step (the torch tracker): the same ``__init__``, called from Python. A class called
    from Python goes through ``type.__call__`` in C, which calls ``__init__`` as a new interpreter entry with
    its keywords packed into a dict: about 5 000 instructions a step more (callgrind), before any of its work."""
    step = _new(StepDuration)
    _init(step, process, name, None, event_name=event_name, attributes=attributes)
    return step


class HostWork(Duration):
    """Host work between steps (a checkpoint, an evaluation, set-up), or the training loop itself.

    The device timeline alerts on the time between steps (``training.between_steps``) only while
    none of these is open and the training loop has not ended: a long checkpoint save, an
    evaluation or the teardown after training is no hang.
    """

    __slots__ = ("_counted_in",)

    _STAGE_CLASS = Duration

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._counted_in: EventsRuntime | None = None

    def _begin(self, rt: EventsRuntime | None, detached: bool = False, under: Duration | None = None) -> Duration:
        super()._begin(rt, detached, under)
        current = self._runtime
        if self._span is not None and self._counted_in is None and current is not None:
            self._counted_in = current
            if self.name == sc.SPAN_TRAIN:
                current.training = True
            else:
                current.host_work += 1
        return self

    def end(self, attributes: Mapping[str, Any] | None = None) -> None:
        counted, self._counted_in = self._counted_in, None
        super().end(attributes)
        if counted is not None:
            if self.name == sc.SPAN_TRAIN:
                counted.training = False
            else:
                counted.host_work = max(0, counted.host_work - 1)
                if not counted.host_work:
                    counted.host_work_ended_ns = time.time_ns()

    def _init_state(self) -> None:
        self._counted_in = None


def _register_step_span() -> None:
    """The C core begins and ends a torch tracker's usual step itself (``native/step_span.c``): it is told the
    context variable a current Duration is in, the Python methods it shortcuts (it runs them instead whenever an
    object's class resolves another: a wrapper, an override) and how they log a contained error."""
    extension = _native_loader.at_import(native=True)
    if extension is not None:
        extension.step_span_setup(_CURRENT, StepDuration.begin_detached, Duration._begin, Duration.end,  # noqa: SLF001 - the C core shortcuts Duration's own begin: it runs it instead for any override
                                  EventsRuntime.admit, begin_failed, end_failed)


_register_step_span()
