"""End to end through the real stack with a plain OpenTelemetry SDK client.

No otel_training code is involved: the test hand-builds the spans the package
emits (a ``training.step`` and a ``training.alert`` with
``training.alert.kind=stuck``), exports them over OTLP/gRPC to the natively
built collector, and follows them into every sink:

* Jaeger's query API (trace pipeline -> Jaeger over OTLP),
* the alerts file sink (alerts pipeline: filter on training.alert.kind -> file),
* the collector's prometheus exporter (spanmetrics connector),
* Prometheus' TrainingStepStuck rule, and Alertmanager's webhook delivery,
* then a ``recovered`` alert span resolves the alert, and the webhook is told.
"""

from __future__ import annotations

import uuid

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Status, StatusCode
from stack_helpers import (
    jaeger_traces,
    prometheus_alerts,
    read_alert_sink,
    scrape_samples,
    span_tags,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]  # a cold cache builds the binaries first

SERVICE = "otel-training-e2e"
DEADLINE = 60.0


def _provider(stack, job_id: str, rank: int = 0) -> TracerProvider:
    resource = Resource.create(
        {
            "service.name": SERVICE,
            "training.job.id": job_id,
            "training.run.id": f"{job_id}-run1",
            "training.rank": rank,
            "training.world_size": 2,
            "training.role": "trainer",
        }
    )
    provider = TracerProvider(resource=resource)
    # Synchronous export: when a span ends, the collector has accepted it.
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=stack.otlp_grpc_endpoint, insecure=True, timeout=10)))
    return provider


def _emit_alert(tracer, kind: str, step: int) -> str:
    with tracer.start_as_current_span(
        "training.alert",
        attributes={
            "training.alert.kind": kind,
            "training.alert.elapsed_s": 12.5,
            "training.alert.threshold_s": 10.0,
            "training.alert.span.name": "training.step",
            "training.step": step,
        },
    ) as span:
        if kind == "stuck":
            span.set_status(Status(StatusCode.ERROR, "step stuck"))
        return format(span.get_span_context().trace_id, "032x")


def test_stuck_alert_span_reaches_jaeger_file_sink_metrics_prometheus_and_webhook(stack, alert_webhook):
    job_id = f"e2e-{uuid.uuid4().hex[:10]}"
    provider = _provider(stack, job_id, rank=1)
    tracer = provider.get_tracer("e2e")

    # A normal step first (must NOT reach the alerts sink), then the stuck alert.
    with tracer.start_as_current_span("training.step", attributes={"training.step": 7}) as step:
        step_trace = format(step.get_span_context().trace_id, "032x")
    alert_trace = _emit_alert(tracer, "stuck", step=8)

    # --- Jaeger: both traces, with span and resource attributes ------------
    def stuck_trace_in_jaeger():
        traces = jaeger_traces(stack.jaeger_url, SERVICE, {"training.alert.kind": "stuck", "training.job.id": job_id})
        return [t for t in traces if t["traceID"] == alert_trace]

    (trace,) = wait_until(stuck_trace_in_jaeger, timeout=DEADLINE, what="the stuck alert trace in Jaeger")
    (span,) = trace["spans"]
    assert span["operationName"] == "training.alert"
    tags = span_tags(span)
    assert tags["training.alert.kind"] == "stuck"
    assert tags["training.alert.elapsed_s"] == 12.5
    assert tags["training.alert.threshold_s"] == 10.0
    process = span_tags(trace["processes"][span["processID"]])
    assert process["training.job.id"] == job_id
    assert process["training.rank"] == 1
    assert trace["processes"][span["processID"]]["serviceName"] == SERVICE

    step_traces = wait_until(
        lambda: [t for t in jaeger_traces(stack.jaeger_url, SERVICE, {"training.job.id": job_id}) if t["traceID"] == step_trace],
        timeout=DEADLINE,
        what="the step trace in Jaeger",
    )
    assert step_traces[0]["spans"][0]["operationName"] == "training.step"

    # --- alerts pipeline: the file sink holds the alert, not the step ------
    def alert_in_sink():
        return [
            s
            for s in read_alert_sink(stack.alerts_file)
            if s["resource"].get("training.job.id") == job_id and s["name"] == "training.alert"
        ]

    (sunk,) = wait_until(alert_in_sink, timeout=DEADLINE, what=f"the alert span in {stack.alerts_file}")
    assert sunk["attributes"]["training.alert.kind"] == "stuck"
    assert sunk["attributes"]["training.alert.threshold_s"] == 10.0
    assert sunk["resource"]["training.rank"] == 1
    # The step span was exported (and acknowledged) before the alert: the
    # filter drops synchronously on receipt, so it can never show up later.
    others = [s for s in read_alert_sink(stack.alerts_file) if s["resource"].get("training.job.id") == job_id and s["name"] != "training.alert"]
    assert others == [], f"non-alert spans leaked into the alerts sink: {others}"

    # --- spanmetrics on the collector's prometheus exporter ----------------
    # A new spanmetrics series is first emitted with 0, then with its count.
    def counter(span_name):
        def samples():
            found = [
                (labels, value)
                for labels, value in scrape_samples(stack.collector_metrics_url, "traces_span_metrics_calls_total")
                if labels.get("training_job_id") == job_id and labels.get("span_name") == span_name
            ]
            return found if found and all(v >= 1 for _, v in found) else None

        return samples

    ((labels, value),) = wait_until(counter("training.alert"), timeout=DEADLINE, what="traces_span_metrics_calls_total for the alert")
    assert value == 1
    assert labels["training_alert_kind"] == "stuck"
    assert labels["training_rank"] == "1"
    assert labels["status_code"] == "STATUS_CODE_ERROR"
    ((step_labels, step_value),) = wait_until(counter("training.step"), timeout=DEADLINE, what="traces_span_metrics_calls_total for the step")
    assert step_value == 1
    assert "training_alert_kind" not in step_labels
    durations = [lab for lab, _ in scrape_samples(stack.collector_metrics_url, "traces_span_metrics_duration_seconds_count")
                 if lab.get("training_job_id") == job_id]
    assert {lab["span_name"] for lab in durations} == {"training.step", "training.alert"}

    # --- Prometheus fires TrainingStepStuck for this job and rank ----------
    def firing():
        return [
            a
            for a in prometheus_alerts(stack.prometheus_url)
            if a["labels"].get("alertname") == "TrainingStepStuck"
            and a["labels"].get("training_job_id") == job_id
            and a["state"] == "firing"
        ]

    (prom_alert,) = wait_until(firing, timeout=DEADLINE, what="TrainingStepStuck firing in Prometheus")
    assert prom_alert["labels"]["training_rank"] == "1"
    assert prom_alert["labels"]["severity"] == "page"

    # --- Alertmanager delivers it to the test's webhook --------------------
    payload, am_alert = alert_webhook.wait_for_alert(
        lambda p, a: a["labels"].get("alertname") == "TrainingStepStuck"
        and a["labels"].get("training_job_id") == job_id
        and a["status"] == "firing",
        timeout=DEADLINE,
    )
    assert payload["_path"] == "/otel-training/alerts"
    assert payload["receiver"] == "training-webhook"
    assert am_alert["labels"]["training_rank"] == "1"
    assert f"job {job_id}, rank 1" in am_alert["annotations"]["summary"]

    # --- recovery: a "recovered" alert span resolves it --------------------
    _emit_alert(tracer, "recovered", step=8)
    provider.shutdown()
    alert_webhook.wait_for_alert(
        lambda p, a: a["labels"].get("alertname") == "TrainingStepStuck"
        and a["labels"].get("training_job_id") == job_id
        and a["status"] == "resolved",
        timeout=DEADLINE,
    )
    assert not firing()
    recovered = [s for s in read_alert_sink(stack.alerts_file) if s["resource"].get("training.job.id") == job_id]
    assert sorted(s["attributes"]["training.alert.kind"] for s in recovered) == ["recovered", "stuck"]


def test_sdk_dropped_spans_metric_reaches_prometheus_and_fires(stack, alert_webhook):
    """The SDK's training.telemetry.spans.dropped counter (OTLP metric) goes
    through the collector's metrics pipeline and fires TrainingTelemetrySpansDropped."""
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.metrics import Observation
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    job_id = f"e2e-{uuid.uuid4().hex[:10]}"
    resource = Resource.create({"service.name": SERVICE, "training.job.id": job_id, "training.rank": 3})
    dropped = {"n": 0}
    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=stack.otlp_grpc_endpoint, insecure=True, timeout=10), export_interval_millis=500
    )
    provider = MeterProvider(resource=resource, metric_readers=[reader])
    try:
        # Same instrument as otel_training.pipeline.telemetry: an observable counter.
        provider.get_meter("otel_training").create_observable_counter(
            "training.telemetry.spans.dropped",
            callbacks=[lambda options: [Observation(dropped["n"])]],
            unit="{span}",
        )

        def exported(minimum):
            def check():
                vals = [v for lab, v in scrape_samples(stack.collector_metrics_url, "training_telemetry_spans_dropped_total")
                        if lab.get("training_job_id") == job_id]
                return vals if vals and vals[0] >= minimum else None
            return check

        # Zero first (nothing dropped yet), then 42.
        assert wait_until(exported(0), timeout=DEADLINE, what="training_telemetry_spans_dropped_total on the collector") == [0]
        dropped["n"] = 42
        assert wait_until(exported(42), timeout=DEADLINE, what="the counter to reach 42") == [42]

        def firing():
            return [a for a in prometheus_alerts(stack.prometheus_url)
                    if a["labels"].get("alertname") == "TrainingTelemetrySpansDropped"
                    and a["labels"].get("training_job_id") == job_id and a["state"] == "firing"]

        (alert,) = wait_until(firing, timeout=DEADLINE, what="TrainingTelemetrySpansDropped firing")
        assert alert["labels"]["training_rank"] == "3"
        alert_webhook.wait_for_alert(
            lambda p, a: a["labels"].get("alertname") == "TrainingTelemetrySpansDropped"
            and a["labels"].get("training_job_id") == job_id and a["status"] == "firing",
            timeout=DEADLINE,
        )
    finally:
        provider.shutdown()
