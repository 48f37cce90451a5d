"""Setting the continual-training lineage of this process (pipeline, trigger, training)."""

from __future__ import annotations

from otel_training import semconv as sc
from otel_training.events.runtime import runtime

_UNCHANGED: object = object()


def set_lineage(
    pipeline_id: str | object | None = _UNCHANGED,
    trigger_id: str | object | None = _UNCHANGED,
    training_id: str | object | None = _UNCHANGED,
) -> None:
    """Stamp these ids on every span started from now on (``None`` clears one).

    A continual-training pipeline retrains on each trigger; call this when a new
    trigger's training starts, so its spans can be told apart from the last one's.
    """
    changes = {
        key: value
        for key, value in (
            (sc.TRAINING_PIPELINE_ID, pipeline_id),
            (sc.TRAINING_TRIGGER_ID, trigger_id),
            (sc.TRAINING_TRIGGER_TRAINING_ID, training_id),
        )
        if value is not _UNCHANGED
    }
    runtime().telemetry.lineage.set({key: None if value is None else str(value) for key, value in changes.items()})
