#!/usr/bin/env python3
"""One simulated training rank for the agent/gateway topology (tests/e2e/test_topology.py,
bench/bench_gateways.py): the real package, exporting OTLP to an agent.

``otel_training.configure()`` reads everything from the environment
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_TRAINING_RANK``, ``OTEL_TRAINING_TRACE_MAX_SPANS``,
``OTEL_TRAINING_STUCK_THRESHOLD_S``, ...). The loop is ``TrainerProcess``: train > epoch >
step > substeps. Injected on given steps:

* ``--fail-steps``: the step raises (status ERROR), the loop catches it and goes on;
* ``--stuck-steps``: the step sleeps ``--stuck-s`` (past the stuck threshold: a real
  stuck alert, then a recovered one).

``--file-dir`` also writes every span the rank ends to ``DIR/traces-r<rank>.jsonl`` with the
package's file exporter, as ``OTEL_TRAINING_EXPORTER=file`` would: the file report of the very
spans the rank exported (tests/e2e/test_opensearch_topology.py compares it with the report read
back from Jaeger).

``--result`` gets, as JSON: the ``FlushResult`` of the bounded shutdown, the number of
spans ended per trace id (what Jaeger must hold for a trace to be whole), the trace id
and start time of every injected step, and the wall time at which each step ended.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from collections import Counter
from pathlib import Path


def _steps(text: str) -> set[int]:
    return {int(part) for part in text.split(",") if part.strip()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rate", type=float, default=20.0, help="steps per second (0: as fast as possible)")
    parser.add_argument("--substeps", type=int, default=2)
    parser.add_argument("--fail-steps", type=_steps, default=set())
    parser.add_argument("--stuck-steps", type=_steps, default=set())
    parser.add_argument("--stuck-s", type=float, default=1.0)
    parser.add_argument("--start-at", type=float, default=0.0, help="wall-clock time to start at (ranks in step)")
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--shutdown-timeout", type=float, default=30.0)
    parser.add_argument("--file-dir", type=Path, default=None, help="also write the spans to DIR/traces-r<rank>.jsonl")
    args = parser.parse_args()

    from opentelemetry import trace
    from opentelemetry.sdk.trace import SpanProcessor

    import otel_training

    per_trace: Counter[str] = Counter()

    class _PerTrace(SpanProcessor):
        def on_end(self, span) -> None:
            per_trace[f"{span.context.trace_id:032x}"] += 1

    # In-process: it counts its spans per trace with a processor of its own (offloaded, the drain's pipeline
    # would have them; docs/offload.md).
    telemetry = otel_training.configure(metrics=False, goodput=False, offload=False)
    telemetry.add_span_processor(_PerTrace())
    if args.file_dir is not None:
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor

        from otel_training.exporters.otlp_json import OtlpJsonFileSpanExporter

        rank = os.environ.get("OTEL_TRAINING_RANK", "0")
        telemetry.add_span_processor(SimpleSpanProcessor(OtlpJsonFileSpanExporter(args.file_dir / f"traces-r{rank}.jsonl")))
    trainer = otel_training.TrainerProcess()
    injected: list[dict] = []
    step_ends: list[float] = []
    pause = time.time() - args.start_at
    if pause < 0:
        time.sleep(-pause)
    begin = time.perf_counter()
    with trainer.train():
        with trainer.epoch(epoch=0):
            for step in range(args.steps):
                kind = "failed" if step in args.fail_steps else "stuck" if step in args.stuck_steps else None
                try:
                    with trainer.step(global_step=step, batch_size=8):
                        if kind is not None:
                            context = trace.get_current_span().get_span_context()
                            injected.append({"kind": kind, "step": step, "trace_id": f"{context.trace_id:032x}",
                                             "start": time.time()})
                        for substep in range(args.substeps):
                            with trainer.substep(substep=substep):
                                pass
                        if kind == "stuck":
                            time.sleep(args.stuck_s)
                        elif kind == "failed":
                            raise RuntimeError(f"injected failure in step {step}")
                except RuntimeError:
                    pass
                step_ends.append(round(time.time(), 3))
                if args.rate:
                    wait = begin + (step + 1) / args.rate - time.perf_counter()
                    if wait > 0:
                        time.sleep(wait)
    result = telemetry.shutdown(timeout_s=args.shutdown_timeout)
    args.result.write_text(json.dumps({
        **dataclasses.asdict(result), "spans_ended": sum(per_trace.values()), "traces": dict(per_trace),
        "injected": injected, "step_ends": step_ends,
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
