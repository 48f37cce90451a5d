"""Spans/s through 1 and through 2 tail-sampling gateways, and CPU per 10k spans/s, in one run.

For each gateway count, starts the topology of scripts/stack/otelstack/topology.py on loopback (Jaeger on
Badger, the gateways, 2 agents finding them by DNS) in a temporary directory, then
``--senders`` processes send OTLP/gRPC export requests to the agents as fast as the agents
take them, for ``--duration`` seconds. The requests are what an SDK's OTLP exporter sends:
``training.step`` spans with ``training.substep`` children (``--spans-per-trace`` spans a
trace), made by the OpenTelemetry SDK and encoded once with its OTLP encoder; each request gets
fresh random trace ids (patched into the encoded bytes), so every trace is new to the
gateways. Python SDK ranks cannot produce enough spans on a small machine to load a
collector (bench/bench_collector_load.py: about 3,700 spans/s per rank); this sender does.

Counted from each process's own telemetry and /proc: spans the agents accepted and
refused, spans the gateways accepted, spans Jaeger stored (once its count stops moving,
a decision window after the load), the CPU seconds of the agents, the gateways and
Jaeger while the load ran and the gateways drained, the gateways' peak resident memory,
and the disk Jaeger's Badger directory takes per span stored. "through gateways/s" is
the gateways' accepted spans over the load's wall time; "gateway cores per 10k spans/s"
is gateway CPU seconds per 10,000 spans accepted, i.e. the cores that rate keeps busy.
Gateways sample ``--sample`` % of normal traces and decide after ``--decision-wait``.

Everything (senders, agents, gateways, Jaeger) shares this machine's cores: on 2 cores
the senders and agents take most of it, so the 1-vs-2 ratio says what a second gateway
buys when CPU, not the gateway, is the limit; the per-span CPU figures carry over.

    .venv/bin/python bench/bench_gateways.py [--gateways 1,2] [--duration 15] [--senders 2]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts" / "stack"))
sys.path.insert(0, str(REPO / "bench"))

import otelstack as stack_mod  # noqa: E402  (scripts/stack/otelstack/)
from bench_collector_load import counter  # noqa: E402
from otelstack import topology as topology_mod  # noqa: E402  (scripts/stack/otelstack/topology.py)


def encoded_request(traces: int, spans_per_trace: int) -> tuple[bytes, list[list[int]]]:
    """One ExportTraceServiceRequest of ``traces`` step traces, and the byte offsets of each trace's ids."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "bench-gateways", "training.rank": 0,
                                                        "training.job.id": "bench-gateways"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("otel_training")
    for step in range(traces):
        with tracer.start_as_current_span("training.step", attributes={"training.step": step, "training.batch.size": 8}):
            for substep in range(spans_per_trace - 1):
                with tracer.start_as_current_span("training.substep", attributes={"training.substep": substep}):
                    pass
    spans = memory.get_finished_spans()
    raw = encode_spans(spans).SerializeToString()
    offsets: list[list[int]] = []
    for trace_id in sorted({s.context.trace_id for s in spans}):
        needle = b"\x0a\x10" + trace_id.to_bytes(16, "big")
        found, at = [], raw.find(needle)
        while at >= 0:
            found.append(at + 2)
            at = raw.find(needle, at + 1)
        offsets.append(found)
    return raw, offsets


def sender(endpoint: str, raw: bytes, offsets: list[list[int]], spans: int, until: float, out) -> None:
    """Send the request with fresh trace ids until ``until`` (wall clock); report counts."""
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    stub = trace_service_pb2_grpc.TraceServiceStub(grpc.insecure_channel(endpoint))
    request = bytearray(raw)
    sent = failed = 0
    while time.time() < until:
        for places in offsets:
            new = random.randbytes(16)
            for at in places:
                request[at:at + 16] = new
        message = trace_service_pb2.ExportTraceServiceRequest.FromString(bytes(request))
        try:
            stub.Export(message, timeout=10)
            sent += spans
        except grpc.RpcError:
            failed += spans
    out.put({"sent": sent, "failed": failed})


def cpu_s(pid: int | None) -> float:
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int | None) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def run(gateways: int, args: argparse.Namespace, raw: bytes, offsets: list[list[int]]) -> dict[str, float]:
    binaries = stack_mod.ensure_binaries()
    spans = sum(len(o) for o in offsets)
    with tempfile.TemporaryDirectory(prefix="bench-gateways-") as run_dir, \
            topology_mod.Topology(run_dir, binaries, gateways=gateways, sample_percent=args.sample,
                                  decision_wait=args.decision_wait, log_level="warn") as topo:
        members = {"agents": topo.agents, "gateways": topo.gateways, "jaeger": [topo.jaeger]}

        def cpu() -> dict[str, float]:
            return {group: sum(cpu_s(m.proc.pid) for m in ms) for group, ms in members.items()}

        def accepted(group: str) -> float:
            return sum(counter(m.telemetry_url, "otelcol_receiver_accepted_spans", receiver="otlp") for m in members[group])

        stored = lambda: counter(topo.jaeger.telemetry_url, "otelcol_exporter_sent_spans", exporter="jaeger_storage_exporter")  # noqa: E731
        before, began = cpu(), time.time()
        ctx = multiprocessing.get_context("fork")  # the parent has no gRPC channel
        out = ctx.Queue()
        procs = [ctx.Process(target=sender, args=(topo.agents[i % len(topo.agents)].otlp, raw, offsets, spans,
                                                  began + args.duration, out)) for i in range(args.senders)]
        for proc in procs:
            proc.start()
        results = [out.get(timeout=args.duration + 120) for _ in procs]
        for proc in procs:
            proc.join(timeout=30)
        load_s = time.time() - began
        sent = sum(r["sent"] for r in results)
        # Drained: the agents' queues (on disk) are empty and the gateways took everything.
        def queued() -> float:
            return sum(counter(a.telemetry_url, "otelcol_exporter_queue_size", exporter="load_balancing/traces")
                       for a in topo.agents)

        quiet = time.time()
        while time.time() - began < args.duration + 600:
            if queued() == 0:
                quiet = time.time()
                break
            time.sleep(0.2)
        wall_s = quiet - began
        used = {k: cpu()[k] - before[k] for k in before}
        through = accepted("gateways")
        # Kept traces reach Jaeger a decision window later: wait until its count stops moving.
        last, quiet = -1.0, time.time()
        while time.time() - quiet < 5 and time.time() - began < args.duration + 300:
            now = stored()
            if now != last:
                last, quiet = now, time.time()
            time.sleep(0.5)
        disk = subprocess.run(["du", "-s", "--block-size=1", str(Path(run_dir) / "jaeger-data")],
                              capture_output=True, text=True, check=True).stdout.split()[0]
        return {
            "gateways": gateways, "sent": sent, "offered_per_s": sent / load_s, "agent_accepted": accepted("agents"),
            "agent_refused": sum(counter(a.telemetry_url, "otelcol_receiver_refused_spans", receiver="otlp") for a in topo.agents),
            "gateway_accepted": through, "through_per_s": through / wall_s, "stored": last, "wall_s": wall_s,
            "badger_bytes_per_span": int(disk) / last if last else 0.0,
            "agent_cpu_s": used["agents"], "gateway_cpu_s": used["gateways"], "jaeger_cpu_s": used["jaeger"],
            "agent_cores_10k": used["agents"] / wall_s / (through / wall_s / 1e4) if through else 0.0,
            "gateway_cores_10k": used["gateways"] / wall_s / (through / wall_s / 1e4) if through else 0.0,
            "gateway_peak_rss_mib": max(peak_rss_mib(g.proc.pid) for g in topo.gateways),
        }


COLUMNS = [
    ("gateways", "gateways", "{:.0f}"), ("sent", "spans sent", "{:.0f}"), ("offered_per_s", "offered/s", "{:.0f}"),
    ("agent_refused", "agents refused", "{:.0f}"), ("gateway_accepted", "gateways accepted", "{:.0f}"),
    ("through_per_s", "through gateways/s", "{:.0f}"), ("stored", "stored by Jaeger", "{:.0f}"),
    ("wall_s", "wall s", "{:.1f}"), ("agent_cpu_s", "agents CPU s", "{:.1f}"), ("gateway_cpu_s", "gateways CPU s", "{:.1f}"),
    ("jaeger_cpu_s", "Jaeger CPU s", "{:.1f}"), ("agent_cores_10k", "agent cores per 10k spans/s", "{:.2f}"),
    ("gateway_cores_10k", "gateway cores per 10k spans/s", "{:.2f}"),
    ("gateway_peak_rss_mib", "gateway peak RSS MiB", "{:.0f}"),
    ("badger_bytes_per_span", "Badger bytes per stored span", "{:.0f}"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gateways", default="1,2", help="gateway counts, one run each (default: %(default)s)")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds of load per run (default: %(default)s)")
    parser.add_argument("--senders", type=int, default=2, help="sending processes (default: %(default)s)")
    parser.add_argument("--traces-per-request", type=int, default=100)
    parser.add_argument("--spans-per-trace", type=int, default=5)
    parser.add_argument("--sample", type=float, default=10.0, help="percent of normal traces kept (default: %(default)s)")
    parser.add_argument("--decision-wait", default="10s", help="gateways' decision window (default: %(default)s)")
    args = parser.parse_args()
    counts = [int(n) for n in args.gateways.split(",") if n.strip()]
    if not counts or min(counts) < 1 or args.duration <= 0 or args.senders < 1:
        parser.error("--gateways needs positive counts, --duration and --senders positive numbers")
    if topology_mod.unshare_argv() is None:
        print("needs unshare --mount (the agents' private /etc/hosts)", file=sys.stderr)
        return 2
    raw, offsets = encoded_request(args.traces_per_request, args.spans_per_trace)
    rows = [run(n, args, raw, offsets) for n in counts]
    cells = [[label for _, label, _ in COLUMNS]] + [[fmt.format(row[key]) for key, _, fmt in COLUMNS] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    for i, line in enumerate(cells):
        print("| " + " | ".join(c.rjust(w) for c, w in zip(line, widths)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|")
    if len(rows) > 1:
        base = rows[0]
        for row in rows[1:]:
            print(f"{row['gateways']} vs {base['gateways']} gateway(s): through/s x{row['through_per_s'] / base['through_per_s']:.2f}, "
                  f"gateway cores per 10k spans/s x{row['gateway_cores_10k'] / base['gateway_cores_10k']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
