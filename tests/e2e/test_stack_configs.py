"""Every shipped config is accepted by the binary that runs it, and the
docker-compose file agrees with the native stack.

* ``otelcol validate`` (the collector built from builder-config.yaml) on
  otel-collector.yaml, agent.yaml and gateway.yaml; ``jaeger validate`` on
  jaeger.yaml. A deliberately broken copy must be rejected, so a validator
  that accepts anything would fail this test.
* docker-compose.yml: parses, mounts only files that exist, and pins the same
  versions as the native stack (collector and Jaeger from build.sh, Prometheus
  and Alertmanager from the installed Debian packages).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "collector-config"

COLLECTOR_CONFIGS = ["otel-collector.yaml", "agent.yaml", "gateway.yaml"]


def _validate(binary: Path, config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), "validate", f"--config={config}"], capture_output=True, text=True, timeout=120)


@pytest.mark.e2e
@pytest.mark.timeout(1800)  # a cold cache builds the binaries first
@pytest.mark.parametrize("name", COLLECTOR_CONFIGS)
def test_collector_configs_validate(stack_binaries, name):
    proc = _validate(stack_binaries.otelcol, CONFIG / name)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.e2e
@pytest.mark.timeout(1800)
def test_jaeger_config_validates(stack_binaries):
    proc = _validate(stack_binaries.jaeger, CONFIG / "jaeger.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.e2e
@pytest.mark.timeout(1800)
@pytest.mark.parametrize(
    "mutation",
    [
        ("exporters: [file/alerts, debug/alerts]", "exporters: [file/alerts, debug/nonexistent]"),
        ('attributes["training.alert.kind"] == nil', 'attributes["training.alert.kind"] == = nil'),
        ("endpoint: ${env:OTELCOL_PROMETHEUS_ENDPOINT:-0.0.0.0:8889}", "endpointt: ${env:OTELCOL_PROMETHEUS_ENDPOINT:-0.0.0.0:8889}"),
    ],
    ids=["undefined-component", "bad-ottl", "unknown-field"],
)
def test_validate_rejects_broken_config(stack_binaries, tmp_path, mutation):
    old, new = mutation
    src = (CONFIG / "otel-collector.yaml").read_text()
    assert old in src
    broken = tmp_path / "broken.yaml"
    broken.write_text(src.replace(old, new, 1))
    proc = _validate(stack_binaries.otelcol, broken)
    assert proc.returncode != 0, f"validate accepted a broken config:\n{proc.stdout}{proc.stderr}"


@pytest.mark.e2e
@pytest.mark.timeout(1800)
def test_jaeger_validate_rejects_broken_config(stack_binaries, tmp_path):
    src = (CONFIG / "jaeger.yaml").read_text()
    broken = tmp_path / "jaeger-broken.yaml"
    broken.write_text(src.replace("enable_tracing: false", "enable_tracingg: false", 1))
    assert broken.read_text() != src
    proc = _validate(stack_binaries.jaeger, broken)
    assert proc.returncode != 0, f"jaeger validate accepted a broken config:\n{proc.stdout}{proc.stderr}"


@pytest.mark.e2e
@pytest.mark.timeout(1800)
def test_collector_has_exactly_the_manifest_components(stack_binaries):
    """`components` of the built binary lists what builder-config.yaml asks for."""
    proc = subprocess.run([str(stack_binaries.otelcol), "components"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    comps = yaml.safe_load(proc.stdout)
    names = {kind: {c["name"] for c in comps.get(kind) or []} for kind in ("receivers", "processors", "exporters", "connectors", "extensions")}
    assert {"otlp"} <= names["receivers"]
    assert {"memory_limiter", "batch", "filter", "tail_sampling", "attributes", "resource"} <= names["processors"]
    assert {"debug", "file", "prometheus", "load_balancing"} <= names["exporters"]
    assert {"otlp_grpc", "otlp_http"} <= names["exporters"] or {"otlp", "otlphttp"} <= names["exporters"]
    assert {"span_metrics", "count", "routing", "forward"} <= names["connectors"]
    assert {"health_check"} <= names["extensions"]
    assert comps["buildinfo"]["version"] == _manifest_version()


# --------------------------------------------------------------------------
# docker-compose.yml (Docker cannot run here: check it statically)
# --------------------------------------------------------------------------
def _manifest_version() -> str:
    return yaml.safe_load((CONFIG / "builder-config.yaml").read_text())["dist"]["version"]


def _compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def test_compose_parses_and_has_the_four_services():
    services = _compose()["services"]
    assert {"otel-collector", "jaeger", "prometheus", "alertmanager"} <= set(services)
    for name in ("jaeger", "prometheus", "alertmanager", "otel-collector-health"):
        assert "healthcheck" in services[name], f"{name} has no healthcheck"


def test_compose_mounts_existing_files():
    compose = _compose()
    named_volumes = set(compose.get("volumes") or {})
    for name, svc in compose["services"].items():
        for vol in svc.get("volumes", []):
            src = vol.split(":", 1)[0]
            if src in named_volumes:
                continue
            assert (REPO / src).exists(), f"{name} mounts {src}, which does not exist"


def test_compose_config_paths_match_mounts():
    """Each --config/--config.file a service is started with is one of its mounts."""
    for name, svc in _compose()["services"].items():
        targets = {v.split(":")[1] for v in svc.get("volumes", [])}
        for arg in svc.get("command") or []:
            m = re.match(r"--config(?:\.file)?=(\S+)", str(arg))
            if m:
                assert m.group(1) in targets, f"{name}: {m.group(1)} is not mounted"


def test_compose_versions_match_the_native_stack(stack_mod_paths):
    images = {name: svc["image"] for name, svc in _compose()["services"].items()}
    assert images["otel-collector"] == f"otel/opentelemetry-collector-contrib:{_manifest_version()}"
    assert images["jaeger"] == f"jaegertracing/jaeger:{stack_mod_paths['JAEGER_VERSION']}"


def _installed_version(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return None
    m = re.search(r"version (\d+\.\d+\.\d+)", out.stdout + out.stderr)
    return m.group(1) if m else None


@pytest.mark.parametrize(
    "service,argv,image",
    [
        ("prometheus", ["prometheus", "--version"], "prom/prometheus"),
        ("alertmanager", ["prometheus-alertmanager", "--version"], "prom/alertmanager"),
    ],
)
def test_compose_prometheus_versions_match_debian(service, argv, image):
    version = _installed_version(argv)
    if version is None:
        pytest.skip(f"{argv[0]} not installed; cannot compare with the compose pin")
    assert _compose()["services"][service]["image"] == f"{image}:v{version}"


@pytest.fixture(scope="module")
def stack_mod_paths():
    import stack as stack_mod  # scripts/stack/stack.py, on sys.path via conftest

    return stack_mod.cached_binary_paths()
