"""The native observability stack, as a package: the tests' harness and the CLI behind
``scripts/stack/stack.py``. One module per job:

* :mod:`~otelstack.binaries` -- build (once, cached) or find the four binaries;
* :mod:`~otelstack.jaeger_binary` -- a Jaeger of the user's own (a release, UI included), checked at start;
* :mod:`~otelstack.ports` -- free loopback ports;
* :mod:`~otelstack.render` -- the shipped configs rendered for one run (files and environments);
* :mod:`~otelstack.polling` -- HTTP polling and deadline waits;
* :mod:`~otelstack.supervisor` -- a generic supervisor of declared components;
* :mod:`~otelstack.services` -- the collector, Jaeger, Prometheus and Alertmanager as components;
* :mod:`~otelstack.native` -- :class:`Stack`, the four on one supervisor;
* :mod:`~otelstack.topology` -- the agent/gateway topology on the same parts;
* :mod:`~otelstack.opensearch_home` -- OpenSearch's home laid out from Maven artifacts (once, cached);
* :mod:`~otelstack.opensearch` -- a multi-node OpenSearch cluster, Jaeger's store on jaeger-opensearch.yaml;
* :mod:`~otelstack.cli` -- ``up``/``status``/``down``/``build``/``build-opensearch``.

Stdlib only. ``scripts/stack`` is on pytest's ``pythonpath``, so tests ``import otelstack``.
"""

from ._base import CONFIG_DIR, LOOPBACK, REPO, StackError, cache_dir, default_run_dir
from .binaries import Binaries, cached_binary_paths, ensure_binaries, missing_prerequisites
from .native import COMPONENTS, Stack
from .polling import http_get, http_ok, wait_until
from .ports import Ports, free_ports, shared_port
from .render import (
                     DEFAULT_WEBHOOK_URL,
                     clean_env,
                     collector_env,
                     jaeger_env,
                     render_alertmanager,
                     render_prometheus,
                     render_rules,
)
from .supervisor import Component, Supervisor

__all__ = [
                     "COMPONENTS",
                     "CONFIG_DIR",
                     "DEFAULT_WEBHOOK_URL",
                     "LOOPBACK",
                     "REPO",
                     "Binaries",
                     "Component",
                     "Ports",
                     "Stack",
                     "StackError",
                     "Supervisor",
                     "cache_dir",
                     "cached_binary_paths",
                     "clean_env",
                     "collector_env",
                     "default_run_dir",
                     "ensure_binaries",
                     "free_ports",
                     "http_get",
                     "http_ok",
                     "jaeger_env",
                     "missing_prerequisites",
                     "render_alertmanager",
                     "render_prometheus",
                     "render_rules",
                     "shared_port",
                     "wait_until",
]
