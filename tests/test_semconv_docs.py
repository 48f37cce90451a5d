"""Every name in otel_training.semconv is documented in docs/semantic-conventions.md."""

from __future__ import annotations

from pathlib import Path

from otel_training import semconv as sc

DOC = Path(__file__).resolve().parent.parent / "docs" / "semantic-conventions.md"
# Values that are not names (versions, URLs, enum values documented in prose).
NOT_NAMES = {"SCHEMA_VERSION", "SCHEMA_URL"}


def test_every_name_is_documented() -> None:
    doc = DOC.read_text()
    names = {key: value for key, value in vars(sc).items()
             if key.isupper() and isinstance(value, str) and key not in NOT_NAMES}
    missing = sorted(f"{key} = {value!r}" for key, value in names.items() if value not in doc)
    assert not missing, "undocumented names in docs/semantic-conventions.md:\n" + "\n".join(missing)


def test_names_follow_the_opentelemetry_rules() -> None:
    import re

    pattern = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")
    prefixes = ("SPAN_", "METRIC_", "TRAINING_", "ALERT_", "ELASTIC_", "EVENT_LOG", "SIGNAL_", "CHECKPOINT_")
    for key, value in vars(sc).items():
        if key.startswith(prefixes) and isinstance(value, str) and not key.startswith("ALERT_KIND"):
            assert pattern.match(value), f"{key} = {value!r} is not a dot-separated snake_case name"
