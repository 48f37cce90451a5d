"""The ``opentelemetry-instrument`` entry points (they need the ``[torch]`` extra's opentelemetry-instrumentation).

Roles as in ``otel_training.integrations.auto``: a launcher gets neither a
pipeline nor the torch instrumentor, the owner both, and a descendant the
instrumentor dormant until it trains.
"""

from __future__ import annotations

import os
from typing import Any

from opentelemetry.instrumentation.distro import BaseDistro  # type: ignore[attr-defined]  # the module opens with a file-wide ignore comment: mypy sees none of its names

from otel_training._sdk_compat import BaseConfigurator
from otel_training.integrations import auto


class OtelTrainingDistro(BaseDistro):  # type: ignore[misc]  # BaseDistro is Any to mypy (see its import)
    """The ``opentelemetry_distro`` entry point: selects our configurator, skips launchers."""

    def _configure(self, **kwargs: Any) -> None:
        os.environ.setdefault("OTEL_PYTHON_CONFIGURATOR", "otel_training")
        # As under otel-training run: offloaded wherever it runs, for this process and the ranks it starts
        # (docs/offload.md); OTEL_TRAINING_OFFLOAD=false keeps the spans in the process.
        if "OTEL_TRAINING_OFFLOAD" not in os.environ:
            from otel_training.pipeline.offload import offload_by_default

            native = os.environ.get("OTEL_TRAINING_NATIVE", "auto").strip().lower()
            os.environ["OTEL_TRAINING_OFFLOAD"] = "true" if offload_by_default(native) else "false"

    def load_instrumentor(self, entry_point: Any, **kwargs: Any) -> None:
        if entry_point.name == auto.INSTRUMENTOR_NAME:
            decided = auto.role()
            if decided == auto.LAUNCHER:
                return
            if decided == auto.DESCENDANT:
                kwargs["claim"] = auto.claim_training_process
        super().load_instrumentor(entry_point, **kwargs)


class OtelTrainingConfigurator(BaseConfigurator):
    """The ``opentelemetry_configurator`` entry point: ``configure()`` from the environment (owner only)."""

    def _configure(self, **kwargs: Any) -> None:
        if auto.role() == auto.OWNER:
            auto.configure_owner()
