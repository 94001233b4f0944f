"""record_io's buffered read path: records over SCAN bytes are read in order as pieces,
each hashed as it lands (by the reading thread, or queued on the reader thread when a
batch starts the read ahead), a lone read of STREAM_MIN bytes and more taking its turn
in the tier's stream; every byte and the digest must come out as one whole read would give
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


def _read(fd: int, size: int, views: list[memoryview], how: str, stream: _Recorder) -> tuple[bool, int]:
    """A record's payload read as a lone read does (:func:`record_io.read_hashed`: pieces
    read by this thread, big ones in ``stream``), or as a batch starts it ahead
    (:class:`record_io.InOrderRead`: the pieces queued on the reader thread)."""
    lead = memoryview(bytearray(HEADER_BYTES))
    if how == "lone":
        return record_io.read_hashed(fd, HEADER_BYTES, size, views, 7, lead=lead, stream=stream)
    record_io.queued_reads()
    digests = record_io.InOrderRead(fd, 0, lead, views, 7).wait()
    return (False, 0) if digests is None else (True, digests[0])


@pytest.mark.parametrize("how", ["lone", "started"])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("parts", [1, 3])
def test_buffered_reads_give_every_byte_and_the_whole_digest(tmp_path, size, parts, how):
    payload = np.random.default_rng(size).integers(0, 255, size, dtype=np.uint8).tobytes()
    fd = _record_file(tmp_path, payload)
    cuts = sorted({0, size, *(size * k // parts + k for k in range(1, parts))} & set(range(size + 1)))
    out = bytearray(size)
    views = [memoryview(out)[a:b] for a, b in zip(cuts, cuts[1:])]
    stream = _Recorder()
    try:
        ok, digest = _read(fd, size, views, how, stream)
    finally:
        os.close(fd)
    assert ok and bytes(out) == payload
    assert digest == checksum([payload], 7)
    big_lone_read = how == "lone" and size >= record_io.STREAM_MIN
    assert stream.entered == (1 if big_lone_read else 0) and not stream.held


@pytest.mark.parametrize("how", ["lone", "started"])
@pytest.mark.parametrize("size", [4096, 3 * SCAN + 4097, record_io.STREAM_MIN + 1])
def test_a_truncated_record_fails_the_read(tmp_path, size, how):
    payload = os.urandom(size)
    fd = _record_file(tmp_path, payload[:-1])  # the file ends one byte early
    try:
        ok, _ = _read(fd, size, [memoryview(bytearray(size))], how, _Recorder())
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
