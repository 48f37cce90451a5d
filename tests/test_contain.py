"""``_contain.contain``: the one place a containment block's broad except lives."""

from __future__ import annotations

import logging

import pytest

from otel_training import _contain
from otel_training._contain import contain


def _divide(guard: contain, x: int) -> float | None:
    with guard:
        return 1 / x
    return None  # the block failed: the line after it runs


def test_a_failure_is_logged_once_with_its_traceback_and_swallowed(caplog: pytest.LogCaptureFixture) -> None:
    guard = contain("test-contain:divide", "otel_training: could not divide by %s", "x")
    with caplog.at_level(logging.WARNING, logger="otel_training"):
        assert _divide(guard, 2) == 0.5
        assert _divide(guard, 0) is None
        assert _divide(guard, 0) is None  # the same instance again: reusable, and not logged twice
    records = [r for r in caplog.records if "could not divide" in r.getMessage()]
    assert len(records) == 1
    assert records[0].getMessage().startswith("otel_training: could not divide by x")
    assert records[0].exc_info is not None and records[0].exc_info[0] is ZeroDivisionError


def test_without_the_traceback_when_asked(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="otel_training"), \
            contain("test-contain:no-traceback", "otel_training: quiet", exc_info=False):
        raise ValueError("x")
    (record,) = [r for r in caplog.records if r.getMessage().startswith("otel_training: quiet")]
    assert not record.exc_info


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit])
def test_stopping_the_job_passes_through(stop: type[BaseException]) -> None:
    with pytest.raises(stop), contain("test-contain:stop", "otel_training: never logged"):
        raise stop()
    assert "test-contain:stop" not in _contain._seen


def test_a_block_that_succeeds_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="otel_training"), contain("test-contain:fine", "otel_training: no"):
        value = 1
    assert value == 1 and not caplog.records


def test_failed_logs_the_exception_being_handled_for_an_inline_handler(caplog: pytest.LogCaptureFixture) -> None:
    guard = contain("test-contain:inline", "otel_training: inline %s", "site")
    with caplog.at_level(logging.WARNING, logger="otel_training"):
        for _ in range(2):
            try:
                raise OSError("disk")
            except OSError:
                guard.failed()
    (record,) = [r for r in caplog.records if r.getMessage().startswith("otel_training: inline site")]
    assert record.exc_info is not None and record.exc_info[0] is OSError
