"""A full span queue: the "wait" policy against the SDK's "drop", side by side in one run.

A tight ``trainer.step()`` loop (no work in the step: the fastest loop there is,
so the span queue fills whenever the exporter is slower than the loop) under
the default ``configure()``, once per exporter and policy, each in a fresh
process, rounds interleaved. Delivered is counted from the output: the steps
in the trace file, or the spans the real collector (the ocb build, started
here on a free loopback port with a ``debug`` exporter) says it accepted.

    .venv/bin/python bench/bench_span_queue.py [--steps 50000] [--rounds 3] [--exporters file,otlp]
    .venv/bin/python bench/bench_span_queue.py --rate 10000 --seconds 60 --rounds 1   # sustained, paced
    .venv/bin/python bench/bench_span_queue.py --modes wait,offload --rate 10000 --seconds 60 --rounds 1

prints, per exporter and policy, the median over rounds of steps/s, process
CPU per step (export included) and the share of spans delivered. With
``--rate`` the loop is paced to that many steps a second (a busy wait between
steps, so its CPU figure means nothing) for ``--seconds``: whether the pipeline
sustains that rate, and loses nothing while it does. ``--modes`` picks the cases:
the queue policies ``wait`` and ``drop``, and ``offload`` (``offload=True``: the
drain process exports; the CPU figure is then the training process's alone).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts" / "stack"))

import otelstack as stack_mod  # noqa: E402  (scripts/stack/otelstack/)

_LOOP = """
import json, sys, time
import otel_training
steps, rate = int(sys.argv[1]), float(sys.argv[2])
telemetry = otel_training.configure(signal_hooks=False, exception_hooks=False)
trainer = otel_training.TrainerProcess()
wall, cpu = time.perf_counter(), time.process_time()
with trainer.epoch(epoch=0):
    for step in range(steps):
        if rate:
            due = wall + step / rate
            while time.perf_counter() < due:
                pass
        with trainer.step(global_step=step, batch_size=32):
            pass
result = telemetry.shutdown(timeout_s=60)
print(json.dumps({"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu,
                  "exported": result.exported, "dropped": result.dropped}))
"""

_COLLECTOR = """
receivers:
  otlp:
    protocols:
      grpc: {{endpoint: "127.0.0.1:{grpc}"}}
exporters:
  debug: {{verbosity: basic}}
service:
  telemetry:
    metrics:
      readers:
        - pull: {{exporter: {{prometheus: {{host: 127.0.0.1, port: {metrics}}}}}}}
  pipelines:
    traces: {{receivers: [otlp], exporters: [debug]}}
    metrics: {{receivers: [otlp], exporters: [debug]}}
"""


def _accepted(metrics_url: str) -> float:
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        text = response.read().decode()
    return sum(float(value) for value in
               re.findall(r"^otelcol_receiver_accepted_spans(?:_total)?\{[^}]*\} (\S+)", text, re.M))


def _run(steps: int, rate: float, environ: dict[str, str]) -> dict[str, float]:
    output = subprocess.run([sys.executable, "-c", _LOOP, str(steps), str(rate)], env={**os.environ, **environ},
                            capture_output=True, text=True, check=True, timeout=900).stdout
    return json.loads(output.strip().splitlines()[-1])


def _file_steps(directory: Path) -> int:
    count = 0
    for path in directory.glob("traces-*.jsonl"):
        for line in path.read_text().splitlines():
            for resource in json.loads(line).get("resourceSpans", ()):
                for scope in resource.get("scopeSpans", ()):
                    count += sum(span["name"] == "training.step" for span in scope.get("spans", ()))
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--exporters", default="file,otlp")
    parser.add_argument("--modes", default="wait,drop", help="wait, drop, offload (default: %(default)s)")
    parser.add_argument("--rate", type=float, default=0.0, help="pace the loop to this many steps a second")
    parser.add_argument("--seconds", type=float, default=60.0, help="with --rate: how long (default: %(default)s)")
    args = parser.parse_args()
    if args.rate:
        args.steps = int(args.rate * args.seconds)
    exporters = args.exporters.split(",")
    work = Path(tempfile.mkdtemp(prefix="bench-span-queue-"))
    collector = None
    if "otlp" in exporters:
        grpc, metrics = stack_mod.free_ports(2)
        config = work / "collector.yaml"
        config.write_text(_COLLECTOR.format(grpc=grpc, metrics=metrics))
        binary = str(stack_mod.ensure_binaries().otelcol)
        collector = subprocess.Popen([binary, "--config", str(config)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        metrics_url = f"http://127.0.0.1:{metrics}/metrics"
        stack_mod.wait_until(lambda: stack_mod.http_get(metrics_url)[0] == 200, timeout=60, what="the collector")
    results: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    try:
        for round_index in range(args.rounds):
            cases = [(exporter, mode) for exporter in exporters for mode in args.modes.split(",")]
            shift = round_index % len(cases)
            for exporter, policy in cases[shift:] + cases[:shift]:
                environ = {"OTEL_TRAINING_EXPORTER": exporter}
                if policy == "offload":
                    environ["OTEL_TRAINING_OFFLOAD"] = "true"
                else:  # the in-process span queue's policies (offload is the default wherever it runs)
                    environ["OTEL_TRAINING_SPAN_QUEUE_POLICY"] = policy
                    environ["OTEL_TRAINING_OFFLOAD"] = "false"
                if exporter == "file":
                    out = Path(tempfile.mkdtemp(dir=work))
                    run = _run(args.steps, args.rate, {**environ, "OTEL_TRAINING_OUTPUT_DIR": str(out)})
                    delivered = _file_steps(out) / args.steps
                else:
                    before = _accepted(metrics_url)
                    run = _run(args.steps, args.rate, {**environ, "OTEL_EXPORTER_OTLP_INSECURE": "true",
                                                       "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{grpc}"})
                    time.sleep(1)  # the collector's own metrics lag its receiver by a scrape
                    delivered = (_accepted(metrics_url) - before) / (run["exported"] + run["dropped"])
                results.setdefault((exporter, policy), []).append(
                    (args.steps / run["wall"], run["cpu"] / args.steps * 1e6, delivered))
    finally:
        if collector is not None:
            collector.terminate()
            collector.wait(30)
    paced = f", paced to {args.rate:.0f} steps/s" if args.rate else ""
    print(f"{args.steps} steps a run{paced}, median of {args.rounds} rounds (fresh process each)")
    for (exporter, policy), rows in results.items():
        rate, cpu, delivered = (statistics.median(column) for column in zip(*rows))
        print(f"  {exporter:5s} {policy:5s}: {rate:8.0f} steps/s  {cpu:6.1f} µs CPU/step  delivered {delivered:7.2%} "
              f"(min {min(row[2] for row in rows):.2%})")


if __name__ == "__main__":
    main()
