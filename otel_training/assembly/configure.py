"""``configure()``: the one pipeline of this process, and the one global pointer to it (the assembly layer).

``get_telemetry()`` is the default the events API and the integrations use when
they are given no pipeline of their own; everything else is handed its
``Telemetry`` explicitly.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from opentelemetry import metrics as metrics_api
from opentelemetry import trace as trace_api

from otel_training._contain import call_contained
from otel_training._sdk_compat import is_proxy_meter_provider
from otel_training.assembly.plugins import end_spans_before_stuck_exit, install_plugins
from otel_training.config import otel_env
from otel_training.config.options import OPTIONS, resolve
from otel_training.config.parsers import ConfigError
from otel_training.pipeline.telemetry import Telemetry

logger = logging.getLogger("otel_training")

_configure_lock = threading.RLock()
_current: Telemetry | None = None


def get_telemetry() -> Telemetry | None:
    """The handle of the last ``configure()``, or None."""
    return _current


def configure(*, reconfigure: bool = False, config_file: str | None = None, **options: object) -> Telemetry:
    """Set up tracing and metrics for this process; see docs/configuration.md.

    Calling it again returns the same handle. With other options it raises,
    unless ``reconfigure=True``, which shuts the old pipeline down (bounded) and
    builds a new one. It never installs two global providers.

    Raises ``ConfigError`` (a ``ValueError``) naming the option, variable or
    file and the bad value. When configuring from the environment alone fails
    (no options, as the events API does on first use and auto-instrumentation
    at start), the error is also logged once and a disabled stand-in becomes
    the handle: events cost little and nothing retries configuring on every
    step. A later ``configure()`` that succeeds replaces it.
    """
    global _current
    with _configure_lock:
        try:
            return _configure(reconfigure, config_file, options)
        except Exception as error:
            if options or config_file is not None or _current is not None:
                raise
            _current = call_contained(_stand_in, error)  # None if even that fails: the error still goes up
            logger.error("otel_training: configuration failed, so this process records no telemetry "
                         "(fix it and restart): %s", error)
            raise


def _configure(reconfigure: bool, config_file: str | None, options: dict[str, Any]) -> Telemetry:
    global _current
    resolved = resolve(options, os.environ, config_file)
    otel_env.validate(os.environ)
    standing_in = _current is not None and _current.config_error is not None
    if _current is not None and not _current.is_shut_down and not standing_in:
        if not reconfigure:
            same = all(_current.options.get(key) == value for key, value in resolved.items() if key in options)
            if options and not same:
                raise ConfigError(
                    "configure() was already called with other options; "
                    "pass reconfigure=True to replace the pipeline"
                )
            return _current
        _current.shutdown(timeout_s=_current.options["exit_timeout_s"])
    if resolved["offload"] == "auto":
        resolved["offload"] = _offload_here(resolved)
    if resolved["offload"]:
        from otel_training.pipeline.offload import OffloadTelemetry

        telemetry: Telemetry = OffloadTelemetry(resolved, before_stuck_exit=end_spans_before_stuck_exit)
    else:
        telemetry = Telemetry(resolved)
    try:
        if not resolved["offload"]:  # offloaded, the drain process runs them
            install_plugins(telemetry)
    except BaseException:
        # Never publish a half-built pipeline: the next configure() starts afresh.
        telemetry.shutdown(timeout_s=1.0)
        raise
    first = _current is None or standing_in  # a stand-in never became the global provider
    if standing_in and _current is not None:  # the stand-in handle, replaced
        _current.shutdown(timeout_s=1.0)
    _current = telemetry
    _forget_options_only()
    if resolved["set_global"] and first:
        _set_global(telemetry)
    from otel_training.lifecycle import hooks

    hooks.install(telemetry)
    return telemetry


def _offload_here(resolved: dict[str, Any]) -> bool:
    """``offload="auto"``: offloaded wherever offload runs (docs/offload.md), except where it would change what
    the user watches in this process: the console exporter prints here, as it is read."""
    from otel_training.pipeline.offload import offload_by_default

    return resolved["exporter"] != "console" and offload_by_default(resolved["native"])


_options_only: Telemetry | None = None


def options_only() -> Telemetry:
    """The configured pipeline if there is one; else a handle that exports nothing, with the options of the
    environment and config file (the trace budget, the values' hold): what the events of an injected tracer
    provider read when nothing configured this process, without configuring it (as contrib's instrumentors,
    given a provider, configure nothing global). Made once; a setting that fails is logged once and the
    defaults stand in."""
    global _options_only
    current = _current
    if current is not None:
        return current
    with _configure_lock:
        if _options_only is None:
            try:
                options = resolve({}, os.environ, None)
                otel_env.validate(os.environ)
                options.update(exporter="none", metrics=False, goodput=False, offload=False)
                _options_only = Telemetry(options)
            except Exception as error:  # noqa: BLE001 - an injected provider's events must not fail on a setting the pipeline would report
                logger.error("otel_training: %s; an injected tracer provider's events use the defaults", error)
                _options_only = _stand_in(error)
        return _options_only


def _forget_options_only() -> None:
    """A pipeline is configured now: the injected providers' runtimes read its options from here on (shut down,
    the handle's runtimes close, and their ``Process`` objects look theirs up again)."""
    global _options_only
    previous, _options_only = _options_only, None
    if previous is not None:
        previous.shutdown(timeout_s=1.0)


def _stand_in(error: Exception) -> Telemetry:
    """A handle that records nothing and reads nothing of the environment that failed."""
    options = {option.name: option.default for option in OPTIONS}
    options.update(exporter="none", metrics=False, goodput=False)
    return Telemetry(options, {}, config_error=error)


def _set_global(telemetry: Telemetry) -> None:
    if isinstance(trace_api.get_tracer_provider(), trace_api.ProxyTracerProvider):
        trace_api.set_tracer_provider(telemetry.tracer_provider)
    else:
        logger.info("otel_training: a global TracerProvider is already set; leaving it in place")
    if is_proxy_meter_provider(metrics_api.get_meter_provider()):
        metrics_api.set_meter_provider(telemetry.meter_provider)
