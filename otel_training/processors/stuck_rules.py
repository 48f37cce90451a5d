"""Which spans the stuck detector watches, and with which threshold: rules in, a learner per span name out.

Rules are span names or fnmatch patterns, each with its own threshold or the
default one (``"training.step=30"``, ``{"training.*": None}``). The first rule
that matches a name decides; its learner (``processors.thresholds``) gives the
threshold, fixed or learned from the name's completed spans. Names are looked
up on every span start, so each name's answer is cached (bounded).
"""

from __future__ import annotations

import fnmatch
import threading
from collections.abc import Iterable, Mapping

from otel_training import semconv as sc
from otel_training.processors.thresholds import AdaptiveSettings, ThresholdLearner

DEFAULT_SPAN_NAMES = (sc.SPAN_STEP,)
#: Shortest threshold and escalation interval: below this a stuck span raises alerts every few
#: milliseconds (thousands of spans a second) and keeps a core busy doing it.
MIN_THRESHOLD_S = 0.01
#: The first span of a name may take this many times the threshold (DLRover: 120 vs 10 minutes).
DEFAULT_FIRST_FACTOR = 10.0
_MAX_CACHED_NAMES = 4096
_PATTERN_CHARS = frozenset("*?[")
#: Spans judged by the rule of the span they time, when no rule names them: a step's device
#: execution by the step's threshold (each keeps its own learned history).
TIMED_AS = {sc.SPAN_DEVICE_STEP: sc.SPAN_STEP}
MISSING = object()


def parse_span_names(span_names: Iterable[str] | Mapping[str, float | None]) -> dict[str, float | None]:
    """``{"name": seconds or None}`` from names, patterns or ``"name=seconds"`` strings.

    Raises ``ValueError`` for an empty name or a threshold that is not a number >= 0.
    """
    if isinstance(span_names, str):
        span_names = [span_names]
    items = (span_names.items() if isinstance(span_names, Mapping)
             else (str(item).partition("=")[::2] for item in span_names))
    rules: dict[str, float | None] = {}
    for name, seconds in items:
        name = str(name).strip()
        if not name:
            raise ValueError("a watched span name is empty")
        if seconds is None or (isinstance(seconds, str) and not seconds.strip()):
            rules[name] = None
            continue
        try:
            value = float(seconds)
        except (TypeError, ValueError):
            raise ValueError(f"threshold {seconds!r} of {name!r} is not a number of seconds") from None
        if not value >= MIN_THRESHOLD_S or value == float("inf"):
            raise ValueError(f"threshold {seconds!r} of {name!r} must be a finite number of seconds "
                             f">= {MIN_THRESHOLD_S}")
        rules[name] = value
    return rules


class StuckRules:
    """The rules and the learner of each span name they match (None: not watched)."""

    def __init__(self, rules: Mapping[str, float | None], threshold_s: float | None,
                 first_threshold_s: float | None, adaptive: AdaptiveSettings | None) -> None:
        self.rules = dict(rules)
        self.threshold_s = threshold_s
        #: The first span of a name may take this long (None: ``DEFAULT_FIRST_FACTOR`` x its threshold).
        self.first_threshold_s = first_threshold_s
        self.adaptive = adaptive
        self.learners: dict[str, ThresholdLearner | None] = {}
        self._lock = threading.RLock()

    def learner_for(self, name: str) -> ThresholdLearner | None:
        learner = self.learners.get(name, MISSING)
        if learner is not MISSING:
            return learner  # type: ignore[return-value]  # not MISSING: a cached learner or None
        with self._lock:
            learner = self.learners.get(name, MISSING)
            if learner is MISSING:
                learner = self._match(name)
                if learner is not None or len(self.learners) < _MAX_CACHED_NAMES:
                    self.learners[name] = learner
        return learner  # type: ignore[return-value]  # not MISSING: cached, or just matched

    def after_fork(self) -> None:
        """A forked child learns on: fresh locks, the parent's history kept."""
        self._lock = threading.RLock()
        for learner in self.learners.values():
            if learner is not None:
                learner.after_fork()

    def _match(self, name: str) -> ThresholdLearner | None:
        if name == sc.SPAN_BETWEEN_STEPS and name not in self.rules:
            # The host between steps is judged by the step's threshold (its learner is shared, never fed): the
            # device step's where a device timeline times steps, else the host step's (a CPU job's gaps,
            # pipeline/host_gaps.py), whose first-span allowance the steps before the gap retired.
            device = self.learner_for(sc.SPAN_DEVICE_STEP)
            return device if device is not None and device.count else self.learner_for(sc.SPAN_STEP)
        learner = self._match_rule(name, name)
        if learner is None and name in TIMED_AS:
            learner = self._match_rule(TIMED_AS[name], name)
        return learner

    def _match_rule(self, rule_name: str, name: str) -> ThresholdLearner | None:
        """A learner for spans named ``name`` from the first rule matching ``rule_name``."""
        for rule, seconds in self.rules.items():
            if rule == rule_name or (_PATTERN_CHARS & set(rule) and fnmatch.fnmatchcase(rule_name, rule)):
                fixed = seconds if seconds is not None else self.threshold_s
                first = self.first_threshold_s
                if first is None:
                    first = DEFAULT_FIRST_FACTOR * fixed if fixed is not None else None
                elif fixed is not None:
                    first = max(first, fixed)  # an allowance, never stricter than the name's own threshold
                return ThresholdLearner(name, fixed, first, self.adaptive)
        return None
