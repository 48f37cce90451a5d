"""The drain process's start: ``python -m otel_training.assembly.drain <ring fd>``.

``OffloadTelemetry`` (``pipeline/offload.py``) starts it with the ring's file descriptor and says hello over
its stdin (the pipeline's options, the resource, the training process's pid and, where it can be asked, the
pipe of requests). This module is the assembly of the drain's side: a ``DrainTelemetry`` with the training
process's resource, the plugins the options turn on fed by that process (``plugins.py``), the ``Replayer``
that turns records into SDK spans (``pipeline/drain.py``, which says what the drain is and why it ignores
the job's signals), and the loop that reads the ring until the training process closes it or is gone.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
import time
from typing import Any

from opentelemetry.sdk.resources import Resource

from otel_training._contain import log_once
from otel_training._native_loader import native
from otel_training._ring import CAP_FAST_RECORDS, DRAIN_FIELDS, Ring
from otel_training.assembly.plugins import install_plugins
from otel_training.pipeline.drain import (
    IGNORED_SIGNALS,
    POLL_S,
    PUBLISH_S,
    DrainTelemetry,
    RecordedIds,
    Replayer,
    publish,
    report_death,
)
from otel_training.pipeline.responder import Requests
from otel_training.watchdog.monitor import py_spy_stacks

logger = logging.getLogger("otel_training")


def run(ring: Ring, hello: dict[str, Any]) -> int:
    """Drain until the close record or the training process's end; returns the exit status."""
    ids = RecordedIds()
    telemetry = DrainTelemetry(hello["options"], resource=Resource(hello["resource"], hello.get("schema_url")),
                               tracing={"sampler": ids, "id_generator": ids})
    watchdog = bool(hello.get("watchdog"))  # the sidecar's work is this drain's (responder.py)
    requests = (Requests(hello["requests_fd"], hello["pid"], telemetry.options["exit_timeout_s"] + 1.0,
                         py_spy=py_spy_stacks if watchdog else None) if hello.get("requests_fd") is not None else None)
    on_end = install_plugins(telemetry, requests, spans_of_this_process=False, device_uuids=hello.get("device_uuids"),
                             ask_device_uuid=requests.device_uuid if requests is not None else None)
    extension = native(hello["options"]["native"])
    replayer = Replayer(telemetry, ids, extension.decode if extension is not None else None,
                        requests.deliver if requests is not None else lambda request_id, stacks, context: None)
    replayer.on_end = replayer.device_steps.on_end = on_end
    if extension is not None:  # from now on the training process may write fast records
        ring.put(DRAIN_FIELDS["caps"], CAP_FAST_RECORDS)
    ring.put(DRAIN_FIELDS["pid"], os.getpid())  # last: a drain whose pid is published has said what it reads
    parent = hello["pid"]
    published = 0.0
    while not replayer.closed:
        records = ring.read()
        replayer.apply_all(records)
        now_ns = time.time_ns()
        replayer.device_steps.tick(now_ns)
        replayer.host_gaps.tick(now_ns)
        telemetry.values_tick()
        if ring.corrupt:
            log_once("ring-corrupt", "otel_training: the offload ring held bytes that were not records (damaged "
                     "shared memory); they were skipped and the spans in them are lost")
        now = time.monotonic()
        if now - published >= PUBLISH_S or replayer.flush_token > ring.get(DRAIN_FIELDS["flushed"]):
            publish(ring, telemetry, replayer)
            published = now
        if not records:
            if os.getppid() != parent:  # the training process is gone: export what it wrote
                replayer.closing()
                replayer.apply_all(ring.read(1 << 62))
                break
            time.sleep(POLL_S)
    replayer.host_gaps.abandon(time.time_ns())
    replayer.device_steps.abandon("the device work of this step had not completed when the training process "
                                  "closed its pipeline" if replayer.closed else "the training process ended")
    if replayer.open and not replayer.closed:  # killed (SIGKILL, the OOM killer): what it began survives here
        report_death(telemetry, replayer.open, parent, alert=watchdog)
    lost = len(replayer.open)
    if lost and not replayer.closed:
        logger.warning("otel_training: the training process ended with %d span(s) open; they are not exported", lost)
    if requests is not None:
        requests.close()  # the training process's responder sees the end of the pipe and stops
    deadline = replayer.closing()
    telemetry.shutdown(timeout_s=max(0.1, deadline - time.monotonic()))
    publish(ring, telemetry, replayer, lost if not replayer.closed else 0)
    ring.put(DRAIN_FIELDS["done"], 1)
    return 0



def main(argv: list[str]) -> int:
    logging.basicConfig(format="%(message)s")
    for signum in IGNORED_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, IGNORED_SIGNALS)  # blocked since the fork: now ignored
    hello = pickle.load(sys.stdin.buffer)  # from the training process, over the pipe it made: trusted
    ring = Ring.attach(int(argv[1]), hello["options"]["native"])
    try:
        return run(ring, hello)
    finally:
        ring.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
