"""OTLP with TLS and bearer-token auth, end to end (docs/security.md).

The collector built from builder-config.yaml runs ``otel-collector.yaml``
with the ``otlp-tls-auth.yaml`` overlay, on free loopback ports, with a
throwaway CA and server certificate made by ``openssl`` in the test's tmp dir
(no key is ever committed). Instrumented training processes
(``train_worker.py``) export to it with only the standard OTLP variables:

* with the CA, the token (``OTEL_EXPORTER_OTLP_HEADERS``) and an https
  endpoint, over gRPC and over HTTP: every span is delivered (``FlushResult``),
  the collector counts them as accepted, and its span metrics show the job;
* without the token, with a wrong one, or with the token over plaintext: the
  collector refuses, the SDK counts every span as dropped, and the collector
  accepted nothing.

The collector is this module's own process, stopped at the end; the session
``stack`` is not used.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import otelstack as stack_mod  # scripts/stack/otelstack/
import pytest
from environ import child_environ
from stack_helpers import scrape_samples, wait_until
from training_helpers import DEADLINE, E2E_MARKS, REPO, Training, new_job_id, worker_argv

pytestmark = E2E_MARKS

CONFIG = REPO / "collector-config"
STEPS = 3
SERVICE = "otel-training-e2e-tls"


# --------------------------------------------------------------------------
# A throwaway PKI
# --------------------------------------------------------------------------
@dataclass
class Pki:
    ca: Path
    cert: Path
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"openssl {' '.join(args)} failed:\n{proc.stderr}"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA and a server certificate for 127.0.0.1/localhost, valid for a day."""
    if shutil.which("openssl") is None:
        msg = "openssl not installed (needed to make the test's throwaway certificates)"
        if os.environ.get("CI"):
            pytest.fail(msg + " (CI is set: the CI machine must have it)", pytrace=False)
        pytest.skip(msg)
    d = tmp_path_factory.mktemp("pki")
    d.chmod(0o700)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
             "-subj", "/CN=otel-training e2e throwaway CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign", cwd=d)
    _openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1", cwd=d)
    (d / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
    )
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.pem", "-days", "1", "-extfile", "server.ext", cwd=d)
    return Pki(ca=d / "ca.pem", cert=d / "server.pem", key=d / "server.key")


# --------------------------------------------------------------------------
# The collector, with the overlay
# --------------------------------------------------------------------------
@dataclass
class TlsCollector:
    proc: subprocess.Popen
    log: Path
    ports: dict[str, int]
    token: str

    @property
    def telemetry_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['telemetry']}/metrics"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['prometheus']}/metrics"

    def endpoint(self, protocol: str, scheme: str = "https") -> str:
        port = self.ports["grpc"] if protocol == "grpc" else self.ports["http"]
        return f"{scheme}://127.0.0.1:{port}"

    def accepted_spans(self) -> float:
        """otelcol_receiver_accepted_spans (with or without _total), both transports."""
        return sum(
            value
            for name in ("otelcol_receiver_accepted_spans", "otelcol_receiver_accepted_spans_total")
            for labels, value in scrape_samples(self.telemetry_url, name)
            if labels.get("receiver") == "otlp"
        )


def _start_collector(binary: Path, run_dir: Path, pki: Pki, token_file: Path) -> tuple[subprocess.Popen, dict[str, int], Path]:
    names = ["grpc", "http", "health", "prometheus", "telemetry", "jaeger"]
    ports = dict(zip(names, stack_mod.free_ports(len(names))))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTELCOL_", "JAEGER_", "OTEL_"))}
    env.update(
        OTELCOL_OTLP_GRPC_ENDPOINT=f"127.0.0.1:{ports['grpc']}",
        OTELCOL_OTLP_HTTP_ENDPOINT=f"127.0.0.1:{ports['http']}",
        OTELCOL_HEALTH_ENDPOINT=f"127.0.0.1:{ports['health']}",
        OTELCOL_PROMETHEUS_ENDPOINT=f"127.0.0.1:{ports['prometheus']}",
        OTELCOL_TELEMETRY_HOST="127.0.0.1",
        OTELCOL_TELEMETRY_PORT=str(ports["telemetry"]),
        # Nothing listens there: the trace pipeline's exporter queues and
        # retries; delivery is checked at the receiver and in the span metrics.
        JAEGER_OTLP_ENDPOINT=f"127.0.0.1:{ports['jaeger']}",
        OTELCOL_ALERTS_FILE=str(run_dir / "alerts.jsonl"),
        OTELCOL_SPANMETRICS_FLUSH_INTERVAL="1s",
        OTELCOL_TLS_CERT_FILE=str(pki.cert),
        OTELCOL_TLS_KEY_FILE=str(pki.key),
        OTELCOL_OTLP_TOKEN_FILE=str(token_file),
    )
    log = run_dir / "collector.log"
    argv = [str(binary), f"--config={CONFIG / 'otel-collector.yaml'}", f"--config={CONFIG / 'otlp-tls-auth.yaml'}"]
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, env=env, cwd=run_dir, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    return proc, ports, log


def _stop(proc: subprocess.Popen) -> None:
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    assert proc.poll() is not None, f"collector pid {proc.pid} survived SIGKILL"


@pytest.fixture(scope="module")
def tls_collector(stack_binaries, pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsCollector]:
    run_dir = tmp_path_factory.mktemp("tls-collector")
    token = secrets.token_urlsafe(24)
    token_file = run_dir / "tokens"
    token_file.write_text(f"{token} # e2e client\n")
    token_file.chmod(0o600)
    for attempt in range(3):  # a port taken between choosing and binding it: retry on fresh ports
        proc, ports, log = _start_collector(stack_binaries.otelcol, run_dir, pki, token_file)

        def healthy_or_exited() -> bool:
            return proc.poll() is not None or stack_mod.http_get(f"http://127.0.0.1:{ports['health']}/", timeout=1.0)[0] == 200

        try:
            wait_until(healthy_or_exited, timeout=DEADLINE, what="the TLS collector's health check")
        except TimeoutError as exc:
            _stop(proc)
            pytest.fail(f"{exc}\n{log.read_text(errors='replace')[-3000:]}", pytrace=False)
        if proc.poll() is None:
            break
        if attempt == 2 or "address already in use" not in log.read_text(errors="replace"):
            pytest.fail(f"the TLS collector exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}", pytrace=False)
    try:
        yield TlsCollector(proc, log, ports, token)
    finally:
        _stop(proc)


# --------------------------------------------------------------------------
# Training processes exporting to it
# --------------------------------------------------------------------------
def _client_env(collector: TlsCollector, pki: Pki, job_id: str, *, protocol: str, headers: str | None,
                scheme: str = "https") -> dict[str, str]:
    """Only the standard OTLP exporter variables (docs/security.md)."""
    env = child_environ("E2E_TRAINING_RUN")
    # requests lets these override the HTTP exporter's OTEL_EXPORTER_OTLP_CERTIFICATE
    # (psf/requests#3829; docs/security.md): a machine that sets them could not
    # verify our CA over HTTP.
    env.pop("REQUESTS_CA_BUNDLE", None)
    env.pop("CURL_CA_BUNDLE", None)
    env.update(
        OTEL_SERVICE_NAME=SERVICE,
        OTEL_TRAINING_JOB_ID=job_id,
        OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint(protocol, scheme),
        OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
        OTEL_EXPORTER_OTLP_CERTIFICATE=str(pki.ca),
        OTEL_BSP_SCHEDULE_DELAY="200",
        OTEL_METRIC_EXPORT_INTERVAL="500",
        # A refused TLS handshake (plaintext case) is retried; bound it.
        OTEL_EXPORTER_OTLP_TIMEOUT="2",
        PYTHONUNBUFFERED="1",
    )
    if scheme == "http":
        env["OTEL_EXPORTER_OTLP_INSECURE"] = "true"
    if headers is not None:
        env["OTEL_EXPORTER_OTLP_HEADERS"] = headers
    return env


def _train(tmp_path: Path, env: dict[str, str]) -> dict:
    """Run train_worker.py to the end; its FlushResult and the number of spans it ended."""
    result = tmp_path / "result.json"
    argv = worker_argv("--steps", str(STEPS), "--substeps", "1", "--result", str(result), "--shutdown-timeout", "8")
    with Training(argv, env=env, log=tmp_path / "train.log") as run:
        assert run.wait(timeout=DEADLINE) == 0, run.output()[-4000:]
        out = json.loads(result.read_text())
    assert out["spans_ended"] >= STEPS + 2, out  # train, epoch, steps (and substeps)
    return out


def _step_calls(collector: TlsCollector, job_id: str) -> float | None:
    found = [value for labels, value in scrape_samples(collector.metrics_url, "traces_span_metrics_calls_total")
             if labels.get("training_job_id") == job_id and labels.get("span_name") == "training.step"]
    return found[0] if found and found[0] > 0 else None


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_client_with_the_token_is_delivered(tls_collector, pki, tmp_path, protocol):
    job_id = new_job_id("tls-ok")
    before = tls_collector.accepted_spans()
    env = _client_env(tls_collector, pki, job_id, protocol=protocol, headers=f"authorization=Bearer%20{tls_collector.token}")
    result = _train(tmp_path, env)
    assert (result["exported"], result["dropped"]) == (result["spans_ended"], 0), result
    assert tls_collector.accepted_spans() - before == result["exported"]
    # The spans went through the pipelines: the job's step count in the span metrics.
    assert wait_until(lambda: _step_calls(tls_collector, job_id), timeout=DEADLINE,
                      what=f"span metrics of {job_id} at the collector") == STEPS


@pytest.mark.parametrize(
    "protocol,headers,scheme",
    [
        ("grpc", None, "https"),
        ("http/protobuf", None, "https"),
        ("grpc", "authorization=Bearer%20not-the-token", "https"),
        ("http/protobuf", "authorization=Bearer%20not-the-token", "https"),
        ("grpc", "TOKEN", "http"),  # the right token, but over plaintext: TLS is mandatory
    ],
    ids=["grpc-no-token", "http-no-token", "grpc-wrong-token", "http-wrong-token", "grpc-plaintext"],
)
def test_client_without_the_token_is_refused(tls_collector, pki, tmp_path, protocol, headers, scheme):
    if headers == "TOKEN":
        headers = f"authorization=Bearer%20{tls_collector.token}"
    job_id = new_job_id("tls-refused")
    before = tls_collector.accepted_spans()
    env = _client_env(tls_collector, pki, job_id, protocol=protocol, headers=headers, scheme=scheme)
    result = _train(tmp_path, env)
    # The SDK counts every span as dropped; nothing was accepted by the collector.
    assert result["exported"] == 0, result
    assert result["dropped"] == result["spans_ended"], result
    assert tls_collector.accepted_spans() == before


def test_overlay_refuses_to_start_without_its_settings(stack_binaries, tmp_path):
    """No certificate, key or token file: the collector does not fall back to plaintext or no auth."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTELCOL_", "JAEGER_", "OTEL_"))}
    proc = subprocess.run(
        [str(stack_binaries.otelcol), "validate", f"--config={CONFIG / 'otel-collector.yaml'}", f"--config={CONFIG / 'otlp-tls-auth.yaml'}"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode != 0
    assert "TLS configuration must include both certificate and key" in proc.stderr
    assert "no bearer token provided" in proc.stderr


@pytest.mark.parametrize("name", ["otel-collector.yaml", "gateway.yaml", "agent.yaml"])
def test_overlay_applies_to_every_collector_config(stack_binaries, pki, tmp_path, name):
    token_file = tmp_path / "tokens"
    token_file.write_text("t\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTELCOL_", "JAEGER_", "OTEL_"))}
    env.update(OTELCOL_TLS_CERT_FILE=str(pki.cert), OTELCOL_TLS_KEY_FILE=str(pki.key), OTELCOL_OTLP_TOKEN_FILE=str(token_file))
    proc = subprocess.run(
        [str(stack_binaries.otelcol), "validate", f"--config={CONFIG / name}", f"--config={CONFIG / 'otlp-tls-auth.yaml'}"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
