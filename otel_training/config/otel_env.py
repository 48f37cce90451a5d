"""Early validation of the standard ``OTEL_*`` variables we rely on.

The SDK reads these itself, but on a bad value it logs and falls back to a
default (or fails at the first export), which a training job discovers hours
later, if at all. We check them before training starts and raise ``ConfigError``
naming the variable and the value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from otel_training.config.options import MAX_SECONDS, MAX_SIZE, ConfigError

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
#: Milliseconds, read with ``int()`` by the batch span processor.
_MILLISECONDS_INT = ("OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_EXPORT_TIMEOUT")
#: Milliseconds, read with ``float()`` by the periodic metric reader.
_MILLISECONDS = ("OTEL_METRIC_EXPORT_INTERVAL", "OTEL_METRIC_EXPORT_TIMEOUT")
_SECONDS = ("OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT")
_QUEUE, _BATCH = "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"
#: The SDK's defaults, which the batch size is checked against when one is unset.
_DEFAULT_QUEUE, _DEFAULT_BATCH = 2048, 512
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


def validate(environ: Mapping[str, str]) -> None:
    """Raise ``ConfigError`` for the first malformed standard variable."""
    otlp_protocol(environ, "TRACES")
    otlp_protocol(environ, "METRICS")
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
