"""DLRover's ``DLROVER_EVENT_*`` settings, read from the environment once per process.

Apart from the exporters so that the error handler and the default exporter
read one ``Config``, and so that a misspelt variable is handled (logged, the
default used) in one place.
"""

from __future__ import annotations

import os
import threading
from typing import Any, ClassVar, TypeVar

from otel_training._contain import log_once

T = TypeVar("T")


def one_per_process(cls: type[T], lock: Any) -> T:
    """``cls._instance``, made on first use under ``lock``: DLRover's ``singleton_instance``."""
    with lock:
        if cls._instance is None:  # type: ignore[attr-defined]
            cls._instance = cls()  # type: ignore[attr-defined]
        return cls._instance  # type: ignore[attr-defined]


def _rank() -> str:
    rank = os.getenv("RANK", "0")
    return rank if rank else "empty"


def _env_bool(name: str, default: bool) -> bool:
    value = os.getenv(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes", "y", "on", "enable", "enabled"):
        return True
    if lowered in ("false", "0", "no", "n", "off", "disable", "disabled"):
        return False
    return default


class Config:
    """DLRover's ``DLROVER_EVENT_*`` settings, read from the environment once per process.

    A value DLRover would refuse (an unknown exporter or formatter) is logged and
    the default used: a misspelt variable must not stop training at import.
    """

    _instance: ClassVar[Config | None] = None
    _instance_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self.enable = _env_bool("DLROVER_EVENT_ENABLE", True)
        self.file_dir = os.getenv("DLROVER_EVENT_FILE_DIR") or "/tmp/dlrover"
        self.text_formatter = self._choice("DLROVER_EVENT_TEXT_FORMATTER", ("LOG", "JSON"))
        self.event_exporter = self._choice("DLROVER_EVENT_EXPORTER", ("TEXT_FILE", "CONSOLE"))
        try:
            self.queue_size = max(1, int(os.getenv("DLROVER_EVENT_QUEUE_SIZE", "1024")))
        except ValueError:
            self.queue_size = 1024
        self.hook_error = _env_bool("DLROVER_EVENT_HOOK_ERROR", False)
        self.rank = _rank()
        self.pid = str(os.getpid())

    @staticmethod
    def _choice(name: str, choices: tuple[str, ...]) -> str:
        value = os.getenv(name, choices[0])
        if value not in choices:
            log_once(f"dlrover-compat:{name}", "otel_training: %s=%r is not one of %s; using %s", name, value,
                     choices, choices[0], exc_info=False)
            return choices[0]
        return value

    @classmethod
    def singleton_instance(cls) -> Config:
        return one_per_process(cls, cls._instance_lock)

    def __repr__(self) -> str:
        return f"Config({vars(self)!r})"
