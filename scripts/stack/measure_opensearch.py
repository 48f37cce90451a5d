#!/usr/bin/env python3
"""Spans/s into an OpenSearch cluster through Jaeger v2 on the shipped jaeger-opensearch.yaml, and the
bytes each span takes there (docs/scale.md's OpenSearch figures).

Starts ``--nodes`` OpenSearch nodes (scripts/stack/otelstack/opensearch.py) and one Jaeger on
collector-config/jaeger-opensearch.yaml with its shipped defaults (daily span indices of 6 shards and
1 replica, 4 bulk workers of up to 5,000 spans) unless told otherwise, in a temporary directory. The
spans are the package's own: a simulated rank (sim_rank.py, the file exporter) writes a few hundred;
one of its export requests (512 spans, with the rank's whole resource) is then sent to Jaeger's OTLP/gRPC
receiver by ``--senders`` processes for ``--duration`` seconds, each time with fresh trace ids.

Measured: spans Jaeger accepted, documents in the span indices over time (``_count`` after a refresh),
so the rate OpenSearch indexed at while the load ran and until the count stopped moving; the CPU
seconds of the nodes and of Jaeger (from /proc) per 10,000 spans; the bytes a span takes in the
primaries and with the replicas, after a flush and again after a force merge to one segment a shard
(what a finished daily index settles at).

Everything shares this machine's cores (the senders too): the rate is what this machine sustains,
the per-span CPU and bytes are what carries over to a real cluster.

    .venv/bin/python scripts/stack/measure_opensearch.py [--nodes 3] [--duration 30] [--senders 1] [--heap-mb 512]
"""

from __future__ import annotations

import argparse
import base64
import json
import multiprocessing
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import otelstack as stack_mod  # noqa: E402  (scripts/stack/otelstack/)
from otelstack import services  # noqa: E402
from otelstack.opensearch import OpenSearchCluster  # noqa: E402
from otelstack.render import clean_env, jaeger_opensearch_env  # noqa: E402

PREFIX = "measure"
_IDS = ("traceId", "spanId", "parentSpanId")


def rank_request(work: Path) -> tuple[bytes, int]:
    """One OTLP export request of the package's spans (protobuf) and its span count: a simulated rank's first
    512-span batch, written by the file exporter (OTLP JSON, ids in hex) and re-encoded."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    out = work / "rank"
    env = dict(clean_env(), OTEL_TRAINING_EXPORTER="file", OTEL_TRAINING_OUTPUT_DIR=str(out), OTEL_SERVICE_NAME=PREFIX,
               OTEL_TRAINING_TRACE_MAX_SPANS="12", PYTHONPATH=str(REPO))
    subprocess.run([sys.executable, str(HERE / "sim_rank.py"), "--steps", "200", "--rate", "0",
                    "--result", str(work / "rank.json")], env=env, check=True, capture_output=True, timeout=300)

    def b64(node):
        if isinstance(node, dict):
            return {k: (base64.b64encode(bytes.fromhex(v)).decode() if k in _IDS else b64(v)) for k, v in node.items()}
        return [b64(v) for v in node] if isinstance(node, list) else node

    first = json.loads((out / "traces-r0.jsonl").read_text().splitlines()[0])
    message = json_format.ParseDict(b64(first), trace_service_pb2.ExportTraceServiceRequest())
    spans = sum(len(ss.spans) for rs in message.resource_spans for ss in rs.scope_spans)
    return message.SerializeToString(), spans


def _trace_offsets(raw: bytes) -> list[list[int]]:
    """Where each trace id sits in the encoded request (field 1 of a span: tag 0x0a, length 16)."""
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    message = trace_service_pb2.ExportTraceServiceRequest.FromString(raw)
    ids = {span.trace_id for rs in message.resource_spans for ss in rs.scope_spans for span in ss.spans}
    offsets = []
    for trace_id in sorted(ids):
        needle, found = b"\x0a\x10" + trace_id, []
        at = raw.find(needle)
        while at >= 0:
            found.append(at + 2)
            at = raw.find(needle, at + 1)
        offsets.append(found)
    return offsets


def sender(endpoint: str, raw: bytes, spans: int, until: float, out) -> None:
    """Send the request with fresh trace ids until ``until`` (wall clock); put the counts on ``out``."""
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    stub = trace_service_pb2_grpc.TraceServiceStub(grpc.insecure_channel(endpoint))
    offsets, request = _trace_offsets(raw), bytearray(raw)
    sent = failed = 0
    while time.time() < until:
        for places in offsets:
            new = random.randbytes(16)
            for at in places:
                request[at:at + 16] = new
        try:
            stub.Export(trace_service_pb2.ExportTraceServiceRequest.FromString(bytes(request)), timeout=60)
            sent += spans
        except grpc.RpcError:
            failed += spans
    out.put({"sent": sent, "failed": failed})


def cpu_s(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def count(cluster: OpenSearchCluster) -> int:
    cluster.request(f"/{PREFIX}-jaeger-span-*/_refresh", method="POST", timeout=60.0)
    return cluster.request(f"/{PREFIX}-jaeger-span-*/_count", timeout=60.0)["count"]


def measure(args: argparse.Namespace, work: Path) -> dict[str, float]:
    binaries = stack_mod.ensure_binaries()
    raw, spans = rank_request(work)
    cluster = OpenSearchCluster(work / "opensearch", nodes=args.nodes, heap_mb=args.heap_mb, quick_jit=False)
    sup = stack_mod.Supervisor(work, startup_timeout=120)
    try:
        cluster.start()
        p = stack_mod.free_ports(6)
        lo = stack_mod.LOOPBACK
        env = jaeger_opensearch_env(clean_env(), otlp_grpc=f"{lo}:{p[0]}", otlp_http=f"{lo}:{p[1]}",
                                    query_http=f"{lo}:{p[2]}", query_grpc=f"{lo}:{p[3]}", health=f"{lo}:{p[4]}",
                                    metrics_port=p[5], urls=cluster.urls, password_file=work / "password",
                                    index_prefix=PREFIX, shards=args.shards, replicas=args.replicas, log_level="info")
        env["JAEGER_BULK_WORKERS"], env["JAEGER_BULK_MAX_ACTIONS"] = str(args.bulk_workers), str(args.bulk_actions)
        jaeger = services.jaeger(binaries.jaeger, work / "logs", env, config="jaeger-opensearch.yaml")
        jaeger.configs[work / "password"] = "unused\n"
        sup.add(jaeger)
        sup.start()
        pids = [n.proc.pid for n in cluster.nodes]
        cpu0 = (sum(cpu_s(pid) for pid in pids), cpu_s(jaeger.pid))
        begin = time.time()
        until = begin + args.duration
        queue: multiprocessing.Queue = multiprocessing.Queue()
        procs = [multiprocessing.Process(target=sender, args=(f"{lo}:{p[0]}", raw, spans, until, queue))
                 for _ in range(args.senders)]
        for proc in procs:
            proc.start()
        samples = []
        while time.time() < until:
            time.sleep(1.0)
            samples.append((time.time() - begin, count(cluster)))
        results = [queue.get(timeout=120) for _ in procs]
        for proc in procs:
            proc.join(timeout=30)
        sent = sum(r["sent"] for r in results)
        during = samples[-1][1] / samples[-1][0] if samples else 0.0
        last, still = -1, time.time()
        while time.time() - still < 5.0:  # drained: the count has not moved for 5 s
            now = count(cluster)
            if now != last:
                last, still = now, time.time()
            time.sleep(0.5)
        drained_s = still - begin
        cpu = (sum(cpu_s(pid) for pid in pids) - cpu0[0], cpu_s(jaeger.pid) - cpu0[1])
        flushed = cluster.index_stats(f"{PREFIX}-jaeger-span-*")
        cluster.request(f"/{PREFIX}-jaeger-span-*/_forcemerge?max_num_segments=1", method="POST", timeout=600.0)
        merged = cluster.index_stats(f"{PREFIX}-jaeger-span-*")
        docs = merged["docs"]
        return {
            "nodes": args.nodes, "shards": args.shards, "replicas": args.replicas, "heap_mb": args.heap_mb,
            "senders": args.senders, "load_s": args.duration, "sent": sent,
            "failed": sum(r["failed"] for r in results), "stored": docs,
            "indexed_per_s_during_load": round(during), "indexed_per_s_until_drained": round(docs / drained_s),
            "drained_s": round(drained_s, 1),
            "opensearch_cores_per_10k_spans_s": round(cpu[0] / max(docs, 1) * 10_000, 2),
            "jaeger_cores_per_10k_spans_s": round(cpu[1] / max(docs, 1) * 10_000, 2),
            "bytes_per_span_primary_flushed": round(flushed["primary_bytes"] / max(docs, 1)),
            "bytes_per_span_all_copies_flushed": round(flushed["total_bytes"] / max(docs, 1)),
            "bytes_per_span_primary_merged": round(merged["primary_bytes"] / max(docs, 1)),
            "bytes_per_span_all_copies_merged": round(merged["total_bytes"] / max(docs, 1)),
            "request_bytes_per_span": round(len(raw) / spans),
            "lucene_docs_per_span": round(merged["lucene_docs"] / max(docs, 1), 1),
            "segments_flushed": flushed["segments"], "segments_merged": merged["segments"],
            "opensearch_cpu_s": round(cpu[0], 1), "jaeger_cpu_s": round(cpu[1], 1),
        }
    finally:
        sup.stop()
        cluster.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of load")
    ap.add_argument("--senders", type=int, default=1)
    ap.add_argument("--heap-mb", type=int, default=512, help="each node's Java heap")
    ap.add_argument("--shards", type=int, default=6, help="primaries of the daily span index (shipped: 6)")
    ap.add_argument("--replicas", type=int, default=1, help="replicas of each (shipped: 1)")
    ap.add_argument("--bulk-workers", type=int, default=4, help="Jaeger's bulk writers (shipped: 4)")
    ap.add_argument("--bulk-actions", type=int, default=5000, help="spans a bulk request at most (shipped: 5000)")
    ap.add_argument("--work-dir", type=Path, default=None, help="keep everything here (default: a temporary dir)")
    args = ap.parse_args()
    if args.work_dir is not None:
        args.work_dir.mkdir(parents=True, exist_ok=True)
        result = measure(args, args.work_dir.resolve())
    else:
        with tempfile.TemporaryDirectory(prefix="measure-opensearch-") as tmp:
            result = measure(args, Path(tmp))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
