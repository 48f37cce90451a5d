"""Early validation of the standard ``OTEL_*`` variables we rely on.

The SDK reads these itself, but on a bad value it logs and falls back to a
default (or fails at the first export), which a training job discovers hours
later, if at all. We check them before training starts and raise ``ConfigError``
naming the variable and the value.
"""

from __future__ import annotations

from collections.abc import Mapping

from otel_training.config.options import ConfigError

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
_POSITIVE_INTS = (
    "OTEL_BSP_MAX_QUEUE_SIZE",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
    "OTEL_BSP_SCHEDULE_DELAY",
    "OTEL_BSP_EXPORT_TIMEOUT",
    "OTEL_METRIC_EXPORT_INTERVAL",
)
_SECONDS = ("OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT")


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


def _check_positive(environ: Mapping[str, str], name: str, parse: type, expected: str) -> None:
    if name not in environ:
        return
    value = environ[name]
    try:
        ok = parse(value) > 0
    except ValueError:
        ok = False
    if not ok:
        raise ConfigError(f"environment variable {name}={value!r}: {expected}")


def validate(environ: Mapping[str, str]) -> None:
    """Raise ``ConfigError`` for the first malformed standard variable."""
    otlp_protocol(environ, "TRACES")
    otlp_protocol(environ, "METRICS")
    for name in _POSITIVE_INTS:
        _check_positive(environ, name, int, "expected a positive integer")
    for name in _SECONDS:
        _check_positive(environ, name, float,
                        "expected a positive number (the Python OTLP exporters read it in seconds)")
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
