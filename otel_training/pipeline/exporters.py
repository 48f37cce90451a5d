"""Building the span and metric exporters an exporter name stands for.

One place, because two processes need the same answer: the training process
(``configure``) and the watchdog sidecar, which rebuilds its parent's exporter
from the inherited settings so its alerts land where the parent's spans do.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.sdk.trace.export import SpanExporter

from otel_training.config.otel_env import otlp_protocol
from otel_training.exporters.console import console_exporter
from otel_training.exporters.otlp_json import OtlpJsonFileMetricExporter, OtlpJsonFileSpanExporter


def span_exporter(name: str, environ: Mapping[str, str], path: str | os.PathLike[str] | None = None) -> SpanExporter | None:
    """``otlp`` (gRPC or HTTP by the standard variables), ``file`` (to ``path``), ``console``; else None."""
    if name == "otlp":
        if otlp_protocol(environ, "TRACES") == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter

            return HttpSpanExporter()
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter

        return GrpcSpanExporter()
    if name == "file" and path is not None:
        return OtlpJsonFileSpanExporter(path)
    if name == "console":
        return console_exporter()
    return None


def metric_exporter(name: str, environ: Mapping[str, str],
                    path: str | os.PathLike[str] | None = None) -> MetricExporter | None:
    """The metric counterpart of ``span_exporter``; the console gets no metrics (too noisy)."""
    if name == "otlp":
        if otlp_protocol(environ, "METRICS") == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter

            return HttpMetricExporter()
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter

        return GrpcMetricExporter()
    if name == "file" and path is not None:
        return OtlpJsonFileMetricExporter(path)
    return None
