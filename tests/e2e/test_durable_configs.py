"""The shipped configs keep what they acknowledged (checked on the files; the
behaviour itself is proven by tests/e2e/test_durability.py and test_topology.py):

* every exporter that sends traces on (to Jaeger, to the gateways) has a
  sending queue on disk, in a ``file_storage`` extension the service enables;
* no ``batch`` processor sits in front of such an exporter in the single
  collector or the agent: it would answer the rank before the spans are on disk;
* Jaeger stores traces in Badger on disk with a retention, and docker-compose
  keeps the Badger directory and the collector's queue in named volumes that
  the images' user may write.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "collector-config"


def _load(name: str) -> dict:
    return yaml.safe_load((CONFIG / name).read_text())


#: config -> the exporters whose queue must be on disk
FORWARDING = {
    "otel-collector.yaml": ["otlp_grpc/jaeger"],
    "gateway.yaml": ["otlp_grpc/jaeger"],
    "agent.yaml": ["load_balancing/traces"],
}


@pytest.mark.parametrize("name", sorted(FORWARDING))
def test_forwarding_exporters_queue_on_disk(name):
    config = _load(name)
    enabled = set(config["service"]["extensions"])
    for exporter in FORWARDING[name]:
        queue = config["exporters"][exporter]["sending_queue"]
        assert queue.get("enabled", True), f"{name}: {exporter} has no sending queue"
        storage = queue.get("storage")
        assert storage and storage.split("/")[0] == "file_storage", f"{name}: {exporter}'s queue is in memory"
        assert storage in config["extensions"] and storage in enabled, f"{name}: {storage} is not defined and enabled"
        assert config["exporters"][exporter]["retry_on_failure"]["max_elapsed_time"] in ("0s", 0), (
            f"{name}: {exporter} gives up retrying, and what it gives up is lost")


@pytest.mark.parametrize("name", ["otel-collector.yaml", "agent.yaml"])
def test_no_batch_processor_before_a_durable_queue(name):
    """A batch processor acknowledges spans it only holds in memory."""
    config = _load(name)
    for pipeline, spec in config["service"]["pipelines"].items():
        if set(spec["exporters"]) & set(FORWARDING[name]):
            batches = [p for p in spec.get("processors", []) if p.split("/")[0] == "batch"]
            assert batches == [], f"{name}: pipeline {pipeline} batches in memory before the queue on disk: {batches}"


def test_jaeger_stores_on_disk_with_a_retention():
    config = _load("jaeger.yaml")
    backends = config["extensions"]["jaeger_storage"]["backends"]
    store = config["extensions"]["jaeger_query"]["storage"]["traces"]
    assert config["exporters"]["jaeger_storage_exporter"]["trace_storage"] == store
    badger = backends[store]["badger"]
    assert badger["ephemeral"] is False
    assert "JAEGER_BADGER_DIRECTORY" in badger["directories"]["keys"]
    assert "JAEGER_BADGER_DIRECTORY" in badger["directories"]["values"]
    assert "JAEGER_SPAN_TTL" in badger["ttl"]["spans"]


def test_compose_keeps_durable_data_in_volumes_the_services_may_write():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services, volumes = compose["services"], set(compose["volumes"])
    wanted = {
        ("jaeger", "JAEGER_BADGER_DIRECTORY"): "jaeger-data",
        ("otel-collector", "OTELCOL_FILE_STORAGE_DIR"): "collector-queue",
    }
    chowned = services["volume-init"]["command"]
    assert chowned[:3] == ["chown", "-R", "10001:10001"]
    for (service, variable), volume in wanted.items():
        assert volume in volumes
        directory = services[service]["environment"][variable]
        mounts = dict(v.split(":")[:2][::-1] for v in services[service]["volumes"])
        mounted_at = next((target for target in mounts if directory == target or directory.startswith(target + "/")), None)
        assert mounted_at is not None and mounts[mounted_at] == volume, f"{service}: {directory} is not on the {volume} volume"
        init_mounts = dict(v.split(":")[:2][::-1] for v in services["volume-init"]["volumes"])
        assert init_mounts.get(mounted_at) == volume and mounted_at in chowned, f"{volume} is not handed to uid 10001"
        assert services[service]["depends_on"]["volume-init"]["condition"] == "service_completed_successfully"
