"""``StuckOptions``, the stuck detector's policy as one value, and the constructor's old keyword form."""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import signal
import warnings

import pytest
from clocks import FakeClock
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

import otel_training
from otel_training import StuckEvent, StuckOptions, StuckSpanProcessor
from otel_training import semconv as sc
from otel_training.processors.stuck_options import OPTION_FIELDS
from otel_training.processors.thresholds import AdaptiveSettings


def test_the_defaults_are_the_constructors_old_ones() -> None:
    options = StuckOptions()
    assert (options.adaptive, options.adaptive_settings, options.first_threshold_s, options.escalation_s) == (
        False, None, None, None)
    assert (options.on_stuck, options.action, options.exit_code, options.signal) == ((), "none", 75, signal.SIGTERM)
    assert (options.flush, options.before_exit, options.exit_flush_timeout_s, options.stacks, options.remote) == (
        None, None, 2.0, True, None)
    old_keywords = {"adaptive", "adaptive_settings", "first_threshold_s", "escalation_s", "on_stuck", "action",
                    "exit_code", "signal", "flush", "before_exit", "exit_flush_timeout_s", "stacks", "remote"}
    assert old_keywords == OPTION_FIELDS


def test_it_is_frozen_and_slotted() -> None:
    options = StuckOptions(action="exit")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.action = "none"
    assert not hasattr(options, "__dict__")
    assert dataclasses.replace(options, exit_code=3) == StuckOptions(action="exit", exit_code=3)


@pytest.mark.parametrize(("fields", "message"), [
    ({"first_threshold_s": 0.001}, r"first_threshold_s=0\.001: expected a finite number of seconds >= 0\.01"),
    ({"first_threshold_s": math.inf}, r"first_threshold_s=inf: expected a finite number of seconds >= 0\.01"),
    ({"escalation_s": 0.0}, r"escalation_s=0\.0: expected a finite number of seconds >= 0\.01"),
    ({"action": "restart"}, r"action must be 'none', 'exit' or 'signal', not 'restart'"),
    ({"signal": 10**6}, r"1000000 is not a valid Signals"),
])
def test_bad_values_fail_where_they_are_written(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StuckOptions(**fields)


def test_a_signal_is_a_name_or_a_number() -> None:
    assert StuckOptions(signal="SIGUSR1").signal == "SIGUSR1"
    with pytest.raises(KeyError, match="SIGNOPE"):
        StuckOptions(signal="SIGNOPE")


def test_the_new_form_warns_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        processor = StuckSpanProcessor(30, [sc.SPAN_STEP], StuckOptions(action="exit"), watcher=False)
        adaptive = StuckSpanProcessor(options=StuckOptions(adaptive=True), watcher=False)
    assert processor.options.action == "exit" and processor.threshold_for(sc.SPAN_STEP) is not None
    assert adaptive.options.adaptive


def test_the_old_keywords_still_work_with_one_warning_naming_them() -> None:
    clock, events = FakeClock(), []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        processor = StuckSpanProcessor(10, first_threshold_s=10, on_stuck=events.append, stacks=False,
                                       clock=clock, watcher=False, meter_provider=MeterProvider())
    (warning,) = caught
    assert warning.category is DeprecationWarning and warning.filename == __file__  # the caller's line
    assert str(warning.message) == ("StuckSpanProcessor(first_threshold_s=..., on_stuck=..., stacks=...) is "
                                    "deprecated: pass options=StuckOptions(first_threshold_s=..., on_stuck=..., "
                                    "stacks=...) instead")
    assert processor.options == StuckOptions(first_threshold_s=10, on_stuck=events.append, stacks=False)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    step = provider.get_tracer("test").start_span(sc.SPAN_STEP)
    clock.now += 10
    assert processor.tick() == 1
    assert [event.kind for event in events] == [sc.ALERT_KIND_STUCK]
    assert isinstance(events[0], StuckEvent) and events[0].stacks is None  # stacks=False was honoured
    step.end()
    provider.shutdown()


def test_old_keywords_are_checked_as_before() -> None:
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="action must be"):
        StuckSpanProcessor(30, action="restart")
    with pytest.warns(DeprecationWarning):
        processor = StuckSpanProcessor(adaptive=True, adaptive_settings=AdaptiveSettings(), watcher=False)
    assert processor.options.adaptive


def test_an_unknown_keyword_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match=r"StuckSpanProcessor.__init__\(\) got an unexpected keyword argument "
                                        r"'threshold'"):
        StuckSpanProcessor(threshold=30)
    with pytest.raises(TypeError, match="'bogus'"):
        StuckSpanProcessor(30, action="exit", bogus=1)


def test_options_and_old_keywords_together_are_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"options=StuckOptions\(\.\.\.\) or the keywords action=\.\.\., not both"):
        StuckSpanProcessor(30, options=StuckOptions(), action="exit")


def test_a_missing_threshold_is_refused_unless_adaptive() -> None:
    with pytest.raises(ValueError, match="needs threshold_s, per-name thresholds or adaptive=True"):
        StuckSpanProcessor(options=StuckOptions())
    assert StuckSpanProcessor(span_names={sc.SPAN_STEP: 5}, watcher=False).threshold_for(sc.SPAN_STEP) is not None


def test_from_options_builds_the_policy_from_the_config_and_the_fields_given() -> None:
    config = {"stuck_threshold_s": 30.0, "stuck_action": "signal", "stuck_signal": "SIGUSR1", "stuck_exit_code": 70,
              "stuck_escalation_s": 60.0, "stuck_span_names": None}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # fields given to from_options are no deprecated form
        processor = StuckSpanProcessor.from_options(config, watcher=False, stacks=False)
    assert processor.options == StuckOptions(action="signal", signal="SIGUSR1", exit_code=70, escalation_s=60.0,
                                             stacks=False)
    assert processor.threshold_for(sc.SPAN_STEP).seconds == 300.0  # the first step's: 10 x the threshold
    adaptive = StuckSpanProcessor.from_options({"stuck_threshold_s": None}, watcher=False)
    assert adaptive.options.adaptive  # no threshold: learned


def test_it_is_a_public_name() -> None:
    assert otel_training.StuckOptions is StuckOptions and "StuckOptions" in otel_training.__all__


# -- a user's callables without a name (the review of the options change found these) ----------------------------
def _stuck_once(options: StuckOptions) -> None:
    now = [1000.0]
    processor = StuckSpanProcessor(10, [sc.SPAN_STEP], dataclasses.replace(options, first_threshold_s=10, stacks=False),
                                   clock=lambda: now[0], watcher=False, meter_provider=MeterProvider())
    provider = TracerProvider()
    provider.add_span_processor(processor)
    provider.get_tracer("t").start_span(sc.SPAN_STEP)
    now[0] += 10
    processor.tick()


def test_the_exit_action_runs_a_before_exit_without_a_name_and_exits(monkeypatch: pytest.MonkeyPatch) -> None:
    exited: list[int] = []
    ran: list[int] = []
    monkeypatch.setattr(os, "_exit", exited.append)
    _stuck_once(StuckOptions(action="exit", before_exit=functools.partial(ran.append, 1),
                             flush=lambda timeout_s: None, exit_flush_timeout_s=0.1))
    assert ran == [1] and exited == [75]


def test_two_failing_partial_callbacks_are_each_logged(caplog: pytest.LogCaptureFixture) -> None:
    def broken(which: str, event: object) -> None:
        raise RuntimeError(which)

    with caplog.at_level(logging.WARNING, logger="otel_training"):
        _stuck_once(StuckOptions(on_stuck=[functools.partial(broken, "a"), functools.partial(broken, "b")]))
    logged = [r.getMessage() for r in caplog.records if "on_stuck callback" in r.getMessage()]
    assert len(logged) == 2 and "'a'" in logged[0] and "'b'" in logged[1]
