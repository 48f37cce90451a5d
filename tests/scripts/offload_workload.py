"""A small training run that uses every part of the span API, to compare offloaded and in-process output.

    python offload_workload.py OUTPUT_DIR (inprocess | offload | offload-ready) [then-exit]

Steps with substeps and a data wait; a trace that outgrows its budget (segments, links); the user's
own spans through the global provider with an event, an exception, a status, a new name, a remote
parent and a link; a failed Duration; a checkpoint. ``then-exit`` leaves with ``os._exit`` before
any shutdown (a process killed), after printing the spans ended so far. ``offload-ready`` waits until the
drain reads the C core's fast records before the workload (none are written until it does), and prints
``fast`` when it does, ``marshal`` when this process runs the pure-Python fallback.
"""

from __future__ import annotations

import os
import sys

from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

import otel_training

directory, mode = sys.argv[1], sys.argv[2]
telemetry = otel_training.configure(exporter="file", output_dir=directory, offload=mode.startswith("offload"),
                                    trace_max_spans=25, signal_hooks=False, stuck_threshold_s=30)
if mode == "offload-ready":
    import time

    from otel_training._ring import CAP_FAST_RECORDS, DRAIN_FIELDS

    ring = telemetry._ring
    deadline = time.monotonic() + 60
    while ring.native and not ring.get(DRAIN_FIELDS["caps"]) & CAP_FAST_RECORDS and time.monotonic() < deadline:
        time.sleep(0.01)
    print("fast" if ring.get(DRAIN_FIELDS["caps"]) & CAP_FAST_RECORDS else "marshal", flush=True)
trainer = otel_training.TrainerProcess()
with trainer.train():
    with trainer.epoch(epoch=0):
        for step in range(40):
            with trainer.step(global_step=step, batch_size=8, tokens=512) as current:
                with trainer.substep(substep=0, loss=0.5):
                    pass
                current.extra_args(learning_rate=0.001)
    with trainer.save(path="/ckpt/40", step=40):
        pass
tracer = trace.get_tracer("user.code", "1.2", schema_url="https://example.com/schema")
remote = SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
with tracer.start_as_current_span("user.request", context=trace.set_span_in_context(NonRecordingSpan(remote)),
                                  kind=SpanKind.SERVER, attributes={"http.route": "/x", "sizes": [1, 2, 3]},
                                  links=[Link(remote, {"why": "caller"})]) as span:
    span.add_event("received", {"bytes": 10})
    span.update_name("user.request.renamed")
    with tracer.start_as_current_span("user.child") as child:
        child.set_status(Status(StatusCode.OK))
    try:
        with tracer.start_as_current_span("user.fails"):
            raise ValueError("bad batch")
    except ValueError:
        pass
failing = trainer.evaluate()
failing.fail(RuntimeError("evaluation diverged"))
if sys.argv[3:] == ["then-exit"]:
    telemetry.force_flush(timeout_s=30) if mode == "offload-flush" else None
    print("ended", flush=True)
    os._exit(0)
telemetry.shutdown(timeout_s=30)
