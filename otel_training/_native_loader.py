"""Which implementation of the offload path's core runs here: the C extension or the pure-Python fallback.

Why a choice: the extension (``otel_training._native``, built from ``native/`` by the package's own build)
makes a record write one C call with real acquire/release atomics, correct on x86-64 and aarch64 alike; the
fallback (``_ring.py``'s Python path) has the same behaviour, relies on x86-64 store ordering, and is what a
machine without a C compiler gets. ``auto`` (the default) takes the extension when it loads and says once in
the log when it does not; ``off`` forces the fallback; ``on`` requires the extension (the pipeline refuses to
start without it, before training: ``native`` option, ``OTEL_TRAINING_NATIVE``).
"""

from __future__ import annotations

import logging
from types import ModuleType

logger = logging.getLogger("otel_training")

MODES = ("auto", "on", "off")
#: The binding's interface version this Python side speaks (``_native.ABI``).
ABI = 10

_loaded: ModuleType | None = None
_problem: str | None = None
_tried = False
_told = False


def _load() -> None:
    global _loaded, _problem, _tried
    _tried = True
    try:
        import otel_training._native as _native  # type: ignore[import-not-found]  # built from native/
    except ImportError as error:
        _problem = f"the C extension otel_training._native is not built or does not load ({error})"
        return
    if getattr(_native, "ABI", None) != ABI:
        _problem = f"the C extension otel_training._native speaks ABI {getattr(_native, 'ABI', None)}, not {ABI}"
        return
    _loaded = _native


def problem() -> str | None:
    """None when the extension is usable here, else why not."""
    if not _tried:
        _load()
    return _problem


def native(mode: str = "auto") -> ModuleType | None:
    """The extension for ``mode`` (see the module docstring), or None for the fallback.

    ``auto`` without the extension logs its reason once. ``on`` without it raises ``RuntimeError``: the
    pipeline checks ``problem()`` before training, so this is reached only by direct callers.
    """
    global _told
    if mode == "off":
        return None
    why = problem()
    if why is None:
        return _loaded
    if mode == "on":
        raise RuntimeError(why)
    if not _told:
        _told = True
        logger.warning("otel_training: %s; the pure-Python fallback runs instead (docs/offload.md)", why)
    return None


def at_import(native: bool | None = None) -> ModuleType | None:
    """The extension for the hot-path helpers a module picks once, at import (the current span's switch, the
    suppression check, a Duration's plain attributes: each the same operation as its Python twin, without a
    Python frame), or None for the Python twins. ``native`` True or False decides; None follows
    ``OTEL_TRAINING_NATIVE`` as the process was started (``off``: the Python twins). Never logs: the pipeline
    says once, for the whole process, whether the extension loads."""
    import os

    if native is None:
        native = os.environ.get("OTEL_TRAINING_NATIVE", "auto").strip().lower() != "off"
    if not native or problem() is not None:
        return None
    return _loaded
