"""DLRover's event settings: the defaults, then an optional JSON file, then the ``DLROVER_EVENT_*`` variables.

DLRover users already configure their events this way, so the same variables
(``DLROVER_EVENT_<SETTING>``, e.g. ``DLROVER_EVENT_EVENT_EXPORTER``), the same
file keys, the same spellings (``yes``/``off``/... for booleans) and the same
precedence (a variable beats the file, the file beats the default) mean the same
thing here. Switching between DLRover and this module changes nothing.

As in DLRover, ``Config`` only reads and types the values; what a value means
(which exporter, how big a queue) is decided where it is used, by the
exporter. So ``Config`` also remembers where each value came from: a warning
about a value can then name the variable or file line to fix.

Bad input never raises into training. DLRover ignores it silently (and keeps a
malformed integer as a string, which fails later); here it is ignored too, the
previous value kept, and logged once naming the variable or file and the value.
"""

from __future__ import annotations

import difflib
import json
import os
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar, cast

from otel_training._contain import log_once


class _OnePerProcess(Protocol):
    """A class that holds its process's one instance in ``_instance`` (DLRover's ``singleton_instance``)."""

    _instance: ClassVar[Any]


T = TypeVar("T", bound=_OnePerProcess)

ENV_PREFIX = "DLROVER_EVENT"
DEFAULT_EVENT_EXPORTER = "TEXT_FILE"
DEFAULT_FILE_DIR = "/tmp/dlrover"
DEFAULT_TEXT_FORMATTER = "LOG"
DEFAULT_QUEUE_SIZE = 1024

_TRUE = frozenset({"true", "1", "yes", "y", "on", "enable", "enabled"})
_FALSE = frozenset({"false", "0", "no", "n", "off", "disable", "disabled"})


def parse_bool(val: Any) -> bool | None:
    """A bool, or one of DLRover's spellings of one in any case (``yes``, ``Off``, ``1``...); else None."""
    if isinstance(val, bool):
        return val
    if isinstance(val, str):
        lowered = val.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
    return None


def parse_int(val: Any) -> int | None:
    """An int, or a string of one (``"-1"``, ``" 2048 "``); else None.

    DLRover's raises ``ValueError`` for a malformed string and passes a bool
    through as an int; here both are None ("not an integer"), so that one rule
    decides which values ``Config`` warns about.
    """
    if isinstance(val, bool):
        return None
    if isinstance(val, int):
        return val
    if isinstance(val, str):
        try:
            return int(val.strip())
        except ValueError:
            return None
    return None


def parse_str(val: Any) -> str | None:
    """A string as is; anything else (a number, a bool, None, a list) is None, as in DLRover."""
    return val if isinstance(val, str) else None


def get_env_key(key: str) -> str:
    """The variable for a setting: ``queue_size`` is ``DLROVER_EVENT_QUEUE_SIZE``."""
    return f"{ENV_PREFIX}_{key.upper()}"


def get_rank() -> str:
    """``RANK`` (``"0"`` when unset, ``"empty"`` when set empty), as DLRover names the log by it."""
    rank = os.getenv("RANK", "0")
    return rank if rank else "empty"


def get_pid() -> str:
    """This process's pid (DLRover caches its first; here a forked child has its own)."""
    return str(os.getpid())


#: Every setting DLRover reads from the file and the environment, with the parser that types it.
_PARSERS: dict[str, Callable[[Any], bool | int | str | None]] = {
    "event_exporter": parse_str,
    "async_exporter": parse_bool,
    "queue_size": parse_int,
    "file_dir": parse_str,
    "text_formatter": parse_str,
    "enable": parse_bool,
    "debug_mode": parse_bool,
    "hook_error": parse_bool,
}
_EXPECTED: dict[Callable[[Any], bool | int | str | None], str] = {
    parse_str: "a string", parse_bool: "a boolean (true/false, yes/no, on/off, 1/0)", parse_int: "an integer"}
_VARIABLES = {get_env_key(key): key for key in _PARSERS}


def _warn(key: str, message: str, *args: Any) -> None:
    log_once(f"dlrover-compat:config:{key}", "otel_training: " + message, *args, exc_info=False)


def _did_you_mean(name: str, known: list[str], prefix: str = "") -> str:
    """The closest known name, compared without the shared prefix (which would make every name look close)."""
    stems = {candidate[len(prefix):]: candidate for candidate in known}
    close = difflib.get_close_matches(name[len(prefix):], list(stems), n=1, cutoff=0.6)
    return f" (did you mean {stems[close[0]]}?)" if close else ""


def one_per_process(cls: type[T], lock: AbstractContextManager[object], *args: Any, **kwargs: Any) -> T:
    """``cls._instance``, made on first use under ``lock`` from ``args``: DLRover's ``singleton_instance``."""
    with lock:
        if cls._instance is None:
            cls._instance = cls(*args, **kwargs)
        return cast(T, cls._instance)


@dataclass(init=False)
class Config:
    """DLRover's event settings: the defaults, then ``config_file`` (JSON) if given, then the environment.

    The process's own (``singleton_instance()``) is made at import from the
    environment, as in DLRover; ``Config(path)`` reads a file for a ``Config``
    you build yourself.
    """

    event_exporter: str = DEFAULT_EVENT_EXPORTER
    async_exporter: bool = False
    queue_size: int = DEFAULT_QUEUE_SIZE
    file_dir: str = DEFAULT_FILE_DIR
    text_formatter: str = DEFAULT_TEXT_FORMATTER
    hook_error: bool = False

    rank: str = "empty"
    pid: str = "empty"

    enable: bool = True
    debug_mode: bool = False

    _instance: ClassVar[Config | None] = None
    _instance_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, config_file: str | os.PathLike[str] | None = None) -> None:
        self.event_exporter = DEFAULT_EVENT_EXPORTER
        self.async_exporter = False
        self.queue_size = DEFAULT_QUEUE_SIZE
        self.file_dir = DEFAULT_FILE_DIR
        self.text_formatter = DEFAULT_TEXT_FORMATTER
        self.hook_error = False
        self.enable = True
        self.debug_mode = False
        self.rank = get_rank()
        self.pid = get_pid()
        self._origins: dict[str, str] = {}
        if config_file is not None:
            self._load_file(os.fspath(config_file))
        self._load_env()

    @classmethod
    def singleton_instance(cls, *args: Any, **kwargs: Any) -> Config:
        """The process's ``Config``; arguments count only on the first call, as in DLRover."""
        return one_per_process(cls, cls._instance_lock, *args, **kwargs)

    def origin(self, key: str) -> str:
        """Where ``key``'s value came from, as a user would look for it: a variable, a file key, or the code."""
        return self._origins.get(key, f"Config.{key}")

    def one_of(self, key: str, choices: tuple[str, ...]) -> str:
        """The setting if it is one of ``choices`` (DLRover's spelling, case included); else the first, logged.

        DLRover raises ``ValueError`` at import here; a misspelt setting must not stop training.
        """
        value = getattr(self, key)
        if value in choices:
            return cast(str, value)
        _warn(f"{self.origin(key)}={value!r}", "%s is %r, not one of %s; using %s", self.origin(key), value,
              ", ".join(choices), choices[0])
        return choices[0]

    def positive(self, key: str, default: int) -> int:
        """The setting if it is an integer above 0; else ``default``, logged.

        DLRover's queue is unbounded at 0 or below; this module's queue is always bounded, so that a stuck disk
        cannot grow the process's memory without end.
        """
        value = getattr(self, key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        _warn(f"{self.origin(key)}={value!r}", "%s is %r, not an integer above 0; using %d", self.origin(key),
              value, default)
        return default

    def _load_file(self, path: str) -> None:
        """Settings from a JSON object; a file that cannot be read or parsed is logged and skipped."""
        try:
            with open(path, encoding="utf-8") as stream:
                data = json.load(stream)
        except (OSError, ValueError) as error:  # ValueError: JSON or UTF-8 decoding
            _warn(f"file:{path}", "cannot read DLRover's event config file %s (%s); it is ignored, the defaults "
                  "and DLROVER_EVENT_* variables apply", path, error)
            return
        if not isinstance(data, dict):
            _warn(f"file:{path}", "DLRover's event config file %s holds %s, not a JSON object; it is ignored",
                  path, type(data).__name__)
            return
        for key, value in data.items():
            if key not in _PARSERS:
                _warn(f"file:{path}:{key}", "%r in %s is not a DLRover event setting%s; it is ignored (the "
                      "settings: %s)", key, path, _did_you_mean(str(key), list(_PARSERS)), ", ".join(_PARSERS))
            elif value is not None:  # null: not set, as in DLRover
                self._set(key, value, f"{key!r} in {path}")

    def _load_env(self) -> None:
        """Settings from ``DLROVER_EVENT_<SETTING>``; an empty variable counts as unset."""
        for key in _PARSERS:
            name = get_env_key(key)
            value = os.environ.get(name, "")
            if value.strip():
                self._set(key, value, name)
        for name in os.environ:
            if name.startswith(ENV_PREFIX + "_") and name not in _VARIABLES:
                _warn(f"env:{name}", "%s is not a DLRover event variable%s; it is ignored", name,
                      _did_you_mean(name, list(_VARIABLES), ENV_PREFIX + "_"))

    def _set(self, key: str, raw: Any, origin: str) -> None:
        parser = _PARSERS[key]
        value = parser(raw)
        if value is None:
            _warn(f"{origin}={raw!r}", "%s is %r, not %s; it is ignored and %s stays %r", origin, raw,
                  _EXPECTED[parser], key, getattr(self, key))
            return
        setattr(self, key, value)
        self._origins[key] = origin


def is_dlrover_event_enabled() -> bool:
    """Whether the process's ``Config`` has events on (what DLRover's agent asks before collecting them)."""
    return Config.singleton_instance().enable is True
