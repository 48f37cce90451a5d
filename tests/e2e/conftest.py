"""Fixtures for the end-to-end tests against the real, natively run stack.

``stack`` (session scope) builds the collector and Jaeger with
scripts/stack/build.sh (reusing the binary cache), starts collector, Jaeger,
Prometheus and Alertmanager on free loopback ports with short intervals, and
stops them at the end of the session. Alertmanager posts to ``alert_webhook``,
an HTTP server run by the tests on loopback.

Skips (with the reason) only when a prerequisite is missing and CI is unset;
under CI a missing prerequisite is a failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

import otelstack as stack_mod  # noqa: E402 - scripts/stack/otelstack/, on pytest's pythonpath
from stack_helpers import WebhookReceiver  # noqa: E402 - tests/e2e/, likewise


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: end-to-end tests against the real collector, Jaeger, Prometheus and Alertmanager")


def require_prerequisites() -> None:
    """Skip (developer machine) or fail (CI) when the stack cannot be built or run here."""
    missing = stack_mod.missing_prerequisites()
    if not missing:
        return
    msg = "native stack unavailable, missing: " + "; ".join(missing)
    if os.environ.get("CI"):
        pytest.fail(msg + " (CI is set: the CI script must install these)", pytrace=False)
    pytest.skip(msg)


@pytest.fixture(scope="session")
def stack_binaries(tmp_path_factory: pytest.TempPathFactory) -> stack_mod.Binaries:
    require_prerequisites()
    log = tmp_path_factory.mktemp("build") / "build.log"
    try:
        return stack_mod.ensure_binaries(log)
    except stack_mod.StackError as exc:
        tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
        pytest.fail(f"{exc}\n{tail}", pytrace=False)


@pytest.fixture(scope="session")
def alert_webhook() -> Iterator[WebhookReceiver]:
    hook = WebhookReceiver()
    hook.start()
    yield hook
    hook.stop()


@pytest.fixture(scope="session")
def stack(stack_binaries, alert_webhook: WebhookReceiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[stack_mod.Stack]:
    run_dir = tmp_path_factory.mktemp("stack")
    s = stack_mod.Stack(run_dir, binaries=stack_binaries, webhook_url=alert_webhook.url, fast=True)
    try:
        s.start()
    except stack_mod.StackError as exc:
        pytest.fail(f"the native stack did not start: {exc}", pytrace=False)
    try:
        yield s
    finally:
        s.stop()
        # Nothing we started may outlive the session.
        leftovers = [n for n, p in s.procs.items() if p.running()]
        assert not leftovers, f"stack processes still running after stop(): {leftovers}"
