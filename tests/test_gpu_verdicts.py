"""What a rank's GPU did beside the verdicts (analysis/gpu.py), as pure functions: views in, text out.

The report-level tests (tests/test_report_gpu.py) write jobs through the drain's join and the stand-in NVML;
these pin the rules: what counts as differing from the peers, and what does not.
"""

from __future__ import annotations

import time

from otel_training import semconv as sc
from otel_training.analysis.gpu import (
    GpuError,
    GpuErrors,
    GpuView,
    alert_view,
    explain,
    reason_mask,
    reason_names,
    step_errors,
    step_state,
    window_view,
)
from otel_training.analysis.hang import GroupView, RankView, render, verdict
from otel_training.analysis.hang_episodes import LOOKBACK_NS, StuckSpan, episodes

S = 1_000_000_000
T0 = 1_700_000_000 * S
FREE = GpuView(clock_mhz=1980, throttled=False)


def _at(ns: int) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ns // S)) + " UTC"


def test_a_lower_clock_and_its_reasons_are_said_against_the_peers_median() -> None:
    capped = GpuView(clock_mhz=1410, throttled=True, reasons=(sc.GPU_THROTTLE_POWER_CAP, sc.GPU_THROTTLE_HW_THERMAL))
    assert explain(capped, [FREE, GpuView(clock_mhz=1940, throttled=False), None]) == \
        "SM clock 1.41 GHz vs 1.96 GHz median, power cap, hw thermal"
    # A clock within 10 % of the peers' is load and temperature, not a cause; throttled alone still is.
    assert explain(GpuView(clock_mhz=1850, throttled=True, reasons=("sw_thermal",)), [FREE, FREE]) == \
        "throttled (sw thermal)"
    assert explain(GpuView(clock_mhz=1850, throttled=False), [FREE, FREE]) == ""


def test_a_state_most_peers_share_explains_nothing() -> None:
    capped = GpuView(clock_mhz=1410, throttled=True, reasons=(sc.GPU_THROTTLE_POWER_CAP,))
    assert explain(capped, [capped, capped, FREE]) == ""  # the whole job is capped: not this rank's GPU
    assert explain(FREE, [FREE, FREE]) == "" and explain(None, [FREE]) == ""


def test_without_peers_a_throttled_gpu_is_still_said_but_no_clock_comparison() -> None:
    capped = GpuView(clock_mhz=1410, throttled=True, reasons=(sc.GPU_THROTTLE_POWER_CAP,))
    assert explain(capped, []) == "throttled (power cap)"


def test_errors_are_named_once_each_earliest_first_and_corrected_ecc_is_not_an_error() -> None:
    errors = (GpuError(T0 + 5 * S, "xid", 79), GpuError(T0 + 2 * S, "xid", 79), GpuError(T0 + 3 * S, "xid", 48),
              GpuError(T0 + 4 * S, sc.GPU_ERROR_ECC_UNCORRECTED), GpuError(T0 + 6 * S, sc.GPU_LOST),
              GpuError(T0 + 7 * S, "xid", 13))
    text = explain(GpuView(errors=errors), [FREE])
    assert text == (f"XID 79 at {_at(T0 + 2 * S)}, XID 48 at {_at(T0 + 3 * S)}, uncorrected ECC errors at "
                    f"{_at(T0 + 4 * S)}, 2 more kind(s) of GPU error")
    assert step_errors({sc.EVENT_GPU_ERROR: [(T0, "ecc_corrected", None), (T0, "xid", 79), ("bad",)]}) == [
        GpuError(T0, "xid", 79)]


def test_a_lost_gpu_and_a_stale_sample_are_said() -> None:
    assert explain(GpuView(lost=True), [FREE]) == "GPU lost (fell off the bus)"
    fresh = GpuView(clock_mhz=1980, throttled=False, sample_age_s=0.4)
    assert explain(GpuView(clock_mhz=1980, throttled=False, sample_age_s=45), [fresh, fresh]) == \
        "no GPU sample for 45 s (NVML stopped answering)"
    stale = GpuView(sample_age_s=45)
    assert explain(stale, [stale, stale]) == ""  # every rank's samples stopped: the drains, not one GPU


def test_step_states_and_windows() -> None:
    assert step_state({}) is None
    clock, mask = step_state({sc.GPU_SM_CLOCK_MIN_MHZ: 1410, sc.GPU_THROTTLED: True,
                              sc.GPU_THROTTLE_REASONS: ["power_cap", "something_new"]})
    assert clock == 1410 and reason_names(mask) == ("power_cap",) and mask & 0x40 and mask & 0x80
    free = step_state({sc.GPU_SM_CLOCK_MIN_MHZ: 1980, sc.GPU_THROTTLED: False})
    assert free == (1980.0, 0x80)
    assert reason_mask(["hw_slowdown", "hw_power_brake"]) == 0x2 | 0x20
    # Half the steps throttled: the window is; fewer: it is not, and its reasons are not said.
    view = window_view([1410, 1410, 1980, 1980], [0x81, 0x81, 0x80, 0x80])
    assert view == GpuView(clock_mhz=1695, throttled=True, reasons=("power_cap",))
    assert window_view([1410, 1980, 1980], [0x81, 0x80, 0x80]) == GpuView(clock_mhz=1980, throttled=False)
    assert window_view([float("nan")], [0]) is None


def test_an_alert_view_dates_its_error_back_by_its_age() -> None:
    attributes = {sc.GPU_THROTTLED: False, sc.GPU_SM_CLOCK_MHZ: 1980, sc.HW_ERROR_TYPE: "xid", sc.GPU_XID: 79,
                  sc.GPU_ERROR_AGE_S: 2.5, sc.GPU_SAMPLE_AGE_S: 0.2, sc.GPU_LOST: False}
    view = alert_view(T0 + 10 * S, attributes)
    assert view is not None and view.errors == (GpuError(T0 + 10 * S - 5 * S // 2, "xid", 79),)
    assert alert_view(T0, {sc.ALERT_KIND: "stuck"}) is None  # a drain without the sampler
    # Reasons are text from the traces: only the names this package knows are said (none reach a terminal or
    # a plot's mathtext).
    odd = alert_view(T0, {sc.GPU_THROTTLED: True, sc.GPU_THROTTLE_REASONS: ["power_cap", "$\\x1b[31m"]})
    assert odd is not None and odd.reasons == ("power_cap",)


def _rank(number: int, entered: int, completed: int, gpu: GpuView | None, **flags: bool) -> RankView:
    return RankView(number, {"0": GroupView("0", entered, completed, "allreduce")}, gpu=gpu, **flags)


def test_a_hang_culprit_is_compared_with_the_ranks_waiting_on_it() -> None:
    capped = GpuView(clock_mhz=1410, throttled=True, reasons=(sc.GPU_THROTTLE_POWER_CAP,))
    result = verdict([_rank(0, 14, 13, FREE, stuck=True), _rank(1, 13, 13, capped, stuck=True),
                      _rank(2, 14, 13, FREE, stuck=True)])
    assert [c.rank for c in result.culprits] == [1]
    assert result.gpu == {1: "SM clock 1.41 GHz vs 1.98 GHz median, power cap"}
    assert render(result)[1] == "  rank 1 GPU: SM clock 1.41 GHz vs 1.98 GHz median, power cap"
    # Without GPU state anywhere, the verdict is as before.
    plain = verdict([_rank(0, 14, 13, None, stuck=True), _rank(1, 13, 13, None, stuck=True)])
    assert plain.gpu == {} and not any("GPU" in line for line in render(plain))


def test_with_no_single_culprit_a_rank_whose_gpu_differed_is_said_as_a_likely_cause() -> None:
    xid = GpuView(errors=(GpuError(T0, "xid", 79),))
    ranks = [_rank(number, 14, 13, xid if number == 3 else FREE, stuck=True) for number in range(4)]
    result = verdict(ranks)
    assert result.no_single_culprit and result.gpu == {3: f"XID 79 at {_at(T0)}"}
    assert f"  rank 3 GPU: XID 79 at {_at(T0)} (its GPU differed from the other ranks': a likely cause)" in \
        render(result)
    # Most ranks with the same XID: nothing tells one apart.
    everyone = verdict([_rank(number, 14, 13, xid if number else FREE, stuck=True) for number in range(4)])
    assert everyone.no_single_culprit and everyone.gpu == {}


def test_episode_errors_count_from_a_minute_before_the_stretch() -> None:
    spans = {rank: [StuckSpan(T0 + 100 * S, T0 + 105 * S, T0 + 110 * S,
                              GroupView("0", 14 if rank != 1 else 13, 13, "allreduce"), 10)] for rank in range(3)}
    errors = GpuErrors()
    errors.add(1, [GpuError(T0 + 100 * S - LOOKBACK_NS - S, "xid", 48)])  # before the lookback: not said
    (episode,) = episodes(spans, T0 + 200 * S, errors)
    assert [c.rank for c in episode.verdict.culprits] == [1] and episode.verdict.gpu == {}
    errors.add(1, [GpuError(T0 + 100 * S - LOOKBACK_NS + S, "xid", 79)])
    errors.add(1, [GpuError(T0 + 111 * S, "xid", 31)])  # after the stretch recovered: not said
    (episode,) = episodes(spans, T0 + 200 * S, errors)
    assert episode.verdict.gpu == {1: f"XID 79 at {_at(T0 + 100 * S - LOOKBACK_NS + S)}"}


def test_gpu_errors_are_bounded_per_rank_and_merge() -> None:
    errors, other = GpuErrors(), GpuErrors()
    errors.add(0, [GpuError(T0 + index, "xid", 13) for index in range(3 * GpuErrors.MAX_PER_RANK)])
    assert len(errors.by_rank[0]) <= 2 * GpuErrors.MAX_PER_RANK
    latest = errors.between(0, 0, None)
    assert latest[-1].time_ns == T0 + 3 * GpuErrors.MAX_PER_RANK - 1  # the latest are kept
    other.add(0, [GpuError(T0 + 10**12, "xid", 79)])
    other.add(5, [GpuError(T0, "xid", 79), GpuError(T0, "xid", 79)])
    errors.update(other)
    assert errors.between(5, T0, T0) == [GpuError(T0, "xid", 79)]  # each once
    assert errors.between(0, T0 + 10**12, None) == [GpuError(T0 + 10**12, "xid", 79)]
