"""The ``opentelemetry-instrument`` entry points (they need the ``[torch]`` extra's opentelemetry-instrumentation)."""

from __future__ import annotations

import os
from typing import Any

from opentelemetry.instrumentation.distro import BaseDistro
from opentelemetry.sdk._configuration import _BaseConfigurator

from otel_training.integrations import auto


class OtelTrainingDistro(BaseDistro):  # type: ignore[misc]
    """The ``opentelemetry_distro`` entry point: selects our configurator, skips launchers."""

    def _configure(self, **kwargs: Any) -> None:
        os.environ.setdefault("OTEL_PYTHON_CONFIGURATOR", "otel_training")

    def load_instrumentor(self, entry_point: Any, **kwargs: Any) -> None:
        if entry_point.name == auto.INSTRUMENTOR_NAME and not auto.claim():
            return
        super().load_instrumentor(entry_point, **kwargs)


class OtelTrainingConfigurator(_BaseConfigurator):  # type: ignore[misc]
    """The ``opentelemetry_configurator`` entry point: ``configure()`` from the environment."""

    def _configure(self, **kwargs: Any) -> None:
        if auto.claim():
            from otel_training.config.telemetry import configure

            configure()
