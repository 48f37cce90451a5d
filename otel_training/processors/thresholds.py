"""Stuck thresholds per span name: fixed, or learned from the spans that completed.

Why this rule. NVIDIA resiliency-ext times out at a safety factor (5) times the
largest interval ever observed: robust to periodic slow steps, but one slow
step that recovered (a storage stall) inflates the timeout for good, and early
on the largest interval is the compilation step. ml-goodput-measurement calls a
step "normal" when it is at most median + 3·MAD: robust to outliers, but blind
to the periodic slow steps (checkpoints, evaluation) that are part of normal
training. So the learned threshold is the larger of

* ``normal_factor`` x (median + 3·MAD) of the last ``window`` durations — the
  typical step with its jitter, times a safety factor (5, as NVIDIA's), and
* ``peak_factor`` x the largest duration of the last ``peak_window`` spans —
  the periodic slow steps (a checkpoint every N steps is still in the window
  when the next one comes), with room to spare (2x),

floored at ``min_threshold_s`` (a GC pause must not page anyone) and capped at
the fixed threshold when one is given (never wait longer than the user said).
Spans that raised a stuck alert are not learned from, so a hang that finally
recovered does not teach the detector to wait for the next one. The first span
of a name gets ``first_threshold_s`` (warm-up, compilation, the first
collective), and until ``min_samples`` spans completed the fixed (or warm-up)
threshold applies.

Cost: ``observe`` is a list append on the training thread; every
``recompute_every`` observations the batch is absorbed (the peak is kept per
batch, so "the largest of the last ``peak_window``" has a granularity of one
batch) and the threshold re-learned with two sorts of ``window`` values.
"""

from __future__ import annotations

import collections
import dataclasses
import threading

SOURCE_FIXED = "fixed"
SOURCE_FIRST = "first"
SOURCE_WARMUP = "warmup"
SOURCE_ADAPTIVE = "adaptive"
SOURCE_CAPPED = "adaptive-capped"

#: Threshold while an adaptive detector has no fixed threshold and too few samples
#: (DLRover's master waits 10 minutes for a step).
DEFAULT_WARMUP_THRESHOLD_S = 600.0


@dataclasses.dataclass(frozen=True)
class Threshold:
    """A threshold and the reason for it (it goes into the alert)."""

    seconds: float
    source: str
    rule: str


@dataclasses.dataclass(frozen=True)
class AdaptiveSettings:
    min_samples: int = 10
    window: int = 128
    peak_window: int = 2048
    normal_factor: float = 5.0
    peak_factor: float = 2.0
    min_threshold_s: float = 1.0
    recompute_every: int = 64


class ThresholdLearner:
    """The threshold of one span name; ``threshold`` is a plain attribute read on the hot path."""

    def __init__(self, name: str, fixed_s: float | None, first_s: float | None,
                 adaptive: AdaptiveSettings | None) -> None:
        self.name = name
        self._fixed_s = fixed_s
        self._adaptive = adaptive
        base_s = fixed_s if fixed_s is not None else DEFAULT_WARMUP_THRESHOLD_S
        base_source = SOURCE_FIXED if adaptive is None else SOURCE_WARMUP
        base_rule = (f"fixed {base_s:g} s" if adaptive is None
                     else f"{base_s:g} s until {adaptive.min_samples} spans of {name!r} completed")
        self._base = Threshold(base_s, base_source, base_rule)
        first = first_s if first_s is not None else base_s
        #: Read by on_start: the first span of the name gets its own allowance.
        self.threshold: Threshold = (
            Threshold(first, SOURCE_FIRST, f"first {name!r} span allowance {first:g} s (warm-up)")
            if first != base_s else self._base
        )
        self.count = 0
        self._lock = threading.Lock()
        self._pending: list[float] = []
        if adaptive is not None:
            self._recent: collections.deque[float] = collections.deque(maxlen=adaptive.window)
            # The largest duration of each absorbed batch, over about the last peak_window spans.
            self._batch_peaks: collections.deque[float] = collections.deque(
                maxlen=max(1, adaptive.peak_window // adaptive.recompute_every))

    def after_fork(self) -> None:
        """A forked child must not inherit a lock some parent thread held at fork time."""
        self._lock = threading.Lock()

    def observe(self, duration_s: float) -> None:
        """A span of this name completed normally after ``duration_s``."""
        self.count += 1
        adaptive = self._adaptive
        if adaptive is None:  # fixed: only the first-span allowance to retire
            if self.threshold is not self._base:
                self.threshold = self._base
            return
        pending = self._pending
        pending.append(duration_s)  # atomic under the GIL: no lock on the hot path
        if len(pending) >= adaptive.recompute_every or self.count <= adaptive.min_samples:
            self._absorb(adaptive)

    def _absorb(self, adaptive: AdaptiveSettings) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
            if not batch:
                return
            self._recent.extend(batch)
            self._batch_peaks.append(max(batch))
            if self.count < adaptive.min_samples:
                self.threshold = self._base  # the first span's allowance is retired
                return
            self.threshold = self._learn(adaptive)

    def _learn(self, adaptive: AdaptiveSettings) -> Threshold:
        samples = sorted(self._recent)
        median = _median_of_sorted(samples)
        mad = _median_of_sorted(sorted([abs(value - median) for value in samples]))
        peak = max(self._batch_peaks)
        normal = adaptive.normal_factor * (median + 3.0 * mad)
        spikes = adaptive.peak_factor * peak
        seconds = max(normal, spikes, adaptive.min_threshold_s)
        source = SOURCE_ADAPTIVE
        rule = (f"max({adaptive.normal_factor:g} x (median {median:.4g} s + 3 x MAD {mad:.4g} s), "
                f"{adaptive.peak_factor:g} x peak {peak:.4g} s of last {min(self.count, adaptive.peak_window)}, "
                f"floor {adaptive.min_threshold_s:g} s) over {len(samples)} recent spans")
        if self._fixed_s is not None and seconds > self._fixed_s:
            seconds, source = self._fixed_s, SOURCE_CAPPED
            rule += f", capped at the fixed {self._fixed_s:g} s"
        return Threshold(seconds, source, rule)


def _median_of_sorted(values: list[float]) -> float:
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2
