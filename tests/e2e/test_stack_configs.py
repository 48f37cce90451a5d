"""Every shipped config is accepted by the binary that runs it, and the
docker-compose file agrees with the native stack.

* ``otelcol validate`` (the collector built from builder-config.yaml) on
  otel-collector.yaml, agent.yaml and gateway.yaml; ``jaeger validate`` on
  jaeger.yaml. A deliberately broken copy must be rejected, so a validator
  that accepts anything would fail this test.
* docker-compose.yml: parses, mounts only files that exist, and pins the same
  versions as the native stack (collector and Jaeger from build.sh, Prometheus
  and Alertmanager from the installed Debian packages).
* Listening addresses: with none of its variables set, every shipped config
  listens on loopback only, read from the files and from the sockets of the
  binaries run with them; docker-compose publishes on 127.0.0.1 by default.
"""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import subprocess
import time
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
def test_agent_dns_overlay_validates(stack_binaries):
    proc = subprocess.run([str(stack_binaries.otelcol), "validate", f"--config={CONFIG / 'agent.yaml'}",
                           f"--config={CONFIG / 'agent-dns.yaml'}"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


#: Jaeger's configs: Badger (the stack's), OpenSearch (past one node, docs/scale.md; validated only).
JAEGER_CONFIGS = ["jaeger.yaml", "jaeger-opensearch.yaml"]


@pytest.mark.e2e
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", JAEGER_CONFIGS)
def test_jaeger_config_validates(stack_binaries, name):
    proc = _validate(stack_binaries.jaeger, CONFIG / name)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.e2e
@pytest.mark.timeout(1800)
@pytest.mark.parametrize(
    "mutation",
    [
        ("exporters: [file/alerts, debug/alerts]", "exporters: [file/alerts, debug/nonexistent]"),
        ('attributes["training.alert.kind"] == nil', 'attributes["training.alert.kind"] == = nil'),
        ("endpoint: ${env:OTELCOL_PROMETHEUS_ENDPOINT:-127.0.0.1:8889}", "endpointt: ${env:OTELCOL_PROMETHEUS_ENDPOINT:-127.0.0.1:8889}"),
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
@pytest.mark.parametrize("name,old,new", [
    ("jaeger.yaml", "enable_tracing: false", "enable_tracingg: false"),
    ("jaeger.yaml", "ephemeral: false", "ephemeral: maybe"),
    ("jaeger-opensearch.yaml", "max_actions: ", "max_actionz: "),
    ("jaeger-opensearch.yaml", ":-[https://opensearch:9200]}", ":-[not a url]}"),
], ids=["unknown-field", "badger-bad-value", "opensearch-unknown-field", "opensearch-bad-url"])
def test_jaeger_validate_rejects_broken_config(stack_binaries, tmp_path, name, old, new):
    src = (CONFIG / name).read_text()
    broken = tmp_path / "jaeger-broken.yaml"
    assert old in src
    broken.write_text(src.replace(old, new, 1))
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
    assert {"health_check", "bearertokenauth"} <= names["extensions"]  # bearertokenauth: otlp-tls-auth.yaml
    assert "file_storage" in names["extensions"]  # persistent sending queues
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
    import otelstack as stack_mod  # scripts/stack/otelstack/

    return stack_mod.cached_binary_paths()


# --------------------------------------------------------------------------
# Listening addresses: loopback unless told otherwise
# --------------------------------------------------------------------------
#: The collector and Jaeger configs (builder-config.yaml is the build manifest).
SERVICE_CONFIGS = [*COLLECTOR_CONFIGS, "jaeger.yaml"]
#: Checked on the file only: Jaeger on OpenSearch does not start without a cluster.
STATIC_ONLY_CONFIGS = ["jaeger-opensearch.yaml"]
_ENV_REF = re.compile(r"\$\{env:(\w+)(?::-([^}]*))?\}")


def _unset(value: str) -> str:
    """A config value as the collector reads it when none of its variables is set."""
    return _ENV_REF.sub(lambda m: m.group(2) or "", value)


def _strings(node, path=()):
    """(path, value) of every string in a parsed YAML document."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _strings(value, (*path, str(key)))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _strings(value, (*path, str(i)))
    elif isinstance(node, str):
        yield path, node


def _listen_addresses(config: dict) -> dict[str, str]:
    """Where a collector (or Jaeger) config listens, by YAML path, with its variables unset:
    every ``endpoint`` of a receiver or an extension, a prometheus (pull) exporter's
    ``endpoint``, and the ``host:port`` of the self-metrics readers."""
    out = {}
    for path, value in _strings(config):
        if path[-1] != "endpoint":
            continue
        if path[0] in ("receivers", "extensions") or (path[0] == "exporters" and path[1].split("/")[0] == "prometheus"):
            out[".".join(path)] = _unset(value)
    for i, reader in enumerate(config.get("service", {}).get("telemetry", {}).get("metrics", {}).get("readers", [])):
        prom = reader.get("pull", {}).get("exporter", {}).get("prometheus")
        if prom is not None:
            out[f"service.telemetry.metrics.readers.{i}"] = f"{_unset(str(prom['host']))}:{_unset(str(prom['port']))}"
    return out


def _host(address: str) -> str:
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return host.strip("[]")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@pytest.mark.parametrize("name", [*SERVICE_CONFIGS, *STATIC_ONLY_CONFIGS])
def test_shipped_configs_listen_on_loopback_by_default(name):
    """Outside a container nothing is set: every listener must then be loopback
    (docker-compose.yml sets the addresses to 0.0.0.0 inside its containers)."""
    config = yaml.safe_load((CONFIG / name).read_text())
    listeners = _listen_addresses(config)
    assert any(k.startswith("receivers.") for k in listeners), f"no receiver endpoint found in {name}: {listeners}"
    assert any(k.startswith("service.telemetry.") for k in listeners), f"no self-metrics reader found in {name}"
    open_ = {k: v for k, v in listeners.items() if not _is_loopback(_host(v))}
    assert open_ == {}, f"{name} listens beyond loopback by default: {open_}"
    # No other value defaults to all interfaces either (a listener this test does not know of).
    wildcard = {".".join(p): v for p, v in _strings(config) if re.match(r"(0\.0\.0\.0|\[?::\]?)(:|$)", _unset(v))}
    assert wildcard == {}, f"{name} has wildcard addresses by default: {wildcard}"


def _listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of the TCP sockets listening in ``pid``'s network namespace."""
    found = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as fh:
            for line in fh.read().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if state != "0A":  # TCP_LISTEN
                    continue
                addr, port = local.split(":")
                raw = b"".join(bytes.fromhex(addr[i:i + 8])[::-1] for i in range(0, len(addr), 8))
                found.add((str(ipaddress.ip_address(raw)), int(port, 16)))
    return found


def _private_netns_argv() -> list[str]:
    """``unshare`` arguments for a new network namespace, or skip where that is not allowed."""
    for argv in (["unshare", "--net"], ["unshare", "--map-root-user", "--net"]):
        try:
            if subprocess.run([*argv, "true"], capture_output=True, timeout=30).returncode == 0:
                return argv
        except FileNotFoundError:
            break
    pytest.skip("cannot create a network namespace here (unshare); the static check above still runs")


@pytest.mark.e2e
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", SERVICE_CONFIGS)
def test_binaries_listen_on_loopback_only_by_default(stack_binaries, tmp_path, name):
    """The built collector or Jaeger, run with a shipped config and no address
    variable set, listens on loopback only. Each runs in its own network
    namespace, so the fixed default ports cannot collide with anything."""
    unshare = _private_netns_argv()
    binary = stack_binaries.jaeger if name == "jaeger.yaml" else stack_binaries.otelcol
    expected_ports = {int(a.rsplit(":", 1)[1]) for a in _listen_addresses(yaml.safe_load((CONFIG / name).read_text())).values()}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTELCOL_", "JAEGER_", "OTEL_"))}
    # Not addresses: the default paths are system directories.
    env["OTELCOL_ALERTS_FILE"] = str(tmp_path / "alerts.jsonl")
    env["OTELCOL_FILE_STORAGE_DIR"] = str(tmp_path / "queue")
    env["JAEGER_BADGER_DIRECTORY"] = str(tmp_path / "badger")
    log = tmp_path / "service.log"
    own_netns = os.readlink("/proc/self/ns/net")
    with open(log, "wb") as out:
        proc = subprocess.Popen([*unshare, str(binary), f"--config={CONFIG / name}"], env=env, cwd=tmp_path,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def all_listening():
            if proc.poll() is not None:
                raise AssertionError(f"{binary.name} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            if os.readlink(f"/proc/{proc.pid}/ns/net") == own_netns:
                return None  # unshare has not switched yet: this would read the host's sockets
            sockets = _listening(proc.pid)
            return sockets if expected_ports <= {port for _, port in sockets} else None

        deadline, sockets = time.monotonic() + 60, None
        while sockets is None:
            try:
                sockets = all_listening()
            except OSError:  # /proc entry of a process that just exec'd
                sockets = None
            assert sockets is not None or time.monotonic() < deadline, (
                f"{binary.name} did not open {sorted(expected_ports)} within 60s:\n{log.read_text()[-3000:]}")
            if sockets is None:
                time.sleep(0.1)
        beyond = sorted(s for s in sockets if not _is_loopback(s[0]))
        assert beyond == [], f"{binary.name} --config={name} listens beyond loopback: {beyond}"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


# --------------------------------------------------------------------------
# docker-compose.yml publishes on loopback unless told otherwise
# --------------------------------------------------------------------------
_COMPOSE_VAR = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def _compose_interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR:-default}`` / ``${VAR-default}`` / ``${VAR}`` (enough for the ports)."""
    return _COMPOSE_VAR.sub(lambda m: env.get(m.group(1)) or (m.group(2) or ""), value)


def _published(env: dict[str, str]) -> list[tuple[str, str, str]]:
    """(service, host IP, host port) of every published port, as compose would read them with ``env``."""
    out = []
    for name, svc in _compose()["services"].items():
        for port in svc.get("ports", []):
            if isinstance(port, dict):  # long syntax
                out.append((name, _compose_interpolate(str(port.get("host_ip", "")), env), str(port.get("published", ""))))
                continue
            spec = _compose_interpolate(str(port), env).split("/")[0]
            parts = spec.rsplit(":", 2)
            if len(parts) < 3:  # "4317:4317" or "4317": every interface
                parts = ["", *parts] if len(parts) == 2 else ["", parts[0], parts[0]]
            out.append((name, parts[0].strip("[]"), parts[1]))
    return out


def test_compose_publishes_on_loopback_by_default():
    published = _published({})
    assert {(s, p) for s, _, p in published} >= {("otel-collector", "4317"), ("jaeger", "16686"), ("prometheus", "9090"), ("alertmanager", "9093")}
    open_ = [(s, ip, p) for s, ip, p in published if ip != "127.0.0.1"]
    assert open_ == [], f"published beyond loopback by default: {open_}"


def test_compose_publish_address_can_be_widened():
    """Told otherwise, compose publishes where it is told: OTLP and the UIs separately."""
    published = _published({"OTEL_TRAINING_OTLP_PUBLISH_ADDRESS": "0.0.0.0"})
    assert {p for s, ip, p in published if ip == "0.0.0.0"} == {"4317", "4318"}
    published = _published({"OTEL_TRAINING_PUBLISH_ADDRESS": "10.1.2.3"})
    assert "16686" in {p for s, ip, p in published if ip == "10.1.2.3"}
    assert {p for s, ip, p in published if ip == "127.0.0.1"} == {"4317", "4318"}


def test_compose_services_listen_where_they_are_reached():
    """Inside its container a service must listen on all interfaces where another
    container (or a published port) reaches it, since the configs default to loopback."""
    services = _compose()["services"]
    collector = services["otel-collector"]["environment"]
    for var in ("OTELCOL_OTLP_GRPC_ENDPOINT", "OTELCOL_OTLP_HTTP_ENDPOINT", "OTELCOL_HEALTH_ENDPOINT", "OTELCOL_PROMETHEUS_ENDPOINT"):
        assert _host(collector[var]) == "0.0.0.0", var
    assert collector["OTELCOL_TELEMETRY_HOST"] == "0.0.0.0"
    jaeger = services["jaeger"]["environment"]
    for var in ("JAEGER_OTLP_GRPC_ENDPOINT", "JAEGER_QUERY_HTTP_ENDPOINT"):  # the collector's exporter, the published UI
        assert _host(jaeger[var]) == "0.0.0.0", var
    assert jaeger["JAEGER_METRICS_HOST"] == "0.0.0.0"  # scraped by Prometheus


def test_native_stack_listens_on_loopback_only(tmp_path):
    """The native stack (scripts/stack/otelstack/) gives every process a loopback address: the collector
    and Jaeger through their variables, Prometheus and Alertmanager through their
    flags (which otherwise default to all interfaces), and no Alertmanager cluster port."""
    import otelstack as stack_mod  # scripts/stack/otelstack/

    fake = Path("/nonexistent")
    s = stack_mod.Stack(tmp_path, binaries=stack_mod.Binaries(fake, fake, fake, fake))
    s._prepare()  # renders configs and builds argv/env; starts nothing
    addresses = {}
    for name, proc in s.procs.items():
        for key, value in proc.env.items():
            if key.startswith(("OTELCOL_", "JAEGER_")) and (key.endswith(("_ENDPOINT", "_HOST"))):
                addresses[f"{name} {key}"] = value
        for arg in proc.argv:
            if arg.startswith(("--web.listen-address=", "--cluster.listen-address=")):
                addresses[f"{name} {arg.split('=')[0]}"] = arg.split("=", 1)[1]
    assert {"prometheus --web.listen-address", "alertmanager --web.listen-address", "collector OTELCOL_OTLP_GRPC_ENDPOINT",
            "jaeger JAEGER_QUERY_HTTP_ENDPOINT"} <= set(addresses)
    assert addresses.pop("alertmanager --cluster.listen-address") == ""  # gossip off
    open_ = {k: v for k, v in addresses.items() if not _is_loopback(_host(v))}
    assert open_ == {}, f"the native stack listens beyond loopback: {open_}"
