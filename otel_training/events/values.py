"""Device values logged in a step, read once the device has computed them, never by the training thread waiting.

Why: ``trainer.log(loss=loss)`` with the usual CUDA loss cannot be read when it is logged (reading it would
make the training thread wait for the device), and a description (``<Tensor shape=() ... device=cuda:0>``) is
not the loss. Here a one-element device tensor is copied to host memory with a non-blocking copy, queued on
the current stream behind the work that computes it, and a device event is recorded after the copy: a few µs
of launches, no wait. The value is read when that event has completed, which the training thread asks (one
driver call per pending value, no wait) whenever the events API begins or ends a span. No thread is woken.

Where the value goes:

- read while its span is open: set on the span (or, for an event, sent at once, see below);
- read after its span ended: sent to the pipeline (``Telemetry.deliver_values``), whose exporting processor
  holds the span until its values arrive (``processors/late_values.py``): the span ended on time for the
  stuck detector and goodput, and is exported with the number. It says ``training.values.pending`` until
  then; a value that never completes within ``values_hold_s`` leaves ``training.values.unresolved``.

Values of an event (``trainer.log``) always travel that way, since an event cannot change once added; the
event's timestamp names it. At shutdown what is still pending gets a share of the exit budget.

**Objects that only their ``__str__`` describes** (a user's class: ``needs_text``) are converted by a thread
of ours, started the first time one is logged and asleep otherwise, so a ``__str__`` that blocks for seconds
holds up that thread, not the step. Their text always travels the second way (the span waits for export, not
for the training thread). The text is taken when converted, not when logged: an object changed in between
shows its later state. Known-cheap types (paths, enums, dates, UUIDs) are described where they are logged.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, Protocol

from opentelemetry.trace import Span

from otel_training._contain import contain
from otel_training.events.attributes import attribute_value, describe_now, device_description, is_device_scalar

#: Target of a value for the span's own attributes (an event's is its timestamp).
SPAN = -1
#: Values being read at once, at most; past it a value is described as before (counted, logged once).
MAX_PENDING = 4096

#: The training thread's containments (``defer``, ``poll``), built once.
_START_FAILED = contain("values-start", "otel_training: could not read a logged device value; it is "
                        "described instead")
_DELIVER_LATE_FAILED = contain("values-deliver", "otel_training: could not deliver a device value read late")


def defer_or_describe(values: PendingValues | None, span: Span, target: int,
                      late: list[tuple[str, Any]]) -> dict[str, Any]:
    """``late`` deferred for ``span``'s ``target`` (``PendingValues.defer``), or, where nothing reads them later
    (``values`` None: an injected provider's runtime), described here and now as before. What comes back goes
    on the span or the event at once."""
    if values is None:
        return {key: describe_now(value) for key, value in late}
    return values.defer(span, target, late)


class ValueReader(Protocol):
    """Reads device scalars without waiting: ``start`` queues a copy, ``ready`` asks, ``read`` takes it."""

    def start(self, value: Any) -> Any:
        """A handle for a one-element tensor on a device this reader reads, else None (described instead)."""

    def ready(self, handle: Any) -> bool:
        """Whether the copy has completed (no wait)."""

    def read(self, handle: Any) -> Any:
        """The value, as a Python scalar (only once ``ready``)."""


class TorchValueReader:
    """CUDA (and any torch device with events): ``.to("cpu", non_blocking=True)`` into pinned memory from
    torch's caching host allocator, then an event on the current stream; ``event.query()`` says when."""

    def __init__(self) -> None:
        import torch

        self._torch = torch

    def start(self, value: Any) -> Any:
        torch = self._torch
        if not isinstance(value, torch.Tensor) or value.device.type != "cuda" or value.numel() != 1:
            return None
        host = value.detach().to("cpu", non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return host, event

    def ready(self, handle: Any) -> bool:
        return bool(handle[1].query())

    def read(self, handle: Any) -> Any:
        return handle[0].item()


_reader_factory: Callable[[], ValueReader | None] | None = None


def use_reader(factory: Callable[[], ValueReader | None] | None) -> None:
    """Read device values with ``factory()``'s reader (tests, other accelerators); None: torch's, detected."""
    global _reader_factory
    _reader_factory = factory


class _Item:
    __slots__ = ("span", "span_id", "target", "key", "handle", "ended", "born")

    def __init__(self, span: Span, target: int, key: str, handle: Any) -> None:
        self.span = span
        self.span_id = span.get_span_context().span_id
        self.target = target
        self.key = key
        self.handle = handle
        self.ended = False
        self.born = time.monotonic()


class PendingValues:
    """The device values being read in one pipeline's process (see the module docstring)."""

    #: Slots: the C core reads ``items`` and ``converting`` at a step's begin and end (native/step_span.c).
    __slots__ = ("_deliver", "hold_s", "items", "_lock", "_reader", "described", "unresolved", "converting", "_queue",
                 "_converter", "_unconverted", "__weakref__")

    def __init__(self, deliver: Callable[[int, int, dict[str, Any]], None], hold_s: float) -> None:
        self._deliver = deliver
        self.hold_s = hold_s
        #: Read from the training thread's hot path without the lock: a list, replaced, never mutated.
        self.items: tuple[_Item, ...] = ()
        self._lock = threading.Lock()
        self._reader: ValueReader | Literal[False] | None = False  # False: not looked for yet
        #: Values described instead of read (no reader, too many pending), and never read in time.
        self.described = 0
        self.unresolved = 0
        #: Objects handed to the converter thread per span (its own attributes only), not yet counted at its end
        #: (the hot path asks whether it is empty).
        self.converting: dict[int, int] = {}
        self._queue: queue.SimpleQueue[tuple[int, int, str, Any] | None] = queue.SimpleQueue()
        self._converter: threading.Thread | None = None
        self._unconverted = 0  # handed over and not converted yet (settle waits for them)

    # -- the training thread -----------------------------------------------------
    def defer(self, span: Span, target: int, values: list[tuple[str, Any]]) -> dict[str, Any]:
        """Start reading ``values`` (key, device scalar) for ``span``'s ``target``; what could not be deferred
        comes back as attributes (their descriptions)."""
        reader = None
        described: dict[str, Any] = {}
        started: list[_Item] = []
        for key, value in values:
            if not is_device_scalar(value):
                self._convert(span, target, key, value)
                continue
            if reader is None:
                reader = self._get_reader()
            handle = None
            if reader is not None and len(self.items) + len(started) < MAX_PENDING:
                try:
                    handle = reader.start(value)
                except Exception:  # noqa: BLE001 - per logged value, inline: described, never raised
                    _START_FAILED.failed()
            if handle is None:
                self.described += 1
                described[key] = device_description(value)
            else:
                started.append(_Item(span, target, key, handle))
        if started:
            with self._lock:
                self.items = (*self.items, *started)
        return described

    @property
    def pending(self) -> bool:
        """Whether anything is being read or converted (the hot path asks ``items`` alone)."""
        return bool(self.items or self.converting or self._unconverted)

    def poll(self) -> None:
        """Deliver the values whose copies have completed (no wait); called by the events API's begin and end."""
        reader = self._reader
        if not self.items or not reader:
            return
        done: list[_Item] = []
        for item in self.items:
            try:
                if reader.ready(item.handle):
                    done.append(item)
            except Exception:  # noqa: BLE001 - a failed device: described as unresolved by the pipeline
                done.append(item)
                item.handle = None
        now = time.monotonic()
        expired = [item for item in self.items if item not in done and now - item.born > self.hold_s]
        if not done and not expired:
            return
        with self._lock:
            gone = set(map(id, done + expired))
            self.items = tuple(item for item in self.items if id(item) not in gone)
        self.unresolved += len(expired)
        for item in done:
            self._resolve(reader, item)

    def ended(self, span: Span) -> int:
        """``span`` is ending: read what is ready, then how many of its own values are still pending (the
        caller sets ``training.values.pending`` on it); those go to the pipeline once read."""
        self.poll()
        span_id = span.get_span_context().span_id
        waiting = self.converting.pop(span_id, 0) if self.converting else 0
        for item in self.items:
            if item.span_id == span_id:
                item.ended = True
                waiting += item.target == SPAN
        return waiting

    def settle(self, timeout_s: float) -> None:
        """Read what is pending, waiting at most ``timeout_s`` (shutdown: the device finishes its queue)."""
        deadline = time.monotonic() + timeout_s
        while (self.items or self._unconverted) and time.monotonic() < deadline:
            self.poll()
            if self.items or self._unconverted:
                time.sleep(0.001)

    # -- internals -------------------------------------------------------------------
    def _convert(self, span: Span, target: int, key: str, value: Any) -> None:
        """Hand ``value`` to the converter thread (started on first use); its text goes to the pipeline."""
        span_id = span.get_span_context().span_id
        if target == SPAN:
            if len(self.converting) >= MAX_PENDING:
                self.converting.clear()  # spans that never ended: their counts are forgotten, not kept
            self.converting[span_id] = self.converting.get(span_id, 0) + 1
        with self._lock:
            self._unconverted += 1
            if self._converter is None or not self._converter.is_alive():
                self._converter = threading.Thread(target=self._run_converter, name="otel-training-values",
                                                   daemon=True)
                self._converter.start()
        self._queue.put((span_id, target, key, value))

    def _run_converter(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            span_id, target, key, value = job
            try:
                converted = attribute_value(value)
            except Exception:  # noqa: BLE001 - text() never raises; this is belt and braces
                converted = None
            try:
                # A failing deliver must not end the converter thread.
                with contain("values-deliver", "otel_training: could not deliver a converted value"):
                    if converted is not None:
                        self._deliver(span_id, target, {key: converted})
                    else:
                        self.unresolved += 1
            finally:
                with self._lock:
                    self._unconverted -= 1

    def _get_reader(self) -> ValueReader | None:
        reader = self._reader
        if reader is False:
            reader = None
            # A reader that cannot be made (a user's factory, torch's CUDA): values are described.
            with contain("values-reader", "otel_training: no reader for device values; they are described"):
                if _reader_factory is not None:
                    reader = _reader_factory()
                elif "torch" in sys.modules:
                    reader = TorchValueReader()
            self._reader = reader
        return reader

    def _resolve(self, reader: ValueReader, item: _Item) -> None:
        try:
            value = attribute_value(reader.read(item.handle)) if item.handle is not None else None
        except Exception:  # noqa: BLE001 - a value the device could not give: counted unresolved, never raised
            value = None
        if value is None:
            self.unresolved += 1
            return
        if item.target == SPAN and not item.ended and item.span.is_recording():
            item.span.set_attribute(item.key, value)
            return
        try:
            self._deliver(item.span_id, item.target, {item.key: value})
        except Exception:  # noqa: BLE001 - poll(), on the training thread, per value: logged, not raised
            _DELIVER_LATE_FAILED.failed()
