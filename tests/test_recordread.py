"""Record reads in one call (cascade.tiers.record_io: preadv_hashed, submit, wait_idle): the
compiled module and its Python fallbacks read the same bytes and give the same XXH3
digests as the xxhash module, say None for a file that ends first and raise the same
errors; queued reads (submit) run on a reader thread in the order queued, their jobs
keep the buffers until waited for, and a job dropped unwaited is waited for first."""
from __future__ import annotations

import gc
import os
import threading

import numpy as np
import pytest
import xxhash

from cascade.tiers import record_io

IMPLS = {"compiled": (record_io.preadv_hashed, record_io.submit),
         "python": (record_io.preadv_hashed_python, record_io.submit_python)}


def test_the_compiled_reads_were_built():
    """`make install` builds cascade/tiers/_recordread.c; without it a batch of file-tier
    blocks is read in the caller's thread (no overlap), so this says so."""
    assert record_io.COMPILED, "cascade.tiers._recordread was not built: run `make install` (needs a C compiler)"


@pytest.fixture(params=list(IMPLS))
def impl(request):
    if request.param == "compiled" and not record_io.COMPILED:
        pytest.skip("not built here (test_the_compiled_reads_were_built says why)")
    return IMPLS[request.param]


@pytest.fixture
def data_file(tmp_path):
    data = np.random.default_rng(3).integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    yield fd, data
    os.close(fd)


def _buffers(sizes):
    return [np.zeros(n, np.uint8) if i % 2 else bytearray(n) for i, n in enumerate(sizes)]


@pytest.mark.parametrize("sizes,offset", [([4096, 32768, 32768, 0, 4096], 0), ([1], 17), ([100, 3, 70000], 5000),
                                           ([1 << 20, (1 << 20) + 1], 12345), ([7] * 1100, 9)])  # 1100: over IOV_MAX
def test_every_byte_and_each_spans_digest_match_the_xxhash_module(impl, data_file, sizes, offset):
    read, submit = impl
    fd, data = data_file
    rng = np.random.default_rng(len(sizes))
    spans = [(0, len(sizes), 0)] + [(int(a), int(a) + int(n), int(rng.integers(0, 2**64, dtype=np.uint64)))
                                    for a, n in zip(rng.integers(0, len(sizes), 4), rng.integers(0, 3, 4))
                                    if a + n <= len(sizes)]
    for how in ("now", "queued"):
        iov = _buffers(sizes)
        got = read(fd, offset, iov, spans) if how == "now" else submit(fd, offset, iov, spans).wait()
        pos, starts = offset, []
        for b in iov:
            starts.append(pos)
            assert bytes(b) == data[pos:pos + len(b)]
            pos += len(b)
        starts.append(pos)
        assert got == [xxhash.xxh3_64_intdigest(data[starts[a]:starts[b]], seed=seed) for a, b, seed in spans]


def test_a_file_ending_first_gives_none_and_errors_are_raised(impl, data_file):
    read, submit = impl
    fd, data = data_file
    assert read(fd, len(data) - 10, [bytearray(4), bytearray(20)], [(0, 2, 1)]) is None
    assert submit(fd, len(data), [bytearray(1)], []).wait() is None
    bad = os.open(os.devnull, os.O_RDONLY)
    os.close(bad)  # a closed descriptor
    with pytest.raises(OSError):
        read(bad, 0, [bytearray(8)], [])
    with pytest.raises(OSError):
        submit(bad, 0, [bytearray(8)], []).wait()


def test_bad_arguments_are_refused_before_anything_is_read(data_file):
    if not record_io.COMPILED:
        pytest.skip("not built here")
    fd, _ = data_file
    out = bytearray(8)
    for call in (record_io.preadv_hashed, record_io.submit):
        with pytest.raises(BufferError):
            call(fd, 0, [b"read-only"], [])
        with pytest.raises(ValueError, match="outside"):
            call(fd, 0, [out], [(0, 2, 0)])
        with pytest.raises(ValueError, match="negative"):
            call(fd, -1, [out], [])
        with pytest.raises(TypeError):
            call(fd, 0, [out], [(0, 1)])
        assert out == bytearray(8)


def test_queued_reads_run_in_order_on_a_reader_thread_and_are_waited_for_once(data_file):
    if not record_io.COMPILED:
        pytest.skip("not built here")
    fd, data = data_file
    assert record_io.queued_reads() and record_io.start_readers(1) >= 1
    outs = [np.zeros(64 << 10, np.uint8) for _ in range(40)]
    jobs = [record_io.submit(fd, i * 4096, [out], [(0, 1, i)]) for i, out in enumerate(outs)]
    record_io.wait_idle()
    assert all(job.done() for job in jobs)
    for i, (job, out) in enumerate(zip(jobs, outs)):
        assert job.wait() == [xxhash.xxh3_64_intdigest(data[i * 4096:i * 4096 + (64 << 10)], seed=i)]
        assert bytes(out) == data[i * 4096:i * 4096 + (64 << 10)]
    with pytest.raises(RuntimeError, match="already waited"):
        jobs[0].wait()


def test_a_job_dropped_unwaited_keeps_its_buffers_until_its_read_ends(data_file):
    """Its buffers stay exported (a bytearray cannot be resized) until the job is freed,
    which waits for the read; other threads run meanwhile."""
    if not record_io.COMPILED:
        pytest.skip("not built here")
    fd, data = data_file
    record_io.queued_reads()
    out = bytearray(1 << 20)
    job = record_io.submit(fd, 0, [out], [(0, 1, 0)])
    with pytest.raises(BufferError):
        out.extend(b"x")  # still exported by the job
    ticks = []
    ticker = threading.Thread(target=lambda: ticks.extend(range(1000)))
    ticker.start()
    del job
    gc.collect()
    ticker.join()
    out.extend(b"x")  # released: resizable again
    assert bytes(out[:-1]) == data[:1 << 20] and len(ticks) == 1000


def test_a_flags_argument_is_refused_before_any_read(data_file):
    if not record_io.COMPILED:
        pytest.skip("not built here (test_the_compiled_reads_were_built says why)")
    fd, _ = data_file
    buf = bytearray(8)
    for call in (record_io.preadv_hashed, record_io.submit):
        with pytest.raises(TypeError, match="expected"):
            call(fd, 0, [buf], [(0, 1, 0)], 0)
    assert bytes(buf) == bytes(8)
