"""Optional frameworks in tests: skipped on a developer machine without them, a failure under CI."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def require(module: str) -> ModuleType:
    """Import ``module``; without it, skip (saying how to install it), or fail when ``CI`` is set."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        message = f"{module} is not installed ({error}); `scripts/setup --all` installs every extra"
        if os.environ.get("CI"):
            pytest.fail(message + " (CI is set: a missing framework is a failure)", pytrace=False)
        pytest.skip(message, allow_module_level=True)
