"""``TorchInstrumentor``: zero-code spans for an unmodified PyTorch training script.

An ``opentelemetry-instrumentation`` ``BaseInstrumentor``, so it is found by
``opentelemetry-instrument`` through the ``opentelemetry_instrumentor`` entry
point as well as by ``otel-training run``. It installs torch's global optimizer
step hooks and wraps (with ``wrapt``) the DataLoader iterator, backward,
``GradScaler.step``, ``torch.save``/``torch.load``, distributed checkpoints and
process-group setup; ``uninstrument()`` removes every one of them.

When torch is not imported yet, instrumenting waits for its import (a post-import
hook), so a launcher can instrument at interpreter start without paying torch's
import time in programs that never use it.

``instrument(claim=...)`` installs everything dormant: nothing is recorded (and
nothing configured) until the process trains, then ``claim(rank, world_size)``
configures it (see ``steps.StepTracker``). Auto-instrumentation uses it for the
processes an instrumented process starts.

As contrib's instrumentors: ``instrument(tracer_provider=...)`` sends the spans to
that provider instead of the configured pipeline's (the pipeline's options, such as
trace budgets, still apply), and inside ``suppress_instrumentation()`` the patched
functions and hooks record nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection
from typing import Any

import wrapt
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor
from opentelemetry.instrumentation.utils import unwrap

from otel_training._contain import call_contained, log_once
from otel_training._sdk_compat import instrumentation_check, suppression_keys

_DATALOADER_ITER = "torch.utils.data.dataloader"
_DCP = "torch.distributed.checkpoint"
_instrumentation_enabled = instrumentation_check()


class TorchInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Steps, data waits, checkpoints and process-group setup of a PyTorch loop as spans."""

    #: The step tracker while instrumented (framework callbacks suspend it).
    tracker: Any = None

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

    def _wrap(self, module: Any, name: str, wrapper: Callable[..., Any], gated: bool = False) -> None:
        """``wrapt``-wrap ``module.name`` (a dotted name for a method) and remember how to undo it.

        ``gated``: the wrapper checks ``suppress_instrumentation()`` itself (the per-step ones, which save a
        frame that way); the others are gated here.

        A torch without that function (an older or newer one) loses that span only: said once in the log,
        never raised into the script (the rest of the instrumentation still goes on)."""
        owner_path, _, attribute = name.rpartition(".")
        owner = module
        try:
            for part in owner_path.split(".") if owner_path else ():
                owner = getattr(owner, part)
            wrapt.wrap_function_wrapper(module, name, wrapper if gated else _unless_suppressed(wrapper))
        except Exception:  # noqa: BLE001 - API drift across torch versions
            log_once(f"torch-wrap:{getattr(module, '__name__', module)}.{name}",
                     "otel_training: this torch has no %s.%s to instrument; its spans are left out",
                     getattr(module, "__name__", module), name, exc_info=False)
            return
        self._undo.append(lambda: unwrap(owner, attribute))

    def _patch_torch(self) -> None:
        import torch
        import torch.optim.optimizer as optimizer_module
        import torch.utils.data.dataloader  # noqa: F401 - the iterator class below

        from otel_training.integrations.torch import checkpoint, distributed
        from otel_training.integrations.torch.steps import StepTracker

        tracker = StepTracker(claim=self._claim, tracer_provider=self._tracer_provider)
        TorchInstrumentor.tracker = tracker
        self._undo.append(tracker.shutdown)
        for register, hook in (
            (optimizer_module.register_optimizer_step_pre_hook, tracker.optimizer_pre),
            (optimizer_module.register_optimizer_step_post_hook, tracker.optimizer_post),
        ):
            self._undo.append(register(hook).remove)
        gate = _native_gate()
        self._wrap(sys.modules[_DATALOADER_ITER], "_BaseDataLoaderIter.__next__", _fetch_wrapper(tracker, gate),
                   gated=True)
        self._wrap(torch.autograd, "backward", _backward_wrapper(tracker, gate), gated=True)
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
        tracker._arm_forward()

    def _uninstrument(self, **kwargs: Any) -> None:
        self._generation = getattr(self, "_generation", 0) + 1
        for undo in reversed(getattr(self, "_undo", [])):
            try:
                undo()
            except Exception:  # noqa: BLE001
                log_once("torch-uninstrument", "otel_training: could not undo a torch patch")
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
    tracker._disarm_forward()

    def undo() -> None:
        tracker.suspended = previous
        if not previous:
            tracker._arm_forward()

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


def _unless_suppressed(wrapper: Callable[..., Any]) -> Callable[..., Any]:
    """Inside ``suppress_instrumentation()`` the patched function runs as if it were not patched."""
    def gated(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        if not _instrumentation_enabled():
            return wrapped(*args, **kwargs)
        return wrapper(wrapped, instance, args, kwargs)

    return gated


def _native_gate() -> Callable[..., Any] | None:
    """A maker of the C extension's per-step wrappers (``native/gate.c``: no Python frame of ours before the
    tracker's hooks), or None for the Python ones below: without the extension, with the ``native`` option
    ``off`` (the pipeline's, else the environment's and config file's), or where the suppression check cannot
    be read in C. Asked once, when torch is patched."""
    from otel_training import _native_loader
    from otel_training.config.options import resolve
    from otel_training.pipeline.configure import get_telemetry

    telemetry = get_telemetry()
    try:
        mode = telemetry.options["native"] if telemetry is not None else resolve({})["native"]
    except Exception:  # noqa: BLE001 - a bad setting is configure()'s to report, before training
        mode = "auto"
    keys = suppression_keys()
    native = _native_loader.native("off" if mode == "off" else "auto")  # "on" without it: configure() refuses
    if native is None or keys is None:
        return None
    variable, key, plain = keys
    gate_type = native.Gate

    def gate(begin: Callable[..., Any], end: Callable[..., Any], fetch: bool) -> Callable[..., Any]:
        return gate_type(begin, end, variable, key, plain, fetch)  # type: ignore[no-any-return]

    return gate


def _fetch_wrapper(tracker: Any, gate: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """Gated itself: each fetch of a training loop passes here (in C with ``gate``)."""
    if gate is not None:
        return gate(tracker.fetch_begin, tracker.fetch_end, True)

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        if not _instrumentation_enabled():
            return wrapped(*args, **kwargs)
        started = tracker.fetch_begin(instance)
        try:
            batch = wrapped(*args, **kwargs)
        except BaseException as error:
            tracker.fetch_end(started, error)
            raise
        tracker.fetch_end(started)
        return batch

    return wrapper


def _backward_wrapper(tracker: Any, gate: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """Gated itself: each backward pass passes here (in C with ``gate``)."""
    if gate is not None:
        return gate(tracker.backward_begin, tracker.backward_end, False)

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        if not _instrumentation_enabled():
            return wrapped(*args, **kwargs)
        tracker.backward_begin()
        result = wrapped(*args, **kwargs)
        tracker.backward_end()
        return result

    return wrapper


def _scaler_wrapper(tracker: Any) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        before = tracker.optimizer_calls
        result = wrapped(*args, **kwargs)
        if tracker.optimizer_calls == before:
            tracker.scaler_skipped(args[0] if args else kwargs.get("optimizer"))
        return result

    return wrapper
