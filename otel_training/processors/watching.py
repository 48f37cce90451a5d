"""What a pipeline must know of a processor that raises spans of its own from a thread: stop it first.

A watcher (the stuck detector) ends alert spans on its own thread, after the spans it watches began. A pipeline
that shuts down stops such a processor before its last flush, so an alert it is raising reaches the export
queue; the SDK's provider would stop it only after the batch processor, where that alert is dropped. Subclassing
this class is how a processor says so: the pipeline recognises it by type, not by probing its attributes.
"""

from __future__ import annotations

from opentelemetry.sdk.trace import SpanProcessor


class WatchingSpanProcessor(SpanProcessor):
    """A span processor with a thread of its own that ends spans: stopped before the pipeline's last flush."""
