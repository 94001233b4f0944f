"""record_io's buffered read path: records over SCAN bytes are read in order as pieces,
each hashed as it lands, those of STREAM_MIN bytes and more taking their turn in the
tier's stream; every byte and the digest must come out as one whole read would give
them, and a short file must fail the read. The stream grants waiting reads in file
order."""
from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest

from cascade.checksum import checksum
from cascade.tiers import record_io
from cascade.tiers.records import HEADER_BYTES

SCAN = record_io.SCAN
# around a piece's end (the lead shares the first piece), several pieces, a short last one
SIZES = [1, 4096, SCAN - HEADER_BYTES, SCAN - HEADER_BYTES + 1, SCAN, SCAN + 1, 3 * SCAN + 4097,
         record_io.STREAM_MIN - 1, record_io.STREAM_MIN]


class _Recorder(record_io.ReadStream):
    """The tier's stream, counting how often a read took its turn."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = 0
        self.held = False

    @contextmanager
    def turn(self, fd: int, offset: int):
        with super().turn(fd, offset):
            assert not self.held
            self.entered += 1
            self.held = True
            try:
                yield
            finally:
                self.held = False


def _record_file(tmp_path, payload: bytes) -> int:
    path = tmp_path / "rec.bin"
    path.write_bytes(os.urandom(HEADER_BYTES) + payload)
    return os.open(path, os.O_RDONLY)


@pytest.fixture(params=["queued", "inline"])
def queueing(request, monkeypatch):
    """Big records' pieces queued on the reader thread (hashed here as they land), or read
    here one after another (no reader threads, or no compiled module)."""
    if request.param == "queued" and not record_io.queued_reads():
        pytest.skip("cascade.tiers._recordread not built here")
    monkeypatch.setattr(record_io, "_queueing", request.param == "queued")


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("parts", [1, 3])
def test_buffered_reads_give_every_byte_and_the_whole_digest(tmp_path, size, parts, queueing):
    payload = np.random.default_rng(size).integers(0, 255, size, dtype=np.uint8).tobytes()
    fd = _record_file(tmp_path, payload)
    cuts = sorted({0, size, *(size * k // parts + k for k in range(1, parts))} & set(range(size + 1)))
    out = bytearray(size)
    views = [memoryview(out)[a:b] for a, b in zip(cuts, cuts[1:])]
    stream = _Recorder()
    try:
        ok, digest = record_io.read_hashed(fd, HEADER_BYTES, size, views, 7,
                                           lead=memoryview(bytearray(HEADER_BYTES)), stream=stream)
    finally:
        os.close(fd)
    assert ok and bytes(out) == payload
    assert digest == checksum([payload], 7)
    assert stream.entered == (1 if size >= record_io.STREAM_MIN else 0) and not stream.held


@pytest.mark.parametrize("size", [4096, 3 * SCAN + 4097, record_io.STREAM_MIN + 1])
def test_a_truncated_record_fails_the_read(tmp_path, size, queueing):
    payload = os.urandom(size)
    fd = _record_file(tmp_path, payload[:-1])  # the file ends one byte early
    try:
        ok, _ = record_io.read_hashed(fd, HEADER_BYTES, size, [memoryview(bytearray(size))], 7,
                                      lead=memoryview(bytearray(HEADER_BYTES)), stream=_Recorder())
    finally:
        os.close(fd)
    assert not ok


def test_the_stream_grants_waiting_reads_in_file_order():
    stream = record_io.ReadStream()
    granted: list[int] = []
    first = stream.turn(3, 0)
    first.__enter__()  # held while the others queue up out of order

    def read(offset: int) -> None:
        with stream.turn(3, offset):
            granted.append(offset)

    threads = []
    for offset in (30, 10, 40, 20):
        threads.append(threading.Thread(target=read, args=(offset,), daemon=True))
        threads[-1].start()
    deadline = time.monotonic() + 10
    while len(stream._waiting) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(stream._waiting) == 4
    first.__exit__(None, None, None)
    for t in threads:
        t.join(10)
    assert granted == [10, 20, 30, 40]


def test_a_read_interrupted_while_waiting_leaves_the_stream_usable():
    stream = record_io.ReadStream()
    holder = stream.turn(3, 50)
    holder.__enter__()
    waiter_failed = threading.Event()

    def interrupted() -> None:  # waits at offset 10, then gives up (as on KeyboardInterrupt)
        original = stream._cond.wait

        def wait(timeout=None):
            raise KeyboardInterrupt

        stream._cond.wait = wait
        try:
            with stream.turn(3, 10):
                pass
        except KeyboardInterrupt:
            waiter_failed.set()
        finally:
            stream._cond.wait = original

    t = threading.Thread(target=interrupted, daemon=True)
    t.start()
    t.join(10)
    assert waiter_failed.is_set() and stream._waiting == []
    holder.__exit__(None, None, None)
    done = []
    later = threading.Thread(target=lambda: done.append(stream.turn(3, 20).__enter__() is None), daemon=True)
    later.start()
    later.join(10)
    assert done == [True]  # offset 20 was not kept waiting behind the abandoned offset 10
