"""Load through the real collector: many simulated ranks, spans/s delivered and dropped.

Starts the native stack (scripts/stack/otelstack/: the collector built by ocb,
Jaeger v2, Prometheus, Alertmanager, all on free loopback ports) in a
temporary directory, then for each rank count in ``--ranks`` forks that many
processes. Each is one simulated rank: ``otel_training.configure(exporter="otlp")``
with its own ``training.rank`` in the resource, the SDK's BatchSpanProcessor
with its default settings (queue 2048, batches of 512, 5 s delay) and the
OTLP/gRPC exporter, and a ``TrainerProcess`` loop emitting ``training.step``
spans with ``--substeps`` ``training.substep`` children for ``--duration``
seconds (as fast as it can, or ``--rate`` steps/s). Each rank ends with the
bounded ``Telemetry.shutdown``, whose ``FlushResult`` says how many spans it
delivered and dropped.

Counted at the collector, from its own telemetry (the ``:8888``-style
endpoint): spans accepted, refused and failed by the OTLP receiver, and sent
to Jaeger, failed or not enqueued by the Jaeger exporter; and at Jaeger, from
its own telemetry, spans written to its storage. "delivered/s" is the spans
Jaeger stored, divided by the wall time from the start of the load to the
last span stored ("drain s" of it after the ranks stopped emitting: the
batch processors' final flush and the collector's queues).

Bounded: every rank stops emitting after ``--duration``; its shutdown after
``--drain-timeout``; a rank still alive after that is killed; the stack is
stopped at the end whatever happens. Loopback only.

    .venv/bin/python bench/bench_collector_load.py [--ranks 4,16,64] [--duration 10] [--rate 0] [--substeps 2]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts" / "stack"))

import otelstack as stack_mod  # noqa: E402  (scripts/stack/otelstack/)

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def counter(url: str, name: str, **labels: str) -> float:
    """Sum of the samples of counter ``name`` (with or without ``_total``) whose labels include ``labels``."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    total = 0.0
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1) in (name, name + "_total") and all(w in (match.group(2) or "") for w in wanted):
            total += float(match.group(3))
    return total


class Counts:
    """The collector's and Jaeger's span counters at one moment."""

    FIELDS = ("accepted", "refused", "failed", "sent", "send_failed", "enqueue_failed", "stored", "collector_cpu_s", "jaeger_cpu_s")

    def __init__(self, stack: stack_mod.Stack) -> None:
        collector = stack.collector_telemetry_url
        jaeger = f"http://{stack_mod.LOOPBACK}:{stack.ports.jaeger_metrics}/metrics"
        receiver = {"receiver": "otlp"}
        to_jaeger = {"exporter": "otlp_grpc/jaeger"}
        self.accepted = counter(collector, "otelcol_receiver_accepted_spans", **receiver)
        self.refused = counter(collector, "otelcol_receiver_refused_spans", **receiver)
        self.failed = counter(collector, "otelcol_receiver_failed_spans", **receiver)
        self.sent = counter(collector, "otelcol_exporter_sent_spans", **to_jaeger)
        self.send_failed = counter(collector, "otelcol_exporter_send_failed_spans", **to_jaeger)
        self.enqueue_failed = counter(collector, "otelcol_exporter_enqueue_failed_spans", **to_jaeger)
        self.stored = counter(jaeger, "otelcol_exporter_sent_spans", exporter="jaeger_storage_exporter")
        self.collector_cpu_s = counter(collector, "otelcol_process_cpu_seconds")
        self.jaeger_cpu_s = counter(jaeger, "otelcol_process_cpu_seconds")

    def minus(self, before: Counts) -> dict[str, float]:
        return {f: getattr(self, f) - getattr(before, f) for f in self.FIELDS}


def rank_main(rank: int, world: int, job_id: str, args: argparse.Namespace, ready, results) -> None:
    """One simulated rank (a forked process)."""
    import logging

    import otel_training

    # Drops are counted in the table; not one SDK warning per full queue and rank.
    for name in ("opentelemetry", "otel_training"):
        logging.getLogger(name).setLevel(logging.ERROR)

    telemetry = otel_training.configure(
        exporter="otlp", rank=rank, world_size=world, job_id=job_id, service_name="bench-collector-load",
        metrics=False, goodput=False, exception_hooks=False, signal_hooks=False, offload=False,
    )
    trainer = otel_training.TrainerProcess()
    ready.wait(timeout=120)  # every rank set up: start together
    begin = time.perf_counter()
    deadline = begin + args.duration
    interval = 1.0 / args.rate if args.rate else 0.0
    step = 0
    with trainer.train():
        with trainer.epoch(epoch=0):
            while time.perf_counter() < deadline:
                with trainer.step(global_step=step, batch_size=8):
                    for substep in range(args.substeps):
                        with trainer.substep(substep=substep):
                            pass
                step += 1
                if interval:
                    pause = begin + step * interval - time.perf_counter()
                    if pause > 0:
                        time.sleep(pause)
    emit_s = time.perf_counter() - begin
    result = telemetry.shutdown(timeout_s=args.drain_timeout)
    results.put({"rank": rank, "steps": step, "emit_s": emit_s, "exported": result.exported,
                 "dropped": result.dropped, "completed": result.completed})


def wait_drained(stack: stack_mod.Stack, quiet_s: float, timeout: float) -> tuple[Counts, float]:
    """Poll until the collector has sent everything it accepted to Jaeger and
    Jaeger stored it, or nothing moved for ``quiet_s``; returns the counts and
    when the last span was stored."""
    last = Counts(stack)
    last_change = time.monotonic()
    deadline = last_change + timeout
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = Counts(stack)
        if now.stored != last.stored or now.sent != last.sent:
            last_change = time.monotonic()
        last = now
        settled = now.sent + now.send_failed + now.enqueue_failed >= now.accepted and now.stored >= now.sent
        if settled or time.monotonic() - last_change > quiet_s:
            break
    return last, last_change


def run_load(stack: stack_mod.Stack, ranks: int, args: argparse.Namespace) -> dict[str, float]:
    ctx = multiprocessing.get_context("fork")  # the parent has no threads and no gRPC channel
    ready, results = ctx.Barrier(ranks + 1), ctx.Queue()
    job_id = f"bench-load-{ranks}-{os.getpid()}"
    procs = [ctx.Process(target=rank_main, args=(r, ranks, job_id, args, ready, results), daemon=True) for r in range(ranks)]
    for proc in procs:
        proc.start()
    before = Counts(stack)
    ready.wait(timeout=120)
    began = time.monotonic()
    rows, deadline = [], began + args.duration + args.drain_timeout + 60
    try:
        while len(rows) < ranks and time.monotonic() < deadline:
            try:
                rows.append(results.get(timeout=max(0.1, deadline - time.monotonic())))
            except Exception:  # noqa: BLE001 - queue.Empty: the deadline check decides
                pass
    finally:
        for proc in procs:
            proc.join(timeout=max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
    after, last_stored = wait_drained(stack, quiet_s=3.0, timeout=args.drain_timeout)
    delta = after.minus(before)
    created = sum(r["exported"] + r["dropped"] for r in rows)
    emit_s = max((r["emit_s"] for r in rows), default=args.duration)
    wall_s = max(last_stored - began, emit_s)
    return {
        "ranks": ranks, "reported": len(rows), "steps": sum(r["steps"] for r in rows), "created": created,
        "offered_per_s": created / emit_s,
        "sdk_exported": sum(r["exported"] for r in rows), "sdk_dropped": sum(r["dropped"] for r in rows),
        **delta,
        "collector_dropped": delta["refused"] + delta["failed"] + delta["send_failed"] + delta["enqueue_failed"],
        "delivered_per_s": delta["stored"] / wall_s, "wall_s": wall_s, "drain_s": max(0.0, wall_s - emit_s),
        "per_collector_cpu_s": delta["accepted"] / delta["collector_cpu_s"] if delta["collector_cpu_s"] else 0.0,
    }


COLUMNS = [
    ("ranks", "ranks", "{:d}"),
    ("created", "spans created", "{:d}"),
    ("offered_per_s", "offered/s", "{:.0f}"),
    ("sdk_dropped", "SDK dropped", "{:d}"),
    ("accepted", "collector accepted", "{:d}"),
    ("collector_dropped", "collector dropped", "{:d}"),
    ("sent", "sent to Jaeger", "{:d}"),
    ("stored", "stored by Jaeger", "{:d}"),
    ("wall_s", "wall s", "{:.1f}"),
    ("drain_s", "drain s", "{:.1f}"),
    ("delivered_per_s", "delivered/s", "{:.0f}"),
    ("collector_cpu_s", "collector CPU s", "{:.1f}"),
    ("per_collector_cpu_s", "spans/collector CPU s", "{:.0f}"),
    ("jaeger_cpu_s", "Jaeger CPU s", "{:.1f}"),
]


def print_table(rows: list[dict[str, float]]) -> None:
    cells = [[label for _, label, _ in COLUMNS]]
    cells += [[fmt.format(int(row[key]) if fmt == "{:d}" else row[key]) for key, _, fmt in COLUMNS] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    for i, line in enumerate(cells):
        print("| " + " | ".join(c.rjust(w) for c, w in zip(line, widths)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="4,16,64", help="comma-separated rank counts, one load run each (default: %(default)s)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds each rank emits (default: %(default)s)")
    parser.add_argument("--rate", type=float, default=0.0, help="steps/s per rank; 0 = as fast as it can (default)")
    parser.add_argument("--substeps", type=int, default=2, help="training.substep spans per step (default: %(default)s)")
    parser.add_argument("--drain-timeout", type=float, default=30.0, help="bound on each rank's final flush and on the collector's drain")
    args = parser.parse_args()
    counts = [int(n) for n in args.ranks.split(",") if n.strip()]
    if any(n < 1 for n in counts) or not counts or args.duration <= 0:
        parser.error("--ranks needs positive counts and --duration a positive number")
    missing = stack_mod.missing_prerequisites()
    if missing:
        print("cannot start the stack, missing:\n  " + "\n  ".join(missing), file=sys.stderr)
        return 2

    for key in [k for k in os.environ if k.startswith("OTEL_")]:
        del os.environ[key]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-collector-load-") as run_dir:
        stack = stack_mod.Stack(run_dir, fast=True)
        print(f"starting the native stack in {run_dir} ...", flush=True)
        with stack:
            os.environ.update(stack.client_env())
            print(f"collector {stack.otlp_grpc_endpoint}, Jaeger {stack.jaeger_url}; "
                  f"{args.duration:g} s per run, rate {'max' if not args.rate else f'{args.rate:g} steps/s'} per rank, "
                  f"{args.substeps} substeps per step; {os.cpu_count()} CPUs", flush=True)
            for ranks in counts:
                row = run_load(stack, ranks, args)
                rows.append(row)
                print(f"  {ranks} ranks: {row['steps']} steps, {row['created']} spans, {row['stored']:.0f} stored by Jaeger, "
                      f"{row['created'] - row['stored']:.0f} not (SDK dropped {row['sdk_dropped']}, "
                      f"collector dropped {row['collector_dropped']:.0f})"
                      + ("" if row["reported"] == ranks else f"; only {row['reported']} ranks reported"), flush=True)
    print()
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
