"""Light parts of the package stay light: what a fresh interpreter loads for them.

The report, the analysis and code that only needs the attribute names must not
pay for (or depend on) the pipeline and the SDK's tracing.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

_PROBE = """
import json, sys
import {module}
print(json.dumps(sorted(name for name in sys.modules
                        if name.startswith(("otel_training", "opentelemetry.sdk")))))
"""


def _loaded(module: str) -> list[str]:
    output = subprocess.run([sys.executable, "-c", _PROBE.format(module=module)], check=True,
                            capture_output=True, text=True, timeout=120).stdout
    return json.loads(output)


@pytest.mark.parametrize("module", ["otel_training", "otel_training.semconv", "otel_training.analysis",
                                    "otel_training.report"])
def test_a_light_import_loads_no_sdk_tracing_and_no_pipeline(module: str) -> None:
    loaded = _loaded(module)
    assert not [name for name in loaded if name.startswith("opentelemetry.sdk.trace")]
    assert not [name for name in loaded if name.startswith(("otel_training.config", "otel_training.events",
                                                            "otel_training.processors", "otel_training.pipeline",
                                                            "otel_training.lifecycle"))]


def test_the_watchdog_sidecar_loads_no_pipeline() -> None:
    """The sidecar exports alerts with the SDK's exporters and the detector's alert helpers, and nothing of the
    training process's pipeline."""
    loaded = _loaded("otel_training.watchdog.monitor")
    assert not [name for name in loaded if name.startswith(("otel_training.pipeline.telemetry", "otel_training.events",
                                                            "otel_training.lifecycle", "otel_training.integrations",
                                                            "otel_training.processors.stuck_actions",
                                                            "otel_training.processors.goodput"))]
    assert "otel_training.processors.stuck_alerts" in loaded  # its alert spans are built as the detector's are
    assert "otel_training.pipeline.exporters" in loaded  # the factory, shared with the pipeline


def test_the_public_names_still_load_on_use() -> None:
    loaded = _loaded("otel_training; otel_training.configure; otel_training.TrainerProcess")
    assert "otel_training.pipeline.telemetry" in loaded and "otel_training.events.predefined" in loaded
