"""The GPU's state on a rank's steps, as the report keeps it: per straggler window, and beside the plot's steps.

Why a module of its own: the step spans of a job whose drain sampled NVML carry each step's lowest SM clock
and throttle reasons (docs/gpu-state.md). The report keeps them only for steps that have them (a job without
GPU state pays nothing), 13 bytes a step while a file is read, by the step's index among the rank's steps
(``digest.StepColumns``); once the rank is finished (``digest.rank_part``) they are folded into each straggler
window (its median lowest clock, the share of its steps throttled and their reasons) and the plot's sample,
and the per-step columns are dropped.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Sequence

from otel_training.analysis.gpu import KNOWN, THROTTLED_SHARE, GpuView, reason_names, window_view

_NAN = float("nan")


class GpuSteps:
    """A rank's steps that carried a GPU state, by index among its steps, in increasing index order."""

    __slots__ = ("clocks", "indices", "masks")

    def __init__(self) -> None:
        self.indices = array("q")
        self.clocks = array("f")  # MHz, NaN where the step had no clock reading (4 bytes: exact to 16M MHz)
        self.masks = array("B")  # analysis.gpu's mask: reasons, UNNAMED, KNOWN

    def add(self, index: int, state: tuple[float, int]) -> None:
        self.indices.append(index)
        self.clocks.append(state[0])
        self.masks.append(state[1] & 0xFF)

    def __len__(self) -> int:
        return len(self.indices)

    def at(self, index: int) -> float:
        """The lowest SM clock of step ``index`` (NaN: none)."""
        position = bisect_left(self.indices, index)
        if position < len(self.indices) and self.indices[position] == index:
            return float(self.clocks[position])
        return _NAN


class RankGpu:
    """A finished rank's GPU state: each straggler window's, and the lowest clock of each step of its sample."""

    __slots__ = ("sample_clocks", "window_clocks", "window_masks", "window_share")

    def __init__(self, windows: int) -> None:
        self.window_clocks = array("d", [_NAN]) * windows  # median lowest SM clock, MHz
        self.window_share = array("d", [_NAN]) * windows  # share of its steps with a state that were throttled
        self.window_masks = array("B", [0]) * windows  # the reasons of its throttled steps, with KNOWN
        self.sample_clocks = array("d")

    def view(self, index: int) -> GpuView | None:
        """Window ``index`` as ``analysis.gpu`` compares it with the other ranks' same window."""
        if index >= len(self.window_masks) or not self.window_masks[index] & KNOWN:
            return None
        clock = self.window_clocks[index]
        throttled = self.window_share[index] >= THROTTLED_SHARE
        return GpuView(clock_mhz=None if math.isnan(clock) else clock, throttled=throttled,
                       reasons=reason_names(self.window_masks[index]) if throttled else ())

    @property
    def has_clocks(self) -> bool:
        return any(not math.isnan(clock) for clock in self.sample_clocks)


def rank_gpu(gpu: GpuSteps, order: Sequence[int] | None, bounds: Sequence[tuple[int, int]],
             sample: Sequence[int]) -> RankGpu:
    """Fold a rank's GPU steps into its windows (``bounds``: (first, end) positions in the order the steps
    ran; ``order``: position -> index, None when read in that order) and its plot sample (indices)."""
    result = RankGpu(len(bounds))
    count = bounds[-1][1] if bounds else 0
    # Every window but a last partial one is as long as the first; the partial one starts where a next whole
    # one would: position // size is a step's window, for every position before ``count``.
    size = max(1, bounds[0][1] - bounds[0][0]) if bounds else 1
    entries: Iterable[tuple[int, float, int]]
    if order is None:  # read in the order they ran: the GPU steps' positions are their indices, increasing
        entries = zip(gpu.indices, gpu.clocks, gpu.masks)
    else:
        position_of = array("q", [0]) * len(order)
        for position, index in enumerate(order):
            position_of[index] = position
        entries = sorted(zip((position_of[index] for index in gpu.indices), gpu.clocks, gpu.masks))
    clocks: list[float]
    masks: list[int]
    current, clocks, masks = -1, [], []
    for position, clock, mask in entries:
        if position >= count:
            break  # past the last window (a rest shorter than half a window)
        window = position // size
        if window != current:
            _fold(result, current, clocks, masks)
            current, clocks, masks = window, [], []
        clocks.append(clock)
        masks.append(mask)
    _fold(result, current, clocks, masks)
    result.sample_clocks.extend(gpu.at(index) for index in sample)
    return result


def _fold(result: RankGpu, window: int, clocks: list[float], masks: list[int]) -> None:
    """One window's steps with a GPU state into ``result``: its median lowest clock, share throttled, reasons."""
    view = window_view(clocks, masks) if window >= 0 else None
    if view is None:
        return
    known = [mask for mask in masks if mask & KNOWN]
    throttled = [mask for mask in known if mask & ~KNOWN]
    union = KNOWN
    for mask in throttled:
        union |= mask
    result.window_clocks[window] = view.clock_mhz if view.clock_mhz is not None else _NAN
    result.window_share[window] = len(throttled) / len(known)
    result.window_masks[window] = union
