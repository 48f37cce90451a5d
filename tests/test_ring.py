"""The offload ring (``otel_training/_ring.py``): the C core and the pure-Python fallback, one behaviour.

Every test of the ring's behaviour runs on both implementations. The native one must load unless the build
was skipped on purpose (``OTEL_TRAINING_BUILD_NATIVE=0``): a missing extension fails here, not skips.
"""

from __future__ import annotations

import logging
import marshal
import os
import platform
import signal
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from otel_training import _native_loader, _ring
from otel_training._ring import HEADER, Ring

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="the ring needs memfd_create (Linux)")
_U64 = struct.Struct("<Q")
_F_WRITE, _F_READ = 64, 128


@pytest.fixture(params=["on", "off"], ids=["native", "fallback"])
def mode(request: pytest.FixtureRequest) -> str:
    if request.param == "on" and os.environ.get("OTEL_TRAINING_BUILD_NATIVE") == "0":
        pytest.skip("the C extension's build was skipped on purpose (OTEL_TRAINING_BUILD_NATIVE=0)")
    return str(request.param)


def _pair(capacity: int, mode: str, reader_mode: str | None = None) -> tuple[Ring, Ring]:
    ring = Ring.create(capacity, mode)
    return ring, Ring.attach(os.dup(ring.fd), reader_mode or mode)


@pytest.fixture
def rings() -> Iterator[list[Ring]]:
    made: list[Ring] = []
    yield made
    for ring in made:
        ring.close()


def test_the_mode_picks_the_implementation(mode: str) -> None:
    ring = Ring.create(64, mode)
    assert ring.native == (mode == "on")
    ring.close()


def test_records_come_out_whole_and_in_order_across_the_wrap(mode: str) -> None:
    ring, reader = _pair(256, mode)
    sent, got = [], []
    for index in range(500):
        payload = bytes([index % 251]) * (index % 37 + 1)
        assert ring.write(payload, index % 2 == 0)
        sent.append(payload)
        if index % 3 == 2:
            got.extend(reader.read())
    got.extend(reader.read())
    assert got == sent
    assert ring.dropped_begins == ring.dropped_ends == 0 and ring.ends_written == 250


@pytest.mark.parametrize("writer_mode, reader_mode", [("on", "off"), ("off", "on")])
def test_either_implementation_reads_the_others_ring(writer_mode: str, reader_mode: str) -> None:
    """The two lay out the same bytes: a drain that could not load the extension still reads a native writer."""
    if os.environ.get("OTEL_TRAINING_BUILD_NATIVE") == "0":
        pytest.skip("the C extension's build was skipped on purpose (OTEL_TRAINING_BUILD_NATIVE=0)")
    ring, reader = _pair(128, writer_mode, reader_mode)
    sent = [bytes([index]) * (index % 29) for index in range(200)]
    got: list[bytes] = []
    for payload in sent:
        assert ring.write(payload, False)
        got.extend(reader.read())
    assert got == sent and ring.used() == 0


def test_a_full_ring_drops_at_once_and_counts_by_kind_when_the_reader_is_gone(
        mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ring = Ring.create(64, mode)
    ring.wait_s = 30.0
    ring.alive = lambda: False
    monkeypatch.setattr(_ring.time, "sleep", lambda seconds: pytest.fail("waited for a reader that is gone"))
    written = [ring.write(b"x" * 20, True) for _ in range(2)]
    assert written == [True, True]
    assert not ring.write(b"x" * 20, True) and not ring.write(b"y" * 20, False)
    assert not ring.write(b"z" * 100, False)  # bigger than the ring: never fits
    assert (ring.dropped_begins, ring.dropped_ends, ring.ends_written) == (1, 2, 0)


def test_a_closed_writer_drops_and_counts(mode: str) -> None:
    ring = Ring.create(256, mode)
    ring.close_writer()
    assert ring.closed
    assert not ring.write(b"a", True) and not ring.write(b"b", False) and not ring.write(b"c", None)
    assert (ring.dropped_begins, ring.dropped_ends, ring.used()) == (1, 1, 0)


def test_a_full_ring_waits_for_a_live_reader_and_loses_nothing(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ring, reader = _pair(64, mode)
    ring.wait_s = 30.0
    waiting = threading.Event()
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        waiting.set()
        real_sleep(seconds)

    monkeypatch.setattr(_ring.time, "sleep", sleep)
    got: list[bytes] = []
    drainer = threading.Thread(target=lambda: (waiting.wait(30), got.extend(reader.read())))
    assert ring.write(b"a" * 28, True) and ring.write(b"b" * 28, False)
    drainer.start()
    assert ring.write(b"c" * 28, True)  # full: waits until the reader has read
    drainer.join(30)
    got.extend(reader.read())
    assert got == [b"a" * 28, b"b" * 28, b"c" * 28]
    assert ring.dropped_begins == ring.dropped_ends == 0 and ring.waited_s > 0


def test_threads_writing_at_once_lose_and_tear_no_record(mode: str) -> None:
    ring, reader = _pair(4096, mode)
    ring.wait_s = 30.0
    threads, per_thread = 4, 3000
    got: list[bytes] = []
    done = threading.Event()

    def drain() -> None:
        while not done.is_set() or ring.used():
            got.extend(reader.read())

    def write(thread: int) -> None:
        for index in range(per_thread):
            assert ring.write(marshal.dumps((thread, index, "p" * (index % 50))), True)

    drainer = threading.Thread(target=drain)
    drainer.start()
    writers = [threading.Thread(target=write, args=(thread,)) for thread in range(threads)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    done.set()
    drainer.join(60)
    records = [marshal.loads(payload) for payload in got]
    assert all(text == "p" * (index % 50) for _, index, text in records)
    for thread in range(threads):  # each thread's records, all there and in its order
        assert [index for owner, index, _ in records if owner == thread] == list(range(per_thread))


def test_a_reader_alive_but_not_reading_stalls_a_writer_once_not_on_every_record(
        mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_ring, "STALLED_S", 0.05)
    ring = Ring.create(64, mode)
    ring.wait_s = 30.0
    assert ring.write(b"x" * 28, True) and ring.write(b"x" * 28, True)
    started = time.monotonic()
    assert not ring.write(b"y" * 28, True)  # waits until the reader is seen stalled, then drops
    sleeps: list[float] = []
    monkeypatch.setattr(_ring.time, "sleep", sleeps.append)
    assert not ring.write(b"z" * 28, True) and sleeps == []  # still stalled: no second wait
    assert ring.dropped_begins == 2 and time.monotonic() - started < 25  # not the 30 s of wait_s


# -- the fallback's signal window; the native append has none --------------------------------------------
def test_a_signal_handler_that_interrupts_a_fallback_write_drops_its_record_instead_of_deadlocking() -> None:
    ring, reader = _pair(4096, "off")
    append = ring._append
    nested: list[bool] = []

    def interrupted(payload: bytes, size: int) -> None:  # as if a signal handler ran in the middle
        if not nested:
            nested.append(ring.write(b"from the handler", False))
        append(payload, size)

    ring._append = interrupted  # type: ignore[method-assign]
    assert ring.write(b"outer", True)
    assert nested == [False] and ring.dropped_ends == 1
    assert reader.read() == [b"outer"]


def test_signal_handlers_writing_during_native_appends_lose_nothing() -> None:
    """The GIL is held across the C append: a handler runs between appends, never inside one."""
    if os.environ.get("OTEL_TRAINING_BUILD_NATIVE") == "0":
        pytest.skip("the C extension's build was skipped on purpose (OTEL_TRAINING_BUILD_NATIVE=0)")
    ring, reader = _pair(1 << 22, "on")
    from_handler: list[int] = []

    def handler(signum: int, frame: object) -> None:
        from_handler.append(len(from_handler))
        assert ring.write(b"handler-%d" % from_handler[-1], False)

    previous = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 0.0005, 0.0005)
    try:
        deadline = time.monotonic() + 30
        index = 0
        while len(from_handler) < 50 and time.monotonic() < deadline:
            assert ring.write(b"loop-%d" % index, True)
            index += 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    got = reader.read(1 << 30)
    assert len(from_handler) >= 50
    assert [record for record in got if record.startswith(b"loop-")] == [b"loop-%d" % i for i in range(index)]
    # A handler may itself be interrupted by the next signal, so handler records need not keep their numbers'
    # order: each arrives whole, once.
    assert sorted(record for record in got if record.startswith(b"handler-")) == sorted(
        b"handler-%d" % i for i in range(len(from_handler)))
    assert ring.dropped_begins == ring.dropped_ends == 0


# -- a reader that never trusts the shared memory ---------------------------------------------------------
def test_a_length_past_what_was_published_is_skipped_and_counted_not_followed(mode: str) -> None:
    ring, reader = _pair(256, mode)
    assert ring.write(b"good", True)
    assert reader.read() == [b"good"]
    assert ring.write(b"x" * 40, True)
    struct.pack_into("<I", ring._mm, HEADER + 8, 10_000)
    assert reader.read() == [] and reader.corrupt == 1
    assert reader.used() == 0  # skipped to what was published: the writer gets its room back
    assert ring.write(b"after", True) and reader.read() == [b"after"]


def test_a_write_position_no_writer_could_publish_is_refused(mode: str) -> None:
    ring, reader = _pair(256, mode)
    assert ring.write(b"a" * 10, True)
    _U64.pack_into(ring._mm, _F_WRITE, 1 << 50)
    assert reader.read() == [] and reader.corrupt == 1
    _U64.pack_into(ring._mm, _F_WRITE, 0)
    assert reader.read() == [] and reader.corrupt == 2


def test_a_truncated_length_prefix_is_corruption(mode: str) -> None:
    ring, reader = _pair(64, mode)
    _U64.pack_into(ring._mm, _F_WRITE, 2)
    assert reader.read() == [] and reader.corrupt == 1


def test_a_reader_position_ahead_of_the_writer_reads_as_full_never_as_room(mode: str) -> None:
    ring = Ring.create(64, mode)
    reader = Ring.attach(os.dup(ring.fd), mode)
    assert ring.write(b"A" * 28, True) and ring.write(b"B" * 28, True)  # full: the next write looks at the reader
    for damaged in (1 << 40, 69):  # far ahead, and just ahead (room would be computed from it wrongly)
        _U64.pack_into(ring._mm, _F_READ, damaged)
        assert [ring.write(b"x" * 8, True) for _ in range(3)] == [False] * 3  # every time, not only the first
    assert ring.dropped_begins == 6
    _U64.pack_into(ring._mm, _F_READ, 0)
    assert reader.read() == [b"A" * 28, b"B" * 28]


def test_a_mapping_that_is_not_a_ring_is_refused(mode: str, tmp_path: object) -> None:
    fd = os.memfd_create("not-a-ring")
    os.ftruncate(fd, HEADER + 64)
    with pytest.raises(ValueError, match="does not hold an otel-training ring"):
        Ring.attach(fd, mode)
    ring = Ring.create(64, mode)
    _U64.pack_into(ring._mm, 8, 1 << 20)
    with pytest.raises(ValueError, match="does not hold an otel-training ring"):
        Ring.attach(os.dup(ring.fd), mode)


def test_the_rings_size_is_sealed_so_no_one_can_shrink_it_under_the_reader(mode: str) -> None:
    ring = Ring.create(64, mode)
    with pytest.raises(PermissionError):
        os.ftruncate(ring.fd, 100)  # a shrunk mapping would fault the reader (SIGBUS); a grown one is refused too
    with pytest.raises(PermissionError):
        os.ftruncate(ring.fd, HEADER + 128)
    unsealed = os.memfd_create("unsealed")
    os.ftruncate(unsealed, HEADER + 64)
    os.write(unsealed, ring._mm[:HEADER])
    with pytest.raises(ValueError, match="does not hold an otel-training ring"):
        Ring.attach(unsealed, mode)


def test_hostile_bytes_never_crash_a_reader_and_every_record_fits_the_ring(mode: str) -> None:
    """A bounded fuzz from Python; the C core is fuzzed without Python by scripts/native-check."""
    import random

    generator = random.Random(7)
    for _ in range(300):
        ring, reader = _pair(generator.choice((8, 64, 333)), mode)
        mm = ring._mm
        mm[HEADER:] = bytes(generator.getrandbits(8) for _ in range(len(mm) - HEADER))
        _U64.pack_into(mm, _F_WRITE, generator.choice((0, 3, 7, 64, 333, 1 << 63, generator.getrandbits(64))))
        for _ in range(3):
            for record in reader.read(generator.choice((1, 64, 1 << 20))):
                assert len(record) <= ring.capacity - 4
        reader.close()
        ring.close()


# -- where it runs ---------------------------------------------------------------------------------------
def test_aarch64_gets_the_ring_from_the_extension_and_a_reason_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    if os.environ.get("OTEL_TRAINING_BUILD_NATIVE") != "0":
        assert _ring.supported("on") is None
    why = _ring.supported("off")
    assert why is not None and "x86-64 store ordering" in why and "aarch64" in why


def test_the_loader_says_once_why_it_falls_back(monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(_native_loader, "_tried", True)
    monkeypatch.setattr(_native_loader, "_problem", "the C extension otel_training._native is not built")
    monkeypatch.setattr(_native_loader, "_told", False)
    with caplog.at_level(logging.INFO, logger="otel_training"):
        assert _native_loader.native("auto") is None and _native_loader.native("auto") is None
    assert [record.getMessage().count("pure-Python fallback") for record in caplog.records] == [1]
    with pytest.raises(RuntimeError, match="not built"):
        _native_loader.native("on")
    assert _native_loader.native("off") is None


def test_a_package_without_its_extension_falls_back_by_itself_and_says_so_once(tmp_path: object) -> None:
    """A copy of the package with no built extension (a machine without a C compiler, or a build that
    failed): the loader finds none, says why once, and the ring runs on the fallback. ``python -S``: no site
    packages, so an editable install's finder cannot hand it the extension built here."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    package = Path(_native_loader.__file__).parent
    copy = Path(str(tmp_path)) / "otel_training"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    program = (
        "import logging, sys; logging.basicConfig(format='%(message)s')\n"
        "from otel_training import _native_loader, _ring\n"
        "assert _native_loader.native('auto') is None and _native_loader.native('auto') is None\n"
        "ring = _ring.Ring.create(4096)\n"
        "assert not ring.native and ring.write(b'x', True)\n"
        "print('fallback', _native_loader.problem())\n"
    )
    result = subprocess.run([sys.executable, "-S", "-c", program], cwd=str(tmp_path), capture_output=True,
                            text=True, timeout=60, env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("fallback the C extension otel_training._native is not built or does not load")
    assert result.stderr.count("the pure-Python fallback runs instead") == 1  # said once, not per ring
