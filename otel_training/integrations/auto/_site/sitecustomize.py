"""Run by Python at start-up when ``otel-training run`` puts this directory on PYTHONPATH.

It is alone in its directory so that nothing else becomes importable by a bare
name, and it runs the ``sitecustomize`` it shadows (a distribution's or a
virtualenv's), so the environment behaves as it would without us.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # noqa: BLE001 - as Python itself treats a failing sitecustomize
        print(f"Error in sitecustomize chained by otel-training: {error!r}", file=sys.stderr)


def _start() -> None:
    try:
        from otel_training.integrations.auto import auto_instrument
    except Exception as error:  # noqa: BLE001 - the package is not importable here
        print(f"otel-training: auto-instrumentation unavailable: {error!r}", file=sys.stderr)
        return
    auto_instrument()


_start()
_chain()
