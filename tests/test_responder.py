"""The drain asks the training process for its stacks or its exit (``pipeline/responder.py``): answered,
bounded, and free while nothing is asked."""

from __future__ import annotations

import marshal
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_until

import otel_training
from otel_training.pipeline.records import STACKS
from otel_training.pipeline.responder import Requests, Responder


def _answering_pair() -> tuple[Requests, Responder, list[bytes]]:
    """A responder in this process, its answers handed straight back to the requests (as the drain's reader
    would), and every record it wrote."""
    asked, ask = os.pipe()
    requests = Requests(ask, os.getpid(), exit_wait_s=1, wait_s=30)
    written: list[bytes] = []

    def write(payload: bytes, begin: bool | None, deadline: float) -> bool:
        written.append(payload)
        record = marshal.loads(payload)
        requests.deliver(record[1], record[2], record[3])
        return True

    return requests, Responder(asked, write, exit_process=lambda code: None), written


def test_the_responder_answers_with_every_threads_stack_the_stuck_one_first() -> None:
    requests, responder, written = _answering_pair()
    stuck = threading.Event()
    release = threading.Event()

    def stuck_in_the_step() -> None:
        stuck.set()
        release.wait(30)

    worker = threading.Thread(target=stuck_in_the_step, name="trainer")
    worker.start()
    stuck.wait(30)
    from otel_training.processors import alert_context

    def the_collective() -> dict[str, object]:
        return {"training.collective.pending": True, "training.collective.op": "allreduce"}

    alert_context.add(the_collective)  # what the torch instrumentor registers in a training process
    try:
        stacks, source, missing, context = requests.stacks(worker.ident)
    finally:
        alert_context.remove(the_collective)
    release.set()
    # The alert context goes across with the stacks: the drain's detector has no collective tracker of its own.
    assert context == {"training.collective.pending": True, "training.collective.op": "allreduce"}
    worker.join()
    assert missing is None and source is None and stacks is not None  # the process's own Python took them
    assert stacks.startswith(f"Thread trainer ({worker.ident}) (the stuck span's thread)")
    assert "stuck_in_the_step" in stacks and "otel-training-responder" not in stacks  # not the responder's own
    assert [marshal.loads(payload)[0] for payload in written] == [STACKS]
    requests.close()
    responder.thread.join(10)
    assert not responder.thread.is_alive()  # the drain's end closed: the responder ends


def test_a_process_that_does_not_answer_leaves_the_alert_on_time_and_says_why() -> None:
    asked, ask = os.pipe()  # nobody reads ``asked``: a process frozen with the GIL held
    requests = Requests(ask, os.getpid(), exit_wait_s=1, wait_s=0.05)
    started = time.monotonic()
    stacks, source, missing, context = requests.stacks(1234)
    assert stacks is None and source is None and missing is not None and context is None
    assert "did not send its stacks within 50 ms" in missing
    assert time.monotonic() - started < 5  # bounded (the wait is 50 ms; the margin is for a loaded machine)
    requests.deliver(1, "too late")  # an answer after its request gave up is dropped
    os.close(asked)
    stacks, source, missing, _ = requests.stacks(1234)
    assert stacks is None and "could not be asked" in (missing or "")  # the training process is gone
    requests.close()


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs /proc to count a thread's wake-ups")
def test_no_thread_of_ours_in_an_offloaded_training_process_wakes_during_healthy_steps(configure: Any) -> None:
    before = set(threading.enumerate())  # threads earlier tests left behind are not this pipeline's
    telemetry = configure(exporter="file", offload=True, stuck_threshold_s=30)
    assert telemetry.drain_ready(timeout_s=30)
    trainer = otel_training.TrainerProcess()
    ours = [thread for thread in threading.enumerate() if thread not in before]
    assert "otel-training-responder" in {thread.name for thread in ours}

    def switches() -> dict[str, int]:
        counts = {}
        for thread in ours:
            status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
            counts[thread.name] = sum(int(line.split()[1]) for line in status.splitlines()
                                      if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")))
        return counts

    with trainer.step(global_step=0):
        pass
    before = switches()
    for step in range(1, 200):
        with trainer.step(global_step=step):
            time.sleep(0.002)  # the step's work: the GIL is free for any thread that wanted it
    after = switches()
    assert {name: after[name] - before[name] for name in before} == dict.fromkeys(before, 0)
    assert wait_until(lambda: telemetry.force_flush(timeout_s=30).exported >= 200, timeout_s=60)
