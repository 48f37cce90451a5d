"""Opening the files the library writes: owner-only, never through a symlink.

Trace, metric and DLRover log files hold stack dumps, exception messages and
paths, so they are created ``0600`` in a directory created ``0700``: on a shared
node nobody else can read them. A file or directory that already exists keeps
its mode, which is how a site widens access on purpose (see docs/security.md).

The file itself is opened with ``O_NOFOLLOW``: a symlink planted at its name
would otherwise have the library append to, or create, whatever it points at
with the training job's rights. The link is refused, not followed.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import TextIO

#: Mode of the files the library creates: owner read and write only.
FILE_MODE = 0o600
#: Mode of the directories the library creates: owner only.
DIR_MODE = 0o700

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class SymlinkRefused(OSError):
    """The path to write is a symbolic link; it was neither followed nor replaced."""


def open_for_append(path: str | os.PathLike[str], file_mode: int = FILE_MODE, dir_mode: int = DIR_MODE, *,
                    readable: bool = False) -> int:
    """A descriptor appending to ``path``, creating it (and its directory) owner-only.

    ``readable`` lets the writer look at what is already there (a cut last
    line) through the same descriptor instead of reopening the path, which
    could by then be another file. Raises ``SymlinkRefused`` when ``path`` is
    a symbolic link, dangling or not.
    """
    path = Path(path)
    path.parent.mkdir(mode=dir_mode, parents=True, exist_ok=True)
    access = os.O_RDWR if readable else os.O_WRONLY
    try:
        return os.open(path, access | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | _NOFOLLOW, file_mode)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise SymlinkRefused(errno.ELOOP, "is a symbolic link; not following it", str(path)) from None
        raise


def open_private(path: str | os.PathLike[str]) -> TextIO:
    """``path`` opened for writing from scratch (a report), created owner-only and never through a symlink, as
    the trace files are: a report holds the stacks and span attributes the traces hold."""
    path = Path(path)
    try:
        path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    except FileExistsError:  # a file where its directory should be: say that, not "File exists"
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path.parent)) from None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | _NOFOLLOW, FILE_MODE)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise SymlinkRefused(errno.ELOOP, "is a symbolic link; not following it", str(path)) from None
        raise
    return os.fdopen(fd, "w", encoding="utf-8")


def write_private(path: str | os.PathLike[str], text: str) -> None:
    """``text`` as the whole of ``path``, as ``open_private`` opens it."""
    with open_private(path) as handle:
        handle.write(text)


__all__ = ["DIR_MODE", "FILE_MODE", "SymlinkRefused", "open_for_append", "open_private", "write_private"]
