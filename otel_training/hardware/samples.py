"""The device's recent samples, and what they say about one step: the join of GPU state to step spans.

Why this shape: the drain ends thousands of spans a second, the sampler adds one sample a second. So the
sampler does the work once per sample (which throttle reasons began, which errors were counted since the
previous sample), and a step's end only walks back from the newest sample to the step's start: one or two
samples for a step shorter than the interval, under a lock the sampler holds for an append.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

from otel_training import semconv as sc
from otel_training.hardware.nvml import Sample, reasons

#: Samples kept: at the default interval of 1 s, the last eight minutes (a step longer than that is joined
#: to what is left of it).
CAPACITY = 512


class SampleLog:
    """The newest samples, oldest first: appended by the sampler's thread, read by the drain's."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._samples: collections.deque[Sample] = collections.deque(maxlen=capacity)
        self._lock = threading.Lock()
        self.latest: Sample | None = None
        #: The newest sample with readings (a lost GPU's last sample has none).
        self.last_read: Sample | None = None
        #: XID errors seen since the sampler began, by code (``hw.errors`` of type xid).
        self.xid_counts: dict[int, int] = {}
        #: The latest serious error (an XID, uncorrected ECC errors, the GPU lost): (time, ``hw.error.type``,
        #: XID code or None), for the stuck alerts' device state.
        self.last_error: tuple[int, str, int | None] | None = None

    def add(self, sample: Sample) -> None:
        """Log ``sample``, with what began since the previous one."""
        previous = self.latest
        sample.began_mask = sample.throttle_mask & ~(previous.throttle_mask if previous is not None else 0)
        errors: list[tuple[str, int | None]] = [(sc.GPU_ERROR_XID, code) for code in sample.xids]
        if previous is not None:
            for kind, now, before in ((sc.GPU_ERROR_ECC_UNCORRECTED, sample.ecc_uncorrected, previous.ecc_uncorrected),
                                      (sc.GPU_ERROR_ECC_CORRECTED, sample.ecc_corrected, previous.ecc_corrected)):
                if now is not None and before is not None and now > before:
                    errors.append((kind, None))
        sample.new_errors = tuple(errors)
        for code in sample.xids:
            self.xid_counts[code] = self.xid_counts.get(code, 0) + 1
        serious = [error for error in errors if error[0] != sc.GPU_ERROR_ECC_CORRECTED]
        if sample.lost:
            serious.append((sc.GPU_LOST, None))
        if serious:
            self.last_error = (sample.time_ns, *serious[-1])
        with self._lock:
            self._samples.append(sample)
            self.latest = sample
            if not sample.lost:
                self.last_read = sample

    def during(self, start_ns: int, end_ns: int, stale_ns: int) -> tuple[Sample | None, list[Sample]]:
        """The sample in effect at ``start_ns`` (None if older than ``stale_ns``), and those taken up to
        ``end_ns`` after it, newest first."""
        inside: list[Sample] = []
        with self._lock:
            for sample in reversed(self._samples):
                if sample.time_ns > end_ns:
                    continue
                if sample.time_ns < start_ns:
                    return (sample if start_ns - sample.time_ns <= stale_ns else None), inside
                inside.append(sample)
        return None, inside


def step_state(before: Sample | None, inside: list[Sample]) -> dict[str, Any] | None:
    """A step's device attributes from its samples: the minimum SM clock, whether it throttled and why.
    None when no sample covers the step."""
    mask = before.throttle_mask if before is not None else 0
    lowest = before.sm_clock_mhz if before is not None else None
    for sample in inside:
        mask |= sample.throttle_mask
        clock = sample.sm_clock_mhz
        if clock is not None and (lowest is None or clock < lowest):
            lowest = clock
    if before is None and not inside:
        return None
    attributes: dict[str, Any] = {sc.GPU_THROTTLED: bool(mask)}
    if mask:
        attributes[sc.GPU_THROTTLE_REASONS] = reasons(mask)
    if lowest is not None:
        attributes[sc.GPU_SM_CLOCK_MIN_MHZ] = lowest
    return attributes


def step_events(inside: list[Sample], device: dict[str, Any]) -> list[tuple[str, dict[str, Any], int]]:
    """The span events of a step: each throttle reason and each error that began during it, oldest first."""
    events: list[tuple[str, dict[str, Any], int]] = []
    for sample in reversed(inside):
        if sample.began_mask:
            events.append((sc.EVENT_GPU_THROTTLE_BEGAN, {sc.GPU_THROTTLE_REASONS: reasons(sample.began_mask),
                                                         sc.HW_ID: device.get(sc.HW_ID, "")}, sample.time_ns))
        for kind, code in sample.new_errors:
            attributes: dict[str, Any] = {sc.HW_ERROR_TYPE: kind, sc.HW_ID: device.get(sc.HW_ID, "")}
            if code is not None:
                attributes[sc.GPU_XID] = code
            events.append((sc.EVENT_GPU_ERROR, attributes, sample.time_ns))
        if sample.lost:
            events.append((sc.EVENT_GPU_ERROR, {sc.HW_ERROR_TYPE: sc.GPU_LOST, sc.HW_ID: device.get(sc.HW_ID, "")},
                           sample.time_ns))
    return events
