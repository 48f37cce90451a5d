"""Reading OTLP JSON Lines back in tests: spans as flat dicts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from otel_training.report.reader import attributes


def read_spans(path: Path) -> list[dict[str, Any]]:
    """Every span in an OTLP JSON Lines trace file, with resource attributes merged under 'resource'."""
    spans = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        request = json.loads(line)
        for resource_spans in request.get("resourceSpans", []):
            resource = attributes(resource_spans.get("resource", {}).get("attributes"))
            for scope_spans in resource_spans.get("scopeSpans", []):
                for span in scope_spans.get("spans", []):
                    spans.append(
                        {
                            "name": span["name"],
                            "trace_id": span["traceId"],
                            "span_id": span["spanId"],
                            "parent_id": span.get("parentSpanId", ""),
                            "attributes": attributes(span.get("attributes")),
                            "events": [
                                {"name": event["name"], "attributes": attributes(event.get("attributes"))}
                                for event in span.get("events", [])
                            ],
                            "links": [
                                {"trace_id": link["traceId"], "span_id": link["spanId"],
                                 "attributes": attributes(link.get("attributes"))}
                                for link in span.get("links", [])
                            ],
                            "status": span.get("status", {}),
                            "start": int(span["startTimeUnixNano"]),
                            "end": int(span["endTimeUnixNano"]),
                            "resource": resource,
                        }
                    )
    return spans
