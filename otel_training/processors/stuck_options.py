"""``StuckOptions``: what a ``StuckSpanProcessor`` does about a stuck span, as one frozen value.

The processor's constructor takes what it watches (``threshold_s``, ``span_names``), this policy, and what it is
wired to (its providers, clock, watchdog slot), as the SDK's processors take a few arguments. The policy is
checked when it is built, so a bad value fails where it is written, not where the processor is made.
"""

from __future__ import annotations

import dataclasses
import math
import signal as signal_module
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from otel_training.processors.stuck_rules import MIN_THRESHOLD_S
from otel_training.processors.thresholds import AdaptiveSettings

if TYPE_CHECKING:
    from otel_training.processors.stuck_actions import RemoteProcess
    from otel_training.processors.stuck_alerts import StuckEvent

#: What the detector does to the process on a span's first stuck alert.
ACTIONS = ("none", "exit", "signal")


@dataclass(frozen=True, slots=True)
class StuckOptions:
    """How a ``StuckSpanProcessor`` sets its thresholds, repeats its alerts and acts on them.

    ``StuckSpanProcessor(30, options=StuckOptions(action="exit", on_stuck=callback))``; every field has the
    default the processor had. Frozen: derive a variant with ``dataclasses.replace``.
    """

    #: Learn each span name's threshold from its completed spans (``processors.thresholds``); the processor's
    #: ``threshold_s`` is then the warm-up threshold and the upper bound.
    adaptive: bool = False
    #: The learner's settings when ``adaptive`` (default: ``AdaptiveSettings()``).
    adaptive_settings: AdaptiveSettings | None = None
    #: The first span of a name may take this long (warm-up, compilation...); None: ``DEFAULT_FIRST_FACTOR`` x
    #: its threshold.
    first_threshold_s: float | None = None
    #: The interval at which the alert repeats while the span stays open; default: the span's threshold.
    escalation_s: float | None = None
    #: Called with a ``StuckEvent`` on every alert and recovery (contained: a failing callback is logged once).
    on_stuck: Callable[[StuckEvent], Any] | Iterable[Callable[[StuckEvent], Any]] = ()
    #: On a span's first stuck alert: ``"none"``, ``"exit"`` (end the open spans, flush within
    #: ``exit_flush_timeout_s``, ``os._exit(exit_code)`` so an elastic launcher restarts the rank) or
    #: ``"signal"`` (send ``signal`` to the process).
    action: str = "none"
    #: The exit code of the ``"exit"`` action (75, EX_TEMPFAIL: a launcher restarts on it).
    exit_code: int = 75
    #: The signal of the ``"signal"`` action, a number or a name (``"SIGTERM"``).
    signal: int | str = signal_module.SIGTERM
    #: A bounded flush (``Telemetry.force_flush``) used to export alerts at once and before the ``"exit"``
    #: action; without it the stuck span's own pipeline is flushed from a helper thread.
    flush: Callable[[float], Any] | None = None
    #: Called before the ``"exit"`` action flushes (e.g. end the open spans, so the trace holds them).
    before_exit: Callable[[], Any] | None = None
    #: How long the ``"exit"`` action waits for its flush.
    exit_flush_timeout_s: float = 2.0
    #: Attach every thread's stack to the alert (off when the watched spans are another process's).
    stacks: bool = True
    #: The process whose spans these are, when it is another one: its stacks, and where actions go.
    remote: RemoteProcess | None = None

    def __post_init__(self) -> None:
        check_seconds("first_threshold_s", self.first_threshold_s)
        check_seconds("escalation_s", self.escalation_s)
        if self.action not in ACTIONS:
            raise ValueError(f"action must be 'none', 'exit' or 'signal', not {self.action!r}")
        signal_of(self.signal)  # an unknown name or number fails here, as it did in the constructor

    @classmethod
    def from_config(cls, config: Mapping[str, Any], **fields: Any) -> StuckOptions:
        """The policy ``configure()``'s ``stuck_*`` options set; ``fields`` the rest (``flush``, ``stacks``...)."""
        return cls(
            adaptive=bool(config.get("stuck_adaptive")) or config.get("stuck_threshold_s") is None,
            escalation_s=config.get("stuck_escalation_s"),
            action=config.get("stuck_action", "none"),
            exit_code=config.get("stuck_exit_code", 75),
            signal=config.get("stuck_signal", "SIGTERM"),
            **fields,
        )


#: The names of ``StuckOptions``' fields, which the processor's constructor once took as keywords.
OPTION_FIELDS = frozenset(field.name for field in dataclasses.fields(StuckOptions))


def check_seconds(label: str, value: float | None) -> None:
    """A threshold is None (its default) or a finite number of seconds, at least ``MIN_THRESHOLD_S``."""
    if value is not None and not (MIN_THRESHOLD_S <= value < math.inf):
        raise ValueError(f"{label}={value!r}: expected a finite number of seconds >= {MIN_THRESHOLD_S}")


def signal_of(signal: int | str) -> signal_module.Signals:
    """``signal`` as a ``Signals`` member (``KeyError`` for an unknown name, ``ValueError`` for a number)."""
    return signal_module.Signals[signal] if isinstance(signal, str) else signal_module.Signals(signal)


def options_with_legacy(owner: str, options: StuckOptions | None, legacy: Mapping[str, Any]) -> StuckOptions:
    """``options``, or the ``StuckOptions`` built from the fields ``owner``'s constructor once took as keywords.

    The old call form (``StuckSpanProcessor(30, action="exit")``) still works, with one ``DeprecationWarning``
    naming the keywords, pointed at the caller of ``owner``'s constructor.
    """
    if not legacy:
        return StuckOptions() if options is None else options
    unknown = [name for name in legacy if name not in OPTION_FIELDS]
    if unknown:  # what Python says for a keyword no parameter takes
        raise TypeError(f"{owner}.__init__() got an unexpected keyword argument {unknown[0]!r}")
    keywords = ", ".join(f"{name}=..." for name in legacy)
    if options is not None:
        raise TypeError(f"{owner}() takes options=StuckOptions(...) or the keywords {keywords}, not both")
    warnings.warn(f"{owner}({keywords}) is deprecated: pass options=StuckOptions({keywords}) instead",
                  DeprecationWarning, stacklevel=3)
    return dataclasses.replace(StuckOptions(), **legacy)


__all__ = ["ACTIONS", "OPTION_FIELDS", "StuckOptions", "check_seconds", "options_with_legacy", "signal_of"]
