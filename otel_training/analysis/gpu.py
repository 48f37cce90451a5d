"""The GPU's own state beside a verdict: what a named rank's GPU did that its peers' did not (issue 31).

Why here, apart from the rules: the straggler and hang verdicts name a rank; the next question on call is
"is it the GPU?". The spans already carry the answer, from the drain's NVML sampler (docs/gpu-state.md):
each step's lowest SM clock and throttle reasons (``training.gpu.sm_clock.min_mhz``,
``training.gpu.throttle_reasons``), its ``training.gpu.error`` events (XID, uncorrected ECC, the GPU lost),
and each stuck alert's device state at alert time. This module turns those into one ``GpuView`` per rank over
a stretch (a straggler window, a hang) and ``explain`` compares a rank's view with its peers' over the same
stretch: "SM clock 1.41 GHz vs 1.98 GHz median, power cap", "XID 79 at 12:04:31 UTC". Pure: attributes in,
text out; the report and the hang tracker call it.

What counts as differing: an SM clock below ``CLOCK_RATIO`` of the peers' median (clocks move a few percent
with load and temperature; a power cap or a hot GPU takes tens of percent); throttled (for at least half of
a window's steps) while most peers were not; a sample much older than the peers' (NVML stopped answering);
and any error (an XID, uncorrected ECC errors, the GPU lost: never normal, named whatever the peers had).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from otel_training import semconv as sc

#: Throttle reasons in a fixed order: bit ``i`` of a mask is ``REASONS[i]``.
REASONS: tuple[str, ...] = (sc.GPU_THROTTLE_POWER_CAP, sc.GPU_THROTTLE_HW_SLOWDOWN, sc.GPU_THROTTLE_SYNC_BOOST,
                            sc.GPU_THROTTLE_SW_THERMAL, sc.GPU_THROTTLE_HW_THERMAL, sc.GPU_THROTTLE_HW_POWER_BRAKE)
#: Mask bits beyond the reasons: throttled for a reason not named above, and "this step had a GPU state".
UNNAMED, KNOWN = 0x40, 0x80
#: A clock below this share of the peers' median is said (10 %: clocks move a few percent with load).
CLOCK_RATIO = 0.9
#: A window is throttled for a rank when at least this share of its steps with a GPU state were.
THROTTLED_SHARE = 0.5
#: A stuck alert's GPU sample older than this, where the peers' are fresh, says NVML stopped answering.
STALE_S = 30.0
#: Errors named per rank at most (the earliest of each kind and code).
MAX_NAMED = 3
#: Where a step span's ``training.gpu.error`` events are, as the report reads them: under the event's name in
#: its attributes, as (time ns, ``hw.error.type``, XID code or None). A name no attribute has.
ERRORS_KEY = sc.EVENT_GPU_ERROR
#: The errors that explain (corrected ECC errors are the memory doing its job).
SERIOUS = frozenset({sc.GPU_ERROR_XID, sc.GPU_ERROR_ECC_UNCORRECTED, sc.GPU_LOST})
_NAN = float("nan")


@dataclasses.dataclass(frozen=True, slots=True)
class GpuError:
    time_ns: int
    kind: str
    xid: int | None = None

    def describe(self) -> str:
        at = time.strftime("%H:%M:%S", time.gmtime(self.time_ns // 1_000_000_000)) + " UTC"
        if self.kind == sc.GPU_ERROR_XID:
            return f"XID {self.xid if self.xid is not None else '?'} at {at}"
        if self.kind == sc.GPU_ERROR_ECC_UNCORRECTED:
            return f"uncorrected ECC errors at {at}"
        return f"GPU lost (fell off the bus) at {at}"


@dataclasses.dataclass(frozen=True, slots=True)
class GpuView:
    """A rank's GPU over a stretch (a straggler window, a stuck alert): None where nothing says."""

    clock_mhz: float | None = None
    throttled: bool | None = None
    reasons: tuple[str, ...] = ()
    power_w: float | None = None
    lost: bool = False
    sample_age_s: float | None = None
    errors: tuple[GpuError, ...] = ()

    def with_errors(self, errors: Iterable[GpuError]) -> GpuView:
        merged = tuple(sorted(set(self.errors) | set(errors), key=lambda error: error.time_ns))
        return dataclasses.replace(self, errors=merged) if merged != self.errors else self


def reason_mask(reasons: Any) -> int:
    """The mask of a step's throttle reasons (``training.gpu.throttle_reasons``: a list of names)."""
    mask = 0
    if isinstance(reasons, (list, tuple)):
        for name in reasons:
            mask |= 1 << REASONS.index(name) if name in REASONS else UNNAMED
    return mask


def reason_names(mask: int) -> tuple[str, ...]:
    return tuple(name for bit, name in enumerate(REASONS) if mask & (1 << bit))


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def step_state(attributes: Mapping[str, Any]) -> tuple[float, int] | None:
    """A step span's GPU state as (lowest SM clock MHz or NaN, mask with ``KNOWN``); None without one."""
    clock = attributes.get(sc.GPU_SM_CLOCK_MIN_MHZ)
    throttled = attributes.get(sc.GPU_THROTTLED)
    if clock is None and throttled is None:
        return None
    if type(clock) is not int and type(clock) is not float:  # a bool, a string: no reading
        clock = _NAN
    if throttled is not True:
        return float(clock), KNOWN
    return float(clock), KNOWN | (reason_mask(attributes.get(sc.GPU_THROTTLE_REASONS)) or UNNAMED)


def window_view(clocks: Sequence[float], masks: Sequence[int]) -> GpuView | None:
    """A window of a rank's steps: the median of their lowest SM clocks, throttled if half of them were."""
    known = [mask for mask in masks if mask & KNOWN]
    if not known:
        return None
    valid = [clock for clock in clocks if clock == clock]  # NaN: a step without a clock reading
    throttled = [mask for mask in known if mask & ~KNOWN]
    share = len(throttled) / len(known)
    union = 0
    for mask in throttled:
        union |= mask
    return GpuView(clock_mhz=statistics.median(valid) if valid else None, throttled=share >= THROTTLED_SHARE,
                   reasons=reason_names(union) if share >= THROTTLED_SHARE else ())


def alert_view(alert_ns: int, attributes: Mapping[str, Any]) -> GpuView | None:
    """A stuck alert's device state (``GpuState.alert_context`` in the drain); None when it has none."""
    if sc.GPU_THROTTLED not in attributes and sc.GPU_LOST not in attributes and sc.GPU_SM_CLOCK_MHZ not in attributes:
        return None
    reasons = attributes.get(sc.GPU_THROTTLE_REASONS)  # text from the traces: only known names are said
    errors: tuple[GpuError, ...] = ()
    kind, age = attributes.get(sc.HW_ERROR_TYPE), _number(attributes.get(sc.GPU_ERROR_AGE_S))
    if isinstance(kind, str) and kind in SERIOUS and age is not None and age >= 0:
        xid = attributes.get(sc.GPU_XID)
        errors = (GpuError(alert_ns - int(age * 1e9), kind, xid if isinstance(xid, int) else None),)
    return GpuView(clock_mhz=_number(attributes.get(sc.GPU_SM_CLOCK_MHZ)),
                   throttled=bool(attributes.get(sc.GPU_THROTTLED)) if sc.GPU_THROTTLED in attributes else None,
                   reasons=reason_names(reason_mask(reasons)),  # the names this package knows, none other
                   power_w=_number(attributes.get(sc.GPU_POWER_W)), lost=attributes.get(sc.GPU_LOST) is True,
                   sample_age_s=_number(attributes.get(sc.GPU_SAMPLE_AGE_S)), errors=errors)


def step_errors(attributes: Mapping[str, Any]) -> list[GpuError]:
    """A step span's serious GPU errors, from its events as the report read them (``ERRORS_KEY``)."""
    found = []
    for item in attributes.get(ERRORS_KEY) or ():
        try:
            at, kind, xid = item
        except (TypeError, ValueError):
            continue
        if kind in SERIOUS and isinstance(at, int):
            found.append(GpuError(at, kind, xid if isinstance(xid, int) and not isinstance(xid, bool) else None))
    return found


def explain(view: GpuView | None, peers: Iterable[GpuView | None]) -> str:
    """How ``view`` differs from ``peers`` (the other ranks over the same stretch), or "" when it does not."""
    if view is None:
        return ""
    known = [peer for peer in peers if peer is not None]
    parts: list[str] = []
    clocks = [peer.clock_mhz for peer in known if peer.clock_mhz is not None]
    if view.clock_mhz is not None and clocks and view.clock_mhz < CLOCK_RATIO * statistics.median(clocks):
        parts.append(f"SM clock {view.clock_mhz / 1000:.2f} GHz vs {statistics.median(clocks) / 1000:.2f} GHz median")
    throttled = [peer.throttled for peer in known if peer.throttled is not None]
    if view.throttled and (not throttled or 2 * sum(throttled) < len(throttled)):
        reasons = ", ".join(name.replace("_", " ") for name in view.reasons) or "throttled"
        parts.append(reasons if parts else f"throttled ({reasons})" if view.reasons else "throttled")
    ages = [peer.sample_age_s for peer in known if peer.sample_age_s is not None]
    stale = view.sample_age_s is not None and view.sample_age_s >= STALE_S
    if stale and (not ages or statistics.median(ages) < STALE_S):
        parts.append(f"no GPU sample for {view.sample_age_s:.0f} s (NVML stopped answering)")
    named: dict[tuple[str, int | None], GpuError] = {}
    for error in sorted(view.errors, key=lambda error: error.time_ns):
        named.setdefault((error.kind, error.xid), error)
    parts.extend(error.describe() for error in list(named.values())[:MAX_NAMED])
    if len(named) > MAX_NAMED:
        parts.append(f"{len(named) - MAX_NAMED} more kind(s) of GPU error")
    if view.lost and not any(error.kind == sc.GPU_LOST for error in named.values()):
        parts.append("GPU lost (fell off the bus)")
    return ", ".join(parts)


class GpuErrors:
    """Each rank's serious GPU errors from its steps' events, the latest ``MAX_PER_RANK`` kept; parts merge."""

    MAX_PER_RANK = 256

    def __init__(self) -> None:
        self.by_rank: dict[int, list[GpuError]] = {}

    def add(self, rank: int, errors: Iterable[GpuError]) -> None:
        kept = self.by_rank.setdefault(rank, [])
        kept.extend(errors)
        if len(kept) > 2 * self.MAX_PER_RANK:
            self._trim(kept)

    def _trim(self, kept: list[GpuError]) -> None:
        unique = sorted(set(kept), key=lambda error: error.time_ns)[-self.MAX_PER_RANK:]
        kept[:] = unique

    def update(self, other: GpuErrors) -> None:
        for rank, errors in other.by_rank.items():
            self.add(rank, errors)

    def between(self, rank: int, begin_ns: int, end_ns: int | None) -> list[GpuError]:
        """The rank's errors from ``begin_ns`` to ``end_ns`` (None: no end), oldest first, each once."""
        found = {error for error in self.by_rank.get(rank, ())
                 if error.time_ns >= begin_ns and (end_ns is None or error.time_ns <= end_ns)}
        return sorted(found, key=lambda error: error.time_ns)
