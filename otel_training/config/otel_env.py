"""Early validation of the standard ``OTEL_*`` variables we rely on.

The SDK reads these itself, but on a bad value it logs and falls back to a
default (or fails at the first export), which a training job discovers hours
later, if at all. We check them before training starts and raise ``ConfigError``
naming the variable and the value.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from otel_training.config.parsers import MAX_SECONDS, MAX_SIZE, ConfigError
from otel_training.config.resource import from_otel_variables

_PROTOCOLS = ("grpc", "http/protobuf")
_SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
_RATIO_SAMPLERS = ("traceidratio", "parentbased_traceidratio")
_EXEMPLAR_FILTERS = ("trace_based", "always_on", "always_off")
#: Milliseconds, read with ``int()`` by the batch span processor.
_MILLISECONDS_INT = ("OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_EXPORT_TIMEOUT")
#: Milliseconds, read with ``float()`` by the periodic metric reader.
_MILLISECONDS = ("OTEL_METRIC_EXPORT_INTERVAL", "OTEL_METRIC_EXPORT_TIMEOUT")
_SECONDS = ("OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT")
_QUEUE, _BATCH = "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"
#: The SDK's defaults, which the batch size is checked against when one is unset.
_DEFAULT_QUEUE, _DEFAULT_BATCH = 2048, 512
_ENDPOINTS = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
)
#: What each exporter takes; the gRPC one raises on anything but gzip, "none" included.
_COMPRESSIONS = {"grpc": ("gzip",), "http/protobuf": ("gzip", "deflate", "none")}
#: TLS files: the exporters log a missing one and carry on without it (unverified, or without a client certificate).
_TLS_FILES = tuple(
    f"OTEL_EXPORTER_OTLP{signal}_{kind}"
    for signal in ("", "_TRACES", "_METRICS")
    for kind in ("CERTIFICATE", "CLIENT_KEY", "CLIENT_CERTIFICATE")
)
#: Span limits: a count or length >= 0, or empty for no limit (the SDK raises on anything else).
_LIMITS = (
    "OTEL_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
    "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT",
    "OTEL_SPAN_EVENT_COUNT_LIMIT",
    "OTEL_SPAN_LINK_COUNT_LIMIT",
    "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT",
)


def otlp_protocol(environ: Mapping[str, str], signal: str = "TRACES") -> str:
    """The OTLP protocol for a signal; the gRPC exporter itself never reads it."""
    name = f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL"
    if name not in environ:
        name = "OTEL_EXPORTER_OTLP_PROTOCOL"
    value = environ.get(name, "grpc").strip().lower() or "grpc"
    if value not in _PROTOCOLS:
        extra = " (the Python OTLP exporters do not implement http/json)" if value == "http/json" else ""
        raise ConfigError(f"environment variable {name}={value!r}: expected one of {', '.join(_PROTOCOLS)}{extra}")
    return value


def _check_range(environ: Mapping[str, str], name: str, parse: Callable[[str], float], minimum: float,
                 maximum: float, expected: str) -> None:
    """Within [minimum, maximum]: the SDK takes nonsense and fails later (a dead exporter thread)."""
    if name not in environ:
        return
    value = environ[name]
    try:
        ok = minimum <= parse(value.strip()) <= maximum  # False for NaN
    except (ValueError, OverflowError):
        ok = False
    if not ok:
        raise ConfigError(f"environment variable {name}={value!r}: expected {expected}")


def _check_batch_fits_the_queue(environ: Mapping[str, str]) -> None:
    """The SDK refuses a batch bigger than the queue, with a ValueError naming neither variable."""
    queue, batch = int(environ.get(_QUEUE, _DEFAULT_QUEUE)), int(environ.get(_BATCH, _DEFAULT_BATCH))
    if batch <= queue:
        return
    if _BATCH in environ:
        source = f"{_QUEUE}={queue}" if _QUEUE in environ else f"{_QUEUE}'s default, {queue}"
        raise ConfigError(f"environment variable {_BATCH}={environ[_BATCH]!r}: larger than {source}; "
                          "a batch must fit in the queue")
    raise ConfigError(f"environment variable {_QUEUE}={environ[_QUEUE]!r}: smaller than {_BATCH}'s default, "
                      f"{batch}; set {_BATCH} to at most the queue size")


def _check_endpoint(environ: Mapping[str, str], name: str) -> None:
    """An http(s) URL with a host: the exporters take anything and then drop every span."""
    value = environ.get(name, "")
    if not value.strip():
        return
    try:
        url = urlsplit(value.strip())
        ok = url.scheme in ("http", "https") and bool(url.hostname)
        _ = url.port  # raises ValueError unless a port number in 0..65535
    except ValueError:
        ok = False
    if not ok:
        raise ConfigError(f"environment variable {name}={value!r}: expected an http:// or https:// URL of the "
                          "collector, e.g. http://collector:4317")


def _check_compression(environ: Mapping[str, str], signal: str) -> None:
    protocol = otlp_protocol(environ, signal)
    accepted = _COMPRESSIONS[protocol]
    for name in (f"OTEL_EXPORTER_OTLP_{signal}_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION"):
        value = environ.get(name)
        if value is None or (not value.strip() and protocol == "http/protobuf"):  # http: empty is unset
            continue
        if value.strip().lower() not in accepted:
            expected = "gzip (the Python gRPC exporter takes no other; leave it unset for none)" \
                if protocol == "grpc" else f"one of {', '.join(accepted)}"
            raise ConfigError(f"environment variable {name}={value!r}: expected {expected} with protocol {protocol}")


def _check_file(environ: Mapping[str, str], name: str) -> None:
    """A readable regular file (a FIFO would block the exporter's read)."""
    path = environ.get(name)
    if not path:
        return
    try:
        problem = None if stat.S_ISREG(os.stat(path).st_mode) else "not a regular file"
        if problem is None and not os.access(path, os.R_OK):
            problem = "not readable"
    except OSError as error:
        problem = error.strerror or str(error)
    except ValueError as error:  # an embedded NUL
        problem = str(error)
    if problem is not None:
        raise ConfigError(f"environment variable {name}={path!r}: {problem}; the OTLP exporter would "
                          "carry on without it")


def validate(environ: Mapping[str, str]) -> None:
    """Raise ``ConfigError`` for the first malformed standard variable."""
    for signal in ("TRACES", "METRICS"):
        _check_compression(environ, signal)  # checks the protocol first
    for name in _ENDPOINTS:
        _check_endpoint(environ, name)
    for name in _TLS_FILES:
        _check_file(environ, name)
    max_ms = MAX_SECONDS * 1000
    for name in _MILLISECONDS_INT:
        _check_range(environ, name, int, 1, max_ms, f"a whole number of milliseconds in 1..{max_ms} (a week)")
    for name in _MILLISECONDS:
        _check_range(environ, name, float, 1e-3, max_ms, f"a number of milliseconds in [0.001, {max_ms}] (a week)")
    for name in (_QUEUE, _BATCH):
        _check_range(environ, name, int, 1, MAX_SIZE, f"an integer in 1..{MAX_SIZE}")
    _check_batch_fits_the_queue(environ)
    for name in _SECONDS:
        _check_range(environ, name, float, 1e-3, MAX_SECONDS,
                     f"a number of seconds in [0.001, {MAX_SECONDS}] (the Python OTLP exporters read it in seconds)")
    for name in _LIMITS:
        if environ.get(name, "").strip():  # empty: no limit
            _check_range(environ, name, int, 0, MAX_SIZE, f"an integer in 0..{MAX_SIZE}, or empty for no limit")
    exemplars = environ.get("OTEL_METRICS_EXEMPLAR_FILTER")
    if exemplars is not None and exemplars not in _EXEMPLAR_FILTERS:  # the SDK raises, naming no variable
        raise ConfigError(f"environment variable OTEL_METRICS_EXEMPLAR_FILTER={exemplars!r}: expected one of "
                          f"{', '.join(_EXEMPLAR_FILTERS)}")
    sampler = environ.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if sampler and sampler not in _SAMPLERS:
        raise ConfigError(f"environment variable OTEL_TRACES_SAMPLER={sampler!r}: expected one of {', '.join(_SAMPLERS)}")
    if sampler in _RATIO_SAMPLERS and "OTEL_TRACES_SAMPLER_ARG" in environ:
        value = environ["OTEL_TRACES_SAMPLER_ARG"]
        try:
            ok = 0.0 <= float(value) <= 1.0
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError(f"environment variable OTEL_TRACES_SAMPLER_ARG={value!r}: expected a ratio in [0, 1]")
    attributes = environ.get("OTEL_RESOURCE_ATTRIBUTES", "").strip()
    if attributes:
        for pair in attributes.split(","):
            if pair.strip() and "=" not in pair:
                raise ConfigError(
                    f"environment variable OTEL_RESOURCE_ATTRIBUTES={attributes!r}: "
                    f"{pair.strip()!r} is not key=value"
                )
    from_otel_variables(environ)  # identity numbers that are not integers in range
