"""Which step tracker the instrumentor makes: the Python one, or the same with the C extension's ``StepCore`` under it.

Why a class, not a flag: the hooks' state has to be the C struct's own fields for C to read it without a
generic attribute lookup (which costs what the bytecode did), and Python code reads and writes those fields
through the member descriptors of its base. ``StepCore`` (``native/steps.c``) comes first in the class's
bases, so its hooks run their usual case in C; every other case calls ``_py_<hook>``, the Python class's own
method, which is also what the pure-Python fallback runs. One behaviour, written once, in ``steps.py``.
"""

from __future__ import annotations

from otel_training.integrations.torch.steps import StepTracker

#: The hooks the C core runs the usual case of, handing every other case to these.
NATIVE_HOOKS = ("fetch_end", "backward_begin", "backward_end", "optimizer_pre", "optimizer_post", "_make_step",
                "_close", "fetch_begin", "_open")
_made: dict[type, type[StepTracker]] = {}


def tracker_class(core: type | None) -> type[StepTracker]:
    """``StepTracker`` itself (the pure-Python fallback) for ``core`` None, else the tracker with the C extension's
    ``StepCore`` (``core``) as its first base (made once per core)."""
    if core is None:
        return StepTracker
    made = _made.get(core)
    if made is None:
        made = _made[core] = type("StepTracker", (core, StepTracker), {
            "__module__": StepTracker.__module__, "__doc__": StepTracker.__doc__,
            **{f"_py_{hook.lstrip('_')}": getattr(StepTracker, hook) for hook in NATIVE_HOOKS}})
    return made
