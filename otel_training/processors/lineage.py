"""Continual-training lineage stamped on every span.

A long-lived continual-training process (Modyn-style: a pipeline retrained on
each trigger) moves from one trigger to the next, so the ids are span
attributes set at span start, not resource attributes fixed at start-up.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.util.types import AttributeValue


class LineageSpanProcessor(SpanProcessor):
    #: Slots: the offloaded tracer's C core reads ``stamp`` on every tracker step.
    __slots__ = ("_attributes", "stamp")

    def __init__(self, attributes: Mapping[str, AttributeValue] | None = None) -> None:
        self._attributes: dict[str, AttributeValue] = dict(attributes or {})
        #: The lineage now, without a copy, for a tracer that stamps spans itself (the offloaded pipeline's
        #: record tracer, whose spans no processor of this process sees): an attribute, not a property, since
        #: that tracer reads it on every span. Never mutated: ``set`` replaces it.
        self.stamp: Mapping[str, AttributeValue] = self._attributes

    def set(self, attributes: Mapping[str, AttributeValue | None]) -> None:
        """Replace the lineage; a ``None`` value removes that key."""
        updated = dict(self._attributes)
        for key, value in attributes.items():
            if value is None:
                updated.pop(key, None)
            else:
                updated[key] = value
        self._attributes = updated  # one reference swap: readers never see a half update
        self.stamp = updated

    @property
    def attributes(self) -> dict[str, AttributeValue]:
        return dict(self._attributes)

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if self._attributes:
            span.set_attributes(self._attributes)

    def on_end(self, span: ReadableSpan) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
