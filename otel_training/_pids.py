"""Whether a process id names a running process, here: used by the spool (a live writer's file is
not sent) and by the stack harness (a component still running)."""

from __future__ import annotations

import os


def pid_running(pid: int) -> bool:
    """True for a running process, even another user's; False for none and for a zombie (exited, unreaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True  # no /proc (macOS): kill(0) is all there is
