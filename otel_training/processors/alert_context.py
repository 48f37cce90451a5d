"""What else a stuck alert should say about the process, from those who know.

The stuck detector depends on the OpenTelemetry SDK only; an integration that
knows more about the moment (the torch instrumentor: the collective this rank
is inside) registers a provider here, and every stuck alert carries what the
providers return. A provider runs on the detector's watcher thread, so it may
take a few milliseconds; one that raises is logged once and skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from otel_training._contain import log_once

Provider = Callable[[], Mapping[str, Any]]

_providers: list[Provider] = []


def add(provider: Provider) -> None:
    """Call ``provider()`` for the attributes of every stuck alert (once per provider)."""
    if provider not in _providers:
        _providers.append(provider)


def remove(provider: Provider) -> None:
    if provider in _providers:
        _providers.remove(provider)


def collect() -> dict[str, Any]:
    """Every provider's attributes, merged in registration order."""
    attributes: dict[str, Any] = {}
    for provider in list(_providers):
        try:
            attributes.update(provider())
        except Exception:  # noqa: BLE001 - an alert without the extras beats no alert
            log_once(f"alert-context:{getattr(provider, '__qualname__', provider)}",
                     "otel_training: a stuck-alert context provider failed; the alert goes out without it")
    return attributes
