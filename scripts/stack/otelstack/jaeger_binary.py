"""A Jaeger binary of the user's own (a release download, UI included) in place of the one
build.sh builds from Go modules, which has no UI assets.

Chosen by ``stack.py up --jaeger-binary PATH`` or ``OTEL_TRAINING_JAEGER_BIN`` (the option wins),
and checked before anything starts, so a wrong path fails in a line naming the option or variable
and its value, not minutes later in a log: it must be an executable file, answer ``version`` as
Jaeger does with a v2 version (or no version at all: a build without version stamps, like build.sh's),
and accept the stack's own ``--config collector-config/jaeger.yaml`` (``validate``: the flag, and
every component the file names). Nothing is downloaded: this machine's network reaches no release.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ._base import CONFIG_DIR, StackError
from .polling import http_get

#: The variable that names the user's Jaeger (``--jaeger-binary`` overrides it).
JAEGER_BINARY_ENV = "OTEL_TRAINING_JAEGER_BIN"
#: The option of ``stack.py up`` that names it.
JAEGER_BINARY_OPTION = "--jaeger-binary"
#: The stack runs Jaeger as ``jaeger --config FILE``: the command line of Jaeger v2 (v1 had no config file).
JAEGER_MAJOR = 2
#: What Jaeger's query service serves at ``/`` when the binary was built without the UI assets.
PLACEHOLDER_MARK = b"not compiled with the UI assets"
#: Seconds each probe of the binary may take (it only prints; a hang is not a Jaeger).
PROBE_TIMEOUT_S = 20.0


class BadJaegerBinary(StackError):
    """The Jaeger binary the user named cannot run the stack; the message is one line."""


@dataclass(frozen=True)
class JaegerBinary:
    """A checked Jaeger binary and where it was named."""

    path: Path
    #: Its ``version`` answer's gitVersion, or "" for a build without version stamps.
    version: str
    #: ``--jaeger-binary`` or ``OTEL_TRAINING_JAEGER_BIN``.
    named_by: str

    def describe(self) -> str:
        return f"{self.path} ({self.version or 'no version stamp'}, from {self.named_by})"


def requested(option: str | os.PathLike[str] | None) -> tuple[str, str] | None:
    """The value and its name (the option or the variable), or None when neither is set."""
    if option is not None and str(option) != "":
        return str(option), JAEGER_BINARY_OPTION
    value = os.environ.get(JAEGER_BINARY_ENV, "")
    return (value, JAEGER_BINARY_ENV) if value else None


def _refuse(named_by: str, value: str, why: str) -> BadJaegerBinary:
    spelled = f"{named_by} {value}" if named_by.startswith("--") else f"{named_by}={value}"
    return BadJaegerBinary(f"{spelled}: {why}")


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                          stdin=subprocess.DEVNULL, check=False)


def _last_line(text: str) -> str:
    """The last non-empty line of an error output (Jaeger logs its version line first), shortened."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = lines[-1] if lines else "(no output)"
    return line if len(line) <= 200 else line[:197] + "..."


def check(value: str, named_by: str) -> JaegerBinary:
    """``value`` as a Jaeger v2 binary the stack can run, or :class:`BadJaegerBinary` saying why."""
    path = Path(value).expanduser()
    if not path.exists():
        raise _refuse(named_by, value, "no such file")
    if not path.is_file() or not os.access(path, os.X_OK):
        raise _refuse(named_by, value, "not an executable file")
    path = Path(os.path.abspath(path))  # as named (a link stays a link): the process list shows it
    try:
        answer = _run([str(path), "version"])
    except (OSError, subprocess.SubprocessError) as exc:
        raise _refuse(named_by, value, f"cannot run '{path.name} version': {exc}") from None
    try:
        info = json.loads(answer.stdout.strip().splitlines()[-1]) if answer.stdout.strip() else None
    except ValueError:
        info = None
    if answer.returncode != 0 or not isinstance(info, dict) or "gitVersion" not in info:
        raise _refuse(named_by, value, f"'{path.name} version' did not answer as Jaeger does "
                                       f"(exit code {answer.returncode}: {_last_line(answer.stdout + answer.stderr)})")
    version = str(info["gitVersion"])
    major = re.match(r"v?(\d+)\.", version)
    if version and (major is None or int(major.group(1)) != JAEGER_MAJOR):
        raise _refuse(named_by, value, f"is Jaeger {version}; the stack runs Jaeger v{JAEGER_MAJOR} "
                                       f"('jaeger --config FILE', a v{JAEGER_MAJOR}.x release)")
    config = CONFIG_DIR / "jaeger.yaml"
    try:
        valid = _run([str(path), "validate", "--config", str(config)])
    except (OSError, subprocess.SubprocessError) as exc:
        raise _refuse(named_by, value, f"cannot run '{path.name} validate': {exc}") from None
    if valid.returncode != 0:
        raise _refuse(named_by, value, f"does not take the stack's {config.relative_to(CONFIG_DIR.parent)} "
                                       f"({_last_line(valid.stdout + valid.stderr)})")
    return JaegerBinary(path, version, named_by)


def resolve(option: str | os.PathLike[str] | None = None) -> JaegerBinary | None:
    """The user's Jaeger, checked, or None when neither the option nor the variable names one."""
    asked = requested(option)
    return None if asked is None else check(*asked)


def serves_ui(jaeger_url: str) -> bool:
    """Whether the running Jaeger's page is the UI, not the placeholder of a build without its assets."""
    try:
        status, body = http_get(f"{jaeger_url}/", timeout=5.0)
    except OSError:
        return False
    return status == 200 and PLACEHOLDER_MARK not in body and b"<html" in body.lower()
