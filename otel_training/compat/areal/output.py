"""Where AReaL's files go and how their lines are appended.

AReaL's converter and plotting tools find the files by this layout, so the path
rule is kept in one place for both the Chrome-trace and the session files; a
write that fails (a full disk) is logged and reported, never raised.
"""

from __future__ import annotations

import getpass
import json
import os
from typing import Any

from otel_training._contain import contain
from otel_training._text import text
from otel_training.compat.areal.config import _setting


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError, ImportError):  # no passwd entry in a container (AReaL would raise here), no pwd
        return str(os.getuid()) if hasattr(os, "getuid") else "user"


def _output_path(config: Any, rank: int, role: str | None, subdir: str, stem: str) -> str | None:
    """AReaL's layout, so its converter and plotting tools find the files; None where it cannot be built."""
    # Any config AReaL's layout cannot be built from: no trace files, training goes on.
    with contain("areal.output_path", "otel_training: cannot build the AReaL trace path from the config; "
                 "no AReaL trace files are written"):
        parts = [_setting(config, name, None) for name in ("fileroot", "experiment_name", "trial_name")]
        # Unset (None, OmegaConf's "???"): AReaL fails on these; a directory named "None" is no better.
        if any(not isinstance(part, str | os.PathLike) or str(part) in ("", "???") for part in parts):
            raise ValueError(f"fileroot, experiment_name and trial_name must be set, not {parts!r}")
        base = os.path.join(os.path.expanduser(os.path.expandvars(str(parts[0]))), "logs", _user(), str(parts[1]),
                            str(parts[2]), subdir)
        if role:
            base = os.path.join(base, role)
        return os.path.join(base, f"{stem}-r{rank}.jsonl")
    return None


def _append_lines(path: str | None, items: list[dict[str, Any]]) -> bool:
    """Append JSON lines (fsynced, as AReaL does); an unserialisable value is written as its text."""
    if path is None:
        return True
    # A full disk must not stop training; kept for the next save.
    with contain(f"areal.write:{path}", "otel_training: cannot append to %s; kept for the next save", path):
        lines = [json.dumps(item, ensure_ascii=False, default=text) for item in items]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a", encoding="utf-8") as out:
            out.write("".join(line + "\n" for line in lines))
            out.flush()
            os.fsync(out.fileno())
        return True
    return False
