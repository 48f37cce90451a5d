#!/usr/bin/env python3
"""Run the native observability stack: ``up``, ``status``, ``down``, ``build``
(``--help`` for the options). The harness itself is the package beside this script,
``scripts/stack/otelstack/``, which the tests import."""

import sys

from otelstack.cli import main

if __name__ == "__main__":
    sys.exit(main())
