"""``TorchInstrumentor``: zero-code spans for an unmodified PyTorch training script.

An ``opentelemetry-instrumentation`` ``BaseInstrumentor``, so it is found by
``opentelemetry-instrument`` through the ``opentelemetry_instrumentor`` entry
point as well as by ``otel-training run``. It installs torch's global optimizer
step hooks, stands in for the DataLoader iterator's ``__next__`` and
``torch.autograd.backward`` (called on every step: no wrapt proxy, see
``_install``), wraps (with ``wrapt``) ``GradScaler.step``,
``torch.save``/``torch.load``, distributed checkpoints and process-group setup;
``uninstrument()`` removes every one of them.

When torch is not imported yet, instrumenting waits for its import (a post-import
hook), so a launcher can instrument at interpreter start without paying torch's
import time in programs that never use it.

``instrument(claim=...)`` installs everything dormant: nothing is recorded (and
nothing configured) until the process trains, then ``claim(rank, world_size)``
configures it (see ``steps.StepTracker``). Auto-instrumentation uses it for the
processes an instrumented process starts.

As contrib's instrumentors: ``instrument(tracer_provider=...)`` sends the spans to
that provider instead of the configured pipeline's and configures nothing global (the
configured pipeline's options, such as trace budgets, apply if there is one, else the
environment's), and inside ``suppress_instrumentation()`` the patched
functions and hooks record nothing.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

import wrapt
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]  # the module opens with a file-wide ignore comment: mypy sees none of its names
from opentelemetry.instrumentation.utils import unwrap

from otel_training._contain import call_contained, contain, log_once
from otel_training._sdk_compat import instrumentation_check, suppression_keys

if TYPE_CHECKING:
    from otel_training.integrations.torch.steps import StepTracker

_DATALOADER_ITER = "torch.utils.data.dataloader"
_DCP = "torch.distributed.checkpoint"
_instrumentation_enabled = instrumentation_check()


class TorchInstrumentor(BaseInstrumentor):  # type: ignore[misc]  # BaseInstrumentor is Any to mypy (see its import)
    """Steps, data waits, checkpoints and process-group setup of a PyTorch loop as spans."""

    #: The step tracker while instrumented (framework callbacks suspend it).
    tracker: StepTracker | None = None

    def instrumentation_dependencies(self) -> Collection[str]:
        return ("torch >= 2.1",)

    def _instrument(self, **kwargs: Any) -> None:
        # A generation number lets a pending post-import hook notice uninstrument().
        self._generation = getattr(self, "_generation", 0) + 1
        self._undo: list[Callable[[], None]] = []
        self._claim = kwargs.get("claim")
        #: As contrib's instrumentors: spans go to this provider instead of the configured pipeline's.
        self._tracer_provider = kwargs.get("tracer_provider")
        generation = self._generation
        if "torch" in sys.modules:
            self._patch_torch()
        else:
            wrapt.register_post_import_hook(lambda module: self._when_imported(generation, self._patch_torch), "torch")

    def _when_imported(self, generation: int, patch: Callable[[], None]) -> None:
        if generation == getattr(self, "_generation", None) and self.is_instrumented_by_opentelemetry:
            call_contained(patch)

    def _wrap(self, module: Any, name: str, wrapper: Callable[..., Any]) -> None:
        """``wrapt``-wrap ``module.name`` (a dotted name for a method), gated by ``suppress_instrumentation()``,
        and remember how to undo it.

        A torch without that function (an older or newer one) loses that span only: said once in the log,
        never raised into the script (the rest of the instrumentation still goes on)."""
        with _missing(module, name):  # API drift across torch versions
            owner, attribute = _owner_of(module, name)
            wrapt.wrap_function_wrapper(module, name, _unless_suppressed(wrapper))
            self._undo.append(lambda: unwrap(owner, attribute))

    def _install(self, module: Any, name: str, make: Callable[[Callable[..., Any]], _StandIn]) -> None:
        """Put ``make(original)`` in ``module.name``'s place itself (a dotted name for a method, as ``_wrap``'s), and
        remember how to undo it: for the two
        functions every step calls (the DataLoader fetch, the backward pass), gated themselves.

        Not a wrapt proxy: a proxy cost 0.7-1.0 µs a call in a tight loop (a bound proxy made per fetch, the
        arguments packed into a tuple and a dict), more than the hook's own work. Uninstrumenting puts the
        original back; where somebody has put their own wrapper over ours meanwhile, ours stays in their chain,
        closed (it only calls the original), and the log says so once."""
        with _missing(module, name):  # API drift across torch versions
            owner, attribute = _owner_of(module, name)
            namespace = vars(owner)
            had = attribute in namespace
            original = namespace[attribute] if had else getattr(owner, attribute)
            stand_in, close = make(original)
            setattr(owner, attribute, stand_in)
            self._undo.append(lambda: _put_back(owner, attribute, stand_in, close, had, original))

    def _patch_torch(self) -> None:
        import torch
        import torch.optim.optimizer as optimizer_module
        import torch.utils.data.dataloader

        from otel_training.integrations.torch import checkpoint, distributed
        from otel_training.integrations.torch.tracker_class import tracker_class

        native = _native_core()
        tracker = tracker_class(native[0].StepCore if native is not None else None)(
            claim=self._claim, tracer_provider=self._tracer_provider)
        TorchInstrumentor.tracker = tracker
        self._undo.append(tracker.shutdown)
        for register, hook in (
            (optimizer_module.register_optimizer_step_pre_hook, tracker.optimizer_pre),
            (optimizer_module.register_optimizer_step_post_hook, tracker.optimizer_post),
        ):
            self._undo.append(register(hook).remove)
        gate = _native_gate(native)
        self._install(sys.modules[_DATALOADER_ITER], "_BaseDataLoaderIter.__next__",
                      lambda original: _fetch_wrapper(tracker, original, gate))
        self._install(torch.autograd, "backward", lambda original: _backward_wrapper(tracker, original, gate))
        self._wrap(_grad_scaler_module(), "GradScaler.step", _scaler_wrapper(tracker))
        self._wrap(torch, "save", checkpoint.save_wrapper(tracker))
        self._wrap(torch, "load", checkpoint.load_wrapper(tracker))
        if torch.distributed.is_available():
            for function in distributed.FUNCTIONS:
                self._wrap(torch.distributed, function, distributed.wrapper(tracker, function))
            generation = self._generation

            def patch_dcp() -> None:
                dcp = sys.modules[_DCP]
                # save/load since torch 2.2; save_state_dict/load_state_dict (2.1, deprecated since) as well
                for name, save in (("save", True), ("load", False), ("save_state_dict", True),
                                   ("load_state_dict", False)):
                    if callable(getattr(dcp, name, None)):
                        self._wrap(dcp, name, checkpoint.dcp_wrapper(tracker, save=save))

            if _DCP in sys.modules:
                patch_dcp()
            else:
                wrapt.register_post_import_hook(lambda module: self._when_imported(generation, patch_dcp), _DCP)
        tracker.arm_forward()  # the instrumentor that made it starts it

    def _uninstrument(self, **kwargs: Any) -> None:
        self._generation = getattr(self, "_generation", 0) + 1
        for undo in reversed(getattr(self, "_undo", [])):
            # One patch that cannot be undone must not keep the others in place.
            with contain("torch-uninstrument", "otel_training: could not undo a torch patch"):
                undo()
        self._undo = []
        TorchInstrumentor.tracker = None


def suspend_steps() -> Callable[[], None]:
    """Stop the torch step spans while a framework callback emits its own; returns the undo.

    Data-wait, checkpoint and distributed spans stay on. A no-op when torch is
    not instrumented.
    """
    tracker = TorchInstrumentor.tracker
    if tracker is None:
        return lambda: None
    previous = tracker.suspended
    tracker.close()
    tracker.loop.close()  # the framework's own train and epoch spans frame what follows
    tracker.suspended = True
    tracker.disarm_forward()  # suspending it is the instrumentor's call

    def undo() -> None:
        tracker.suspended = previous
        if not previous:
            tracker.arm_forward()  # resuming it is the instrumentor's call

    return undo


# -- wrappers (each calls the original outside any try that could swallow its errors)


def _grad_scaler_module() -> Any:
    """The module of AMP's ``GradScaler``: ``torch.amp.grad_scaler`` since torch 2.3 (``torch.cuda.amp``'s is a
    subclass there), ``torch.cuda.amp.grad_scaler`` before it (torch 2.1, 2.2)."""
    import importlib

    try:
        return importlib.import_module("torch.amp.grad_scaler")
    except ImportError:
        return importlib.import_module("torch.cuda.amp.grad_scaler")


def _owner_of(module: Any, name: str) -> tuple[Any, str]:
    """The object holding ``module.name`` (a dotted name for a method) and the attribute's own name."""
    owner_path, _, attribute = name.rpartition(".")
    owner = module
    for part in owner_path.split(".") if owner_path else ():
        owner = getattr(owner, part)
    return owner, attribute


def _missing(owner: Any, name: str) -> contain:
    """Patching ``owner.name``: a torch without it (older or newer) loses those spans, said once, never raised."""
    label = getattr(owner, "__name__", owner)
    return contain(f"torch-wrap:{label}.{name}", "otel_training: this torch has no %s.%s to instrument; its spans "
                   "are left out", label, name, exc_info=False)


def _put_back(owner: Any, attribute: str, stand_in: Any, close: Callable[[], None], had: bool, original: Any) -> None:
    """Undo ``_install``: the original back in place, unless somebody wrapped ours since (then ours only passes
    calls on, closed, and the log says so once)."""
    if vars(owner).get(attribute) is not stand_in:
        close()
        log_once(f"torch-rewrapped:{attribute}", "otel_training: %s.%s was wrapped again after "
                 "instrumenting; the instrumentation's part of it now only passes calls on",
                 getattr(owner, "__name__", owner), attribute, exc_info=False)
    elif had:
        setattr(owner, attribute, original)
    else:
        delattr(owner, attribute)


def _unless_suppressed(wrapper: Callable[..., Any]) -> Callable[..., Any]:
    """Inside ``suppress_instrumentation()`` the patched function runs as if it were not patched."""
    def gated(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not _instrumentation_enabled():
            return wrapped(*args, **kwargs)
        return wrapper(wrapped, instance, args, kwargs)

    return gated


def _native_core() -> tuple[Any, tuple[Any, Any, Any]] | None:
    """The C extension and the suppression check's keys, for the per-step stand-ins (``native/gate.c``: no Python
    frame of ours before the tracker's hooks) and the tracker's hooks (``native/steps.c``); None for the Python
    ones: without the extension, with the ``native`` option ``off`` (the pipeline's, else the environment's and
    config file's), or where the suppression check cannot be read in C. Asked once, when torch is patched."""
    from otel_training import _native_loader
    from otel_training.assembly.configure import get_telemetry
    from otel_training.config.options import resolve

    telemetry = get_telemetry()
    try:
        mode = telemetry.options["native"] if telemetry is not None else resolve({})["native"]
    except Exception:  # noqa: BLE001 - a bad setting is configure()'s to report, before training
        mode = "auto"
    keys = suppression_keys()
    native = _native_loader.native("off" if mode == "off" else "auto")  # "on" without it: configure() refuses
    if native is None or keys is None:
        return None
    return native, keys


_ASK = object()


def _native_gate(core: Any = _ASK) -> Callable[..., Any] | None:
    """A maker of the C stand-ins from ``_native_core()``'s answer (asked here when not given), or None for the
    Python ones."""
    if core is _ASK:
        core = _native_core()
    if core is None:
        return None
    native, (variable, key, plain) = core
    gate_type = native.Gate

    def gate(begin: Callable[..., Any], end: Callable[..., Any], fetch: bool,
             wrapped: Callable[..., Any]) -> Callable[..., Any]:
        return gate_type(begin, end, variable, key, plain, fetch, wrapped)  # type: ignore[no-any-return]  # the C extension is untyped: a Gate is the callable stand-in

    return gate


#: What ``_install`` puts in a function's place, and how to close it (only the original is called from then on).
_StandIn = tuple[Callable[..., Any], Callable[[], None]]


def _fetch_wrapper(tracker: StepTracker, wrapped: Callable[..., Any], gate: Callable[..., Any] | None = None) -> _StandIn:
    """Stands in for ``_BaseDataLoaderIter.__next__``, gated itself: each fetch of a training loop passes here
    (in C with ``gate``). A function, so as a class attribute it binds as the method did."""
    if gate is not None:
        stand_in = gate(tracker.fetch_begin, tracker.fetch_end, True, wrapped)
        return stand_in, stand_in.close
    closed: list[bool] = []

    @functools.wraps(wrapped)
    def fetch(iterator: Any, *args: Any, **kwargs: Any) -> Any:
        if closed or not _instrumentation_enabled():
            return wrapped(iterator, *args, **kwargs)
        started = tracker.fetch_begin(iterator)
        try:
            batch = wrapped(iterator, *args, **kwargs)
        except BaseException as error:
            tracker.fetch_end(started, error)
            raise
        tracker.fetch_end(started)
        return batch

    return fetch, lambda: closed.append(True)


def _backward_wrapper(tracker: StepTracker, wrapped: Callable[..., Any], gate: Callable[..., Any] | None = None) -> _StandIn:
    """Stands in for ``torch.autograd.backward``, gated itself: each backward pass passes here (in C with
    ``gate``)."""
    if gate is not None:
        stand_in = gate(tracker.backward_begin, tracker.backward_end, False, wrapped)
        return stand_in, stand_in.close
    closed: list[bool] = []

    @functools.wraps(wrapped)
    def backward(*args: Any, **kwargs: Any) -> Any:
        if closed or not _instrumentation_enabled():
            return wrapped(*args, **kwargs)
        tracker.backward_begin()
        result = wrapped(*args, **kwargs)
        tracker.backward_end()
        return result

    return backward, lambda: closed.append(True)


def _scaler_wrapper(tracker: StepTracker) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        before = tracker.optimizer_calls
        result = wrapped(*args, **kwargs)
        if tracker.optimizer_calls == before:
            tracker.scaler_skipped(args[0] if args else kwargs.get("optimizer"))
        return result

    return wrapper
