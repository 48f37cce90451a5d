"""A pytest plugin for scripts/native-check: ``otel_training._native`` is the sanitizer build named by
``OT_SANITIZED_EXTENSION``, loaded before any test imports it (an editable install's finder would otherwise
find the regular build first, whatever PYTHONPATH says)."""

import importlib.util
import os
import sys

_path = os.environ["OT_SANITIZED_EXTENSION"]
_spec = importlib.util.spec_from_file_location("otel_training._native", _path)
assert _spec is not None and _spec.loader is not None, _path
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
sys.modules["otel_training._native"] = _module


def pytest_report_header() -> str:
    import otel_training._native as native

    assert native.__file__ == _path, (native.__file__, _path)
    return f"otel_training._native: the sanitizer build {_path}"
