"""One-shot signal handlers: the kernel restores the default action as it delivers the signal.

A main thread in a C call that holds the GIL runs no Python, so no handler of
ours would ever run; with SA_RESETHAND the signal leaves the default action in
force, which the signal helper then delivers within the exit budget. CPython's
own handler is kept, flags and all (Linux only).
"""

from __future__ import annotations

import sys
from typing import Any

_SA_ONSTACK = 0x08000000
_SA_RESETHAND = 0x80000000
# signum -> the C-level action that puts our handler back, one-shot (Linux only).
_one_shot: dict[int, Any] = {}


def signals() -> list[int]:
    """The signals made one-shot, in order."""
    return sorted(_one_shot)


def is_one_shot(signum: int) -> bool:
    return signum in _one_shot


def forget(signum: int) -> None:
    """Our handler for ``signum`` is gone (uninstalled): nothing to put back."""
    _one_shot.pop(signum, None)


def libc_sigaction() -> tuple[Any, type]:
    """libc's sigaction, called without releasing the GIL, as ``signal.signal`` calls it."""
    import ctypes

    class Sigaction(ctypes.Structure):  # Linux, glibc and musl alike: handler, 1024-bit mask, flags, restorer
        _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ubyte * 128), ("flags", ctypes.c_int),
                    ("restorer", ctypes.c_void_p)]

    sigaction = ctypes.PyDLL(None).sigaction
    sigaction.argtypes = [ctypes.c_int, ctypes.POINTER(Sigaction), ctypes.POINTER(Sigaction)]
    sigaction.restype = ctypes.c_int
    return sigaction, Sigaction


def make_one_shot(signum: int) -> bool:
    """Have the kernel restore the default action of ``signum`` as it delivers it.

    Then a process that runs no Python after the signal (the GIL held for good)
    is left with the default action in force, which the signal helper can
    deliver. CPython's own handler is kept, flags and all, with SA_RESETHAND added.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        sigaction, Sigaction = libc_sigaction()
        action = Sigaction()
        if sigaction(signum, None, ctypes.byref(action)) != 0:
            return False
        if action.handler in (None, 0, 1) or not action.flags & _SA_ONSTACK:
            return False  # not CPython's handler as 3.10+ installs it: the layout is not what we think
        action.flags = ctypes.c_int(action.flags | _SA_RESETHAND).value
        if sigaction(signum, ctypes.byref(action), None) != 0:
            return False
    except (OSError, AttributeError, TypeError):
        return False
    _one_shot[signum] = (sigaction, action)
    return True


def rearm(signum: int) -> None:
    """Put our one-shot handler back after a delivery, so a further signal during the flush does not kill at once.

    Only over the default action the delivery left: a handler that C code
    installed since (Python's table does not see it) is not ours to replace.
    The caller says whether the handler is still ours and the process not dying.
    """
    entry = _one_shot.get(signum)
    if entry is None:
        return
    import ctypes

    sigaction, action = entry
    current = type(action)()
    if sigaction(signum, None, ctypes.byref(current)) == 0 and not current.handler:
        sigaction(signum, ctypes.byref(action), None)
