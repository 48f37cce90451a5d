"""A forked child (a DataLoader worker) neither inherits the parent's watcher nor alerts for its spans.

Prints ``child <exit code> parent <alerts>``: the child exits 0 when it raised no duplicate of the
parent's alert and alerted once, for its own stuck span.
"""

import os
import time

from opentelemetry.sdk.trace import TracerProvider

from otel_training import StuckOptions, StuckSpanProcessor


def wait_for_event(events: list, timeout_s: float = 5) -> None:
    deadline = time.monotonic() + timeout_s
    while not events and time.monotonic() < deadline:
        time.sleep(0.01)


events = []
processor = StuckSpanProcessor(0.3, options=StuckOptions(first_threshold_s=0.3, escalation_s=60,
                                                          on_stuck=lambda e: events.append(e)))
provider = TracerProvider()
provider.add_span_processor(processor)
tracer = provider.get_tracer("t")
step = tracer.start_span("training.step")  # open and soon stuck in the parent
pid = os.fork()
if pid == 0:  # a DataLoader worker
    assert processor.open_count == 0 and processor._thread is None
    time.sleep(0.6)  # past the parent's threshold
    duplicates = len(events)
    child_step = tracer.start_span("training.step")  # the child watches its own spans
    wait_for_event(events)
    child_step.end()
    os._exit(0 if duplicates == 0 and len(events) == 1
             and events[0].span_context.span_id == child_step.get_span_context().span_id else 3)
_, status = os.waitpid(pid, 0)
wait_for_event(events)
step.end()
print("child", os.waitstatus_to_exitcode(status), "parent", len(events))
