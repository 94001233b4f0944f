"""File-tier read paths: per-file-system mode choice, chunked parallel reads, verification."""
from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from cascade import CascadeStore, Config, ConfigError, CorruptBlock, InvalidBlock
from cascade.core import batch_reads
from cascade.models import BlockSpec
from cascade.tiers import file_reads, record_io
from cascade.tiers.file_tier import FileTier
from cascade.tiers.records import HEADER_BYTES, PAGE

SIZE = max(5 * record_io.CHUNK, record_io.PARALLEL_MIN) + 4096  # chunked: several chunks, a short last one


def _aligned(nbytes: int) -> np.ndarray:
    import mmap

    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=np.uint8)


@pytest.mark.parametrize("mode", ["auto", "buffered", "direct"])
def test_big_records_read_back_exactly_in_every_mode(tmp_path, mode):
    tier = FileTier(64 << 20, str(tmp_path / "f"), read_mode=mode, segment_bytes=1 << 30)
    expected = {"auto": "direct" if tier.on_lustre else "buffered", "buffered": "buffered", "direct": "direct"}
    assert tier.read_mode == expected[mode]
    rng = np.random.default_rng(0)
    blocks = {("ns", f"{i:032x}"): rng.integers(0, 255, SIZE, dtype=np.uint8) for i in range(3)}
    for key, data in blocks.items():
        tier.put(key, [data[:SIZE // 2], data[SIZE // 2:]])
    tier.sync()
    for key, data in blocks.items():
        for out in (np.empty(SIZE, np.uint8), _aligned(SIZE)):  # unaligned (bounced) and aligned outputs
            tier.read_parts_into(key, [out])
            assert np.array_equal(out, data)
    tier.close()


@pytest.mark.parametrize("mode", ["buffered", "direct"])
def test_a_flipped_byte_in_a_middle_chunk_is_caught(tmp_path, mode):
    tier = FileTier(64 << 20, str(tmp_path / "f"), read_mode=mode, segment_bytes=1 << 30)
    key = ("ns", "ab" * 16)
    tier.put(key, [np.full(SIZE, 7, np.uint8)])
    tier.sync()
    path = tier._files[tier._index[key].file_id].path
    with open(path, "r+b") as f:  # a byte in the third chunk of the payload
        f.seek(HEADER_BYTES + 2 * record_io.CHUNK + 123)  # inside the third chunk
        f.write(b"\x08")
    os.posix_fadvise(tier._files[tier._index[key].file_id].fd, 0, 0, os.POSIX_FADV_DONTNEED)
    with pytest.raises(CorruptBlock):
        tier.read_parts_into(key, [_aligned(SIZE)])
    assert key not in tier and tier.counters["corrupt_reads"] == 1
    tier.close()


def test_read_mode_is_a_config_key(tmp_path):
    with pytest.raises(ConfigError, match="file_read_mode"):
        Config(file_read_mode="fast")
    cfg = Config(model="tiny", shm_bytes=0, file_dir=str(tmp_path / "f"), file_read_mode="buffered")
    with CascadeStore(cfg) as store:
        assert store.stats()["tiers"]["file"]["read_mode"] == "buffered"


@contextmanager
def _leased_tier(tmp_path, count: int, nbytes: int) -> Iterator[tuple[FileTier, dict, list]]:
    """A buffered file tier holding ``count`` random blocks back to back, each leased
    (leases released and the tier closed at the end)."""
    tier = FileTier(64 << 20, str(tmp_path / "f"), read_mode="buffered", segment_bytes=1 << 30)
    rng = np.random.default_rng(1)
    blocks = {("ns", f"{i:032x}"): rng.integers(0, 255, nbytes, dtype=np.uint8) for i in range(count)}
    for key, data in blocks.items():
        tier.put(key, [data[:nbytes // 3], data[nbytes // 3:]])
    tier.sync()
    leases = [tier.lease(key) for key in blocks]
    try:
        yield tier, blocks, leases
    finally:
        for lease in leases:
            tier.release(lease)
        tier.close()


@pytest.mark.parametrize("nbytes", [8 << 10, 5000])  # page-sized payloads, and payloads with page padding
def test_back_to_back_records_are_read_as_one_run_with_one_preadv(tmp_path, monkeypatch, nbytes):
    with _leased_tier(tmp_path, 6, nbytes) as (tier, blocks, leases):
        assert tier.read_runs(leases) == [range(0, 6)]
        calls = []
        read = record_io.preadv_hashed
        monkeypatch.setattr(record_io, "preadv_hashed", lambda fd, off, iov, spans: calls.append(off)
                            or read(fd, off, iov, spans))
        outs = [[np.zeros(nbytes // 2, np.uint8), np.zeros(nbytes - nbytes // 2, np.uint8)] for _ in blocks]
        assert tier.read_leased_run(leases, outs) == [None] * 6
        assert len(calls) == 1
        for out, data in zip(outs, blocks.values()):
            assert np.array_equal(np.concatenate(out), data)
        outs = [[np.zeros(nbytes, np.uint8)] for _ in blocks]  # queued on the reader thread: the same
        assert tier.finish_leased_run(tier.start_leased_run(leases, outs)) == [None] * 6
        assert all(np.array_equal(out[0], data) for out, data in zip(outs, blocks.values()))


@pytest.mark.parametrize("queued", [False, True])
def test_a_run_reads_into_arrays_of_any_numpy_dtype_and_refuses_outputs_it_cannot_fill(tmp_path, queued):
    """Arrays go into the run's read as they are, whatever their numpy dtype; outputs of
    the wrong size or not contiguous are refused before anything is read."""
    with _leased_tier(tmp_path, 4, 8 << 10) as (tier, blocks, leases):
        def read(outs):
            return tier.finish_leased_run(tier.start_leased_run(leases, outs)) if queued else \
                tier.read_leased_run(leases, outs)

        halves = [[np.zeros(2 << 10, np.float16), np.zeros(1 << 10, np.int32)] for _ in blocks]
        assert read(halves) == [None] * 4
        for out, data in zip(halves, blocks.values()):
            assert np.array_equal(np.concatenate([o.view(np.uint8) for o in out]), data)
        with pytest.raises(ValueError, match="output buffers hold 4096 bytes, block has 8192"):
            read([[np.zeros(4 << 10, np.uint8)] for _ in blocks])
        with pytest.raises(ValueError, match="not C-contiguous"):
            read([[np.zeros(16 << 10, np.uint8)[::2]] for _ in blocks])


def test_runs_break_at_gaps_at_their_caps_and_in_direct_mode(tmp_path, monkeypatch):
    with _leased_tier(tmp_path, 8, 8 << 10) as (tier, _, leases):
        assert tier.read_runs(leases[:2] + leases[3:]) == [range(0, 2), range(2, 7)]  # block 2 skipped: a gap
        assert tier.read_runs(leases[::-1]) == [range(i, i + 1) for i in range(8)]  # backwards: no run
        monkeypatch.setattr("cascade.tiers.file_reads.RUN_RECORDS", 3)
        assert tier.read_runs(leases) == [range(0, 3), range(3, 6), range(6, 8)]
        monkeypatch.setattr("cascade.tiers.file_reads.RUN_RECORDS", 64)
        monkeypatch.setattr("cascade.tiers.file_reads.RUN_BYTES", 2 * leases[0].loc.record_bytes)
        assert tier.read_runs(leases) == [range(i, i + 2) for i in range(0, 8, 2)]
        monkeypatch.setattr(tier, "_odirect", True)
        assert tier.read_runs(leases) == [range(i, i + 1) for i in range(8)]


def test_a_run_gives_each_block_its_own_verdict_when_one_is_corrupt_or_the_read_fails(tmp_path, monkeypatch):
    with _leased_tier(tmp_path, 4, 64 << 10) as (tier, blocks, leases):
        keys = list(blocks)
        bad = tier._index[keys[1]]
        with open(tier._files[bad.file_id].path, "r+b") as f:  # a byte in block 1's payload
            f.seek(bad.offset + HEADER_BYTES + 77)
            f.write(bytes([blocks[keys[1]][77] ^ 0xFF]))
        outs = [[np.zeros(64 << 10, np.uint8)] for _ in keys]
        errors = tier.read_leased_run(leases, outs)
        assert [e is None for e in errors] == [True, False, True, True] and isinstance(errors[1], CorruptBlock)
        assert tier.counters["corrupt_reads"] == 1
        read, failed = record_io.preadv_hashed, []

        def fail_the_run(fd, off, iov, spans):  # the joined read fails; single records read fine
            if len(spans) > 1:
                failed.append(off)
                raise OSError(5, "injected EIO")
            return read(fd, off, iov, spans)

        monkeypatch.setattr(record_io, "preadv_hashed", fail_the_run)
        monkeypatch.setattr(record_io, "submit", record_io.submit_python)  # queued: fails the same way
        for start_finish in (False, True):
            outs = [[np.zeros(64 << 10, np.uint8)] for _ in keys]
            errors = (tier.finish_leased_run(tier.start_leased_run(leases, outs)) if start_finish
                      else tier.read_leased_run(leases, outs))
            assert failed and [e is None for e in errors] == [True, False, True, True]
            assert all(np.array_equal(out[0], blocks[k]) for i, (out, k) in enumerate(zip(outs, keys)) if i != 1)


def test_a_run_cut_short_by_a_truncated_file_fails_only_the_records_it_cut(tmp_path):
    with _leased_tier(tmp_path, 4, 64 << 10) as (tier, blocks, leases):
        last = leases[-1].loc
        os.truncate(leases[-1].file.path, last.offset + HEADER_BYTES + 1000)  # the last payload cut short
        outs = [[np.zeros(64 << 10, np.uint8)] for _ in blocks]
        errors = tier.read_leased_run(leases, outs)
        assert [e is None for e in errors] == [True, True, True, False] and isinstance(errors[3], CorruptBlock)
        assert all(np.array_equal(out[0], data) for out, data in list(zip(outs, blocks.values()))[:3])


class _FailedRead:
    """A queued read whose preadv failed (what :func:`record_io.submit` returns then)."""

    def done(self) -> bool:
        return True

    def wait(self) -> None:
        raise OSError(5, "injected EIO")


BIG = 3 * record_io.SCAN // 2  # a record read as pieces (over SCAN), but not one at a time (under STREAM_MIN)


@pytest.mark.skipif(not record_io.COMPILED, reason="no reader threads: runs are read when finished")
def test_a_batch_queues_the_pieces_of_its_big_records_and_fails_only_the_bad_ones(tmp_path, monkeypatch):
    """Records over SCAN are queued as their pieces when started (their reads overlap the
    hashing of the record before); a flipped byte and a file cut short each fail only
    their own record, an I/O error in one queued piece has its record read again on its
    own (whole here), and no piece is read after its finish."""
    with _leased_tier(tmp_path, 4, BIG) as (tier, blocks, leases):
        keys = list(blocks)
        outs = [[np.zeros(BIG, np.uint8)] for _ in keys]
        started = [tier.start_leased_run([lease], [out]) for lease, out in zip(leases, outs)]
        assert all(isinstance(job, record_io.InOrderRead) for _, _, job in started)
        assert [tier.finish_leased_run(s) for s in started] == [[None]] * 4
        assert all(np.array_equal(out[0], blocks[k]) for out, k in zip(outs, keys))

        flipped, failing, cut = (tier._index[k] for k in keys[1:])  # the last record in the file is cut short
        with open(tier._files[flipped.file_id].path, "r+b") as f:  # a byte in the flipped record's second piece
            f.seek(flipped.offset + HEADER_BYTES + record_io.SCAN + 5)
            f.write(bytes([blocks[keys[1]][record_io.SCAN + 5] ^ 0xFF]))
        os.truncate(leases[3].file.path, cut.offset + HEADER_BYTES + BIG - 1000)
        submit, failed = record_io.submit, []

        def eio_in_a_piece(fd, offset, iov, spans):  # the failing record's second piece: an I/O error
            if offset == failing.offset + record_io.SCAN:
                failed.append(offset)
                return _FailedRead()
            return submit(fd, offset, iov, spans)

        monkeypatch.setattr(record_io, "submit", eio_in_a_piece)
        outs = [[np.zeros(BIG, np.uint8)] for _ in keys]
        started = [tier.start_leased_run([lease], [out]) for lease, out in zip(leases, outs)]
        verdicts = [tier.finish_leased_run(s)[0] for s in started]
        assert failed and verdicts[0] is None and np.array_equal(outs[0][0], blocks[keys[0]])
        assert verdicts[2] is None and np.array_equal(outs[2][0], blocks[keys[2]])  # the queued piece's EIO
        assert isinstance(verdicts[1], CorruptBlock) and isinstance(verdicts[3], CorruptBlock)
        assert tier.counters["corrupt_reads"] == 2  # the flipped and the cut (an I/O error is no checksum failure)


@contextmanager
def _file_store(tmp_path, count: int) -> Iterator[tuple[CascadeStore, list, list[str]]]:
    """A store whose only tier is a buffered file tier, holding ``count`` blocks put in one batch."""
    cfg = Config(model="tiny", shm_bytes=0, file_dir=str(tmp_path / "f"), file_read_mode="buffered")
    with CascadeStore(cfg) as s:
        blocks = [(np.full(s.spec.shape, i, s.spec.np_dtype), np.full(s.spec.shape, -i, s.spec.np_dtype))
                  for i in range(count)]
        ids = s.put_many(blocks)
        s.flush()
        yield s, blocks, ids


def test_a_store_batch_of_file_tier_blocks_reads_back_to_back_records_in_runs(tmp_path, monkeypatch):
    with _file_store(tmp_path, 10) as (s, blocks, ids):
        runs = []
        start = s.tiers[0].start_leased_run
        monkeypatch.setattr(s.tiers[0], "start_leased_run", lambda leases, outs: runs.append(len(leases))
                            or start(leases, outs))
        outs = [s.spec.empty() for _ in ids]
        assert s.get_many_into(ids, outs, max_workers=1) == [True] * 10
        assert sum(runs) == 10 and len(runs) < 10
        assert all(np.array_equal(o[0], b[0]) and np.array_equal(o[1], b[1]) for o, b in zip(outs, blocks))
        st = s.stats()
        assert st["hits"] == 10 and st["tiers"]["file"]["hits"] == 10


def test_a_batch_starts_its_next_runs_before_it_counts_the_first(tmp_path, monkeypatch):
    """Queued runs: the batch leases its next blocks and starts their runs while the
    reader thread reads, and counts each run once it has landed."""
    monkeypatch.setattr("cascade.core.batch_reads.LEASE_CHUNK", 4)
    with _file_store(tmp_path, 12) as (s, blocks, ids):
        tier, events = s.tiers[0], []
        assert tier.reads_queued == record_io.COMPILED
        start, finish = tier.start_leased_run, tier.finish_leased_run
        monkeypatch.setattr(tier, "start_leased_run", lambda leases, outs: events.append("start") or start(leases, outs))
        monkeypatch.setattr(tier, "finish_leased_run", lambda started: events.append("finish") or finish(started))
        outs = [s.spec.empty() for _ in ids]
        assert s.get_many_into(ids, outs) == [True] * 12
        assert events == ["start"] * 3 + ["finish"] * 3  # one run per chunk of 4 leases, all started first
        assert all(np.array_equal(o[0], b[0]) and np.array_equal(o[1], b[1]) for o, b in zip(outs, blocks))
        assert s.stats()["tiers"]["file"]["hits"] == 12


def test_a_batch_leases_a_small_first_chunk_and_doubles_the_next_ones(tmp_path, monkeypatch):
    """The reader thread starts on a batch's first run after FIRST_LEASE_CHUNK leases, not
    LEASE_CHUNK: chunks double from there, up to LEASE_CHUNK (runs never span two)."""
    assert [len(c) for c in batch_reads._lease_chunks(range(3, 103))] == [8, 16, 32, 32, 12]
    assert [len(c) for c in batch_reads._lease_chunks(range(5, 5))] == []
    monkeypatch.setattr("cascade.core.batch_reads.LEASE_CHUNK", 4)
    monkeypatch.setattr("cascade.core.batch_reads.FIRST_LEASE_CHUNK", 1)
    with _file_store(tmp_path, 12) as (s, blocks, ids):
        tier, runs = s.tiers[0], []
        start = tier.start_leased_run if tier.reads_queued else tier.read_leased_run
        monkeypatch.setattr(tier, start.__name__, lambda leases, outs: runs.append(len(leases)) or start(leases, outs))
        outs = [s.spec.empty() for _ in ids]
        assert s.get_many_into(ids, outs) == [True] * 12
        assert runs == [1, 2, 4, 4, 1]
        assert all(np.array_equal(o[0], b[0]) and np.array_equal(o[1], b[1]) for o, b in zip(outs, blocks))


@pytest.mark.skipif(not record_io.COMPILED, reason="no reader threads: runs are read when finished")
def test_a_batch_counts_its_oldest_runs_once_too_many_bytes_are_queued(tmp_path, monkeypatch):
    """Past QUEUED_AHEAD_BYTES of queued runs not counted, the batch counts the oldest
    before it leases more (a big batch never has the kernel fetch all of it at once)."""
    monkeypatch.setattr("cascade.core.batch_reads.LEASE_CHUNK", 4)
    with _file_store(tmp_path, 16) as (s, blocks, ids):
        monkeypatch.setattr("cascade.core.batch_reads.QUEUED_AHEAD_BYTES", 4 * s.spec.block_bytes)
        tier, events = s.tiers[0], []
        start, finish = tier.start_leased_run, tier.finish_leased_run
        monkeypatch.setattr(tier, "start_leased_run", lambda leases, outs: events.append("start") or start(leases, outs))
        monkeypatch.setattr(tier, "finish_leased_run", lambda started: events.append("finish") or finish(started))
        outs = [s.spec.empty() for _ in ids]
        assert s.get_many_into(ids, outs) == [True] * 16
        assert events == ["start", "start", "finish", "start", "finish", "start", "finish", "finish"]
        assert all(np.array_equal(o[0], b[0]) and np.array_equal(o[1], b[1]) for o, b in zip(outs, blocks))
        assert s.stats()["tiers"]["file"]["hits"] == 16


@pytest.mark.parametrize("ahead", ["all", "one run"])
@pytest.mark.parametrize("fails", ["start", "finish"])
def test_a_batch_whose_queued_run_fails_waits_for_every_other_and_ends_every_lease(tmp_path, monkeypatch, fails,
                                                                                    ahead):
    """With ``one run`` queued ahead, the second run's count comes while the third is
    being leased and started: a failure there ends the same way."""
    monkeypatch.setattr("cascade.core.batch_reads.LEASE_CHUNK", 4)
    with _file_store(tmp_path, 12) as (s, blocks, ids):
        if ahead == "one run":
            monkeypatch.setattr("cascade.core.batch_reads.QUEUED_AHEAD_BYTES", 4 * s.spec.block_bytes)
        tier, waited = s.tiers[0], []
        start, finish = tier.start_leased_run, tier.finish_leased_run
        calls = {"start": 0, "finish": 0}

        def failing(name, call):
            def run(*args):
                calls[name] += 1
                if name == fails and calls[name] == 2:  # the second run
                    raise RuntimeError("injected")
                if name == "finish":
                    waited.append(args[0])
                return call(*args)
            return run

        monkeypatch.setattr(tier, "start_leased_run", failing("start", start))
        monkeypatch.setattr(tier, "finish_leased_run", failing("finish", finish))
        with pytest.raises(RuntimeError, match="injected"):
            s.get_many_into(ids, [s.spec.empty() for _ in ids])
        assert len(waited) == (1 if fails == "start" else 3)  # every run started was waited for
        record_io.wait_idle()
        st = s.stats()
        assert st["gets"] == (8 if fails == "start" else 12) and st["hits"] + st["misses"] == st["gets"]
        assert all(f.users == 0 for f in tier._files.values())  # every lease ended
        assert all(s._index.get(("default", b)).readers == 0 for b in ids)
        monkeypatch.undo()
        outs = [s.spec.empty() for _ in ids]
        assert s.get_many_into(ids, outs) == [True] * 12
        assert all(np.array_equal(o[0], b[0]) and np.array_equal(o[1], b[1]) for o, b in zip(outs, blocks))


def test_a_batch_sharing_one_output_among_its_blocks_is_refused_and_drops_nothing(tmp_path):
    # one output pair for every block: each read would land over the last (a record
    # then failed its checksum, or a promotion copied another block's bytes): refused
    with _file_store(tmp_path, 6) as (s, blocks, ids):
        shared = s.spec.empty()
        with pytest.raises(InvalidBlock, match="overlap"):
            s.get_many_into(ids, [shared] * len(ids), max_workers=1)
        st = s.stats()
        assert st["tiers"]["file"]["corruptions"] == 0 and len(s) == 6 and st["gets"] == 0
        assert s.get_many_into(ids, [s.spec.empty() for _ in ids]) == [True] * 6


def test_a_batch_of_big_records_sharing_one_output_is_refused_and_drops_nothing(tmp_path):
    """Big records' pieces are queued ahead of their hashing: a later record's read would
    land in an output shared with the record being hashed. Outputs that overlap are
    refused before anything is read; distinct ones read every record."""
    cfg = Config(shm_bytes=0, remote_bytes=0, file_dir=str(tmp_path / "f"), file_read_mode="buffered")
    with CascadeStore(cfg, block_spec=BlockSpec.flat(2 * BIG)) as s:
        blocks = [(np.full(s.spec.shape, i, s.spec.np_dtype), np.full(s.spec.shape, 100 + i, s.spec.np_dtype))
                  for i in range(4)]
        ids = s.put_many(blocks)
        s.flush()
        shared = s.spec.empty()
        with pytest.raises(InvalidBlock, match="overlap"):
            s.get_many_into(ids, [shared] * len(ids), max_workers=1)
        outs = [s.spec.empty() for _ in ids]
        assert s.get_many_into(ids, outs, max_workers=1) == [True] * 4
        assert all(np.array_equal(o[0], b[0]) and np.array_equal(o[1], b[1]) for o, b in zip(outs, blocks))
        st = s.stats()
        assert st["tiers"]["file"]["corruptions"] == 0 and len(s) == 4 and st["hits"] == 4


def test_a_direct_tier_refused_o_direct_reads_buffered_and_queues_its_runs(tmp_path, monkeypatch):
    """Where the file system refuses O_DIRECT (tmpfs, some FUSE), the tier falls back to
    buffered reads at its first read, and from then on a batch's runs go to the reader
    thread as in a buffered tier."""
    cfg = Config(model="tiny", shm_bytes=0, file_dir=str(tmp_path / "f"), file_read_mode="direct")
    with CascadeStore(cfg) as s:
        tier = s.tiers[0]
        blocks = [(np.full(s.spec.shape, i, s.spec.np_dtype), np.full(s.spec.shape, -i, s.spec.np_dtype))
                  for i in range(6)]
        ids = s.put_many(blocks)
        s.flush()
        assert not tier.reads_queued

        def refuse(path, flags, *args, **kwargs):
            raise OSError(22, "O_DIRECT refused", path)

        monkeypatch.setattr("cascade.tiers.file_reads.open_own", refuse)
        outs = [s.spec.empty() for _ in ids]
        assert s.get_into(ids[0], *outs[0])
        assert tier.read_mode == "buffered" and tier.reads_queued == record_io.COMPILED
        assert s.get_many_into(ids, outs) == [True] * 6
        assert all(np.array_equal(o[0], b[0]) and np.array_equal(o[1], b[1]) for o, b in zip(outs, blocks))


def test_a_get_of_a_record_in_the_page_cache_reads_it_outside_the_lock(tmp_path, monkeypatch):
    """No file read runs under the store's lock, not even of a record in the page cache
    (a read there can still wait for the disk): while a get's read waits, another thread
    takes the lock, gets and puts; the get then ends with the block's bytes, counted once."""
    with _file_store(tmp_path, 2) as (s, blocks, ids):
        reading, go, real = threading.Event(), threading.Event(), record_io.preadv_hashed

        def held(*args):  # the first read waits until the other thread is done
            monkeypatch.setattr(record_io, "preadv_hashed", real)
            reading.set()
            assert go.wait(10)
            return real(*args)

        monkeypatch.setattr(record_io, "preadv_hashed", held)
        out, got = s.spec.empty(), []
        reader = threading.Thread(target=lambda: got.append(s.get_into(ids[0], *out)))
        reader.start()
        try:
            assert reading.wait(10)
            assert s._lock.acquire(timeout=5)
            s._lock.release()
            other = s.spec.empty()
            assert s.get_into(ids[1], *other) and np.array_equal(other[1], blocks[1][1])
            fresh = (np.full(s.spec.shape, 7, s.spec.np_dtype), np.full(s.spec.shape, 8, s.spec.np_dtype))
            assert s.contains(s.put(*fresh))
        finally:
            go.set()
            reader.join(10)
        assert got == [True] and np.array_equal(out[0], blocks[0][0]) and np.array_equal(out[1], blocks[0][1])
        st = s.stats()
        assert st["gets"] == st["hits"] == st["tiers"]["file"]["hits"] == 2


def test_a_batch_of_records_in_the_page_cache_reads_them_outside_the_lock(tmp_path, monkeypatch):
    """A batch's records in the page cache go as leased runs too, read outside the store's
    lock: while the batch waits for a run, another thread takes the lock at once."""
    with _file_store(tmp_path, 6) as (s, blocks, ids):
        tier, free = s.tiers[0], []
        runs, finish = _leased_keys_spied(tier, monkeypatch), tier.finish_leased_run

        def checked(started):  # the lock is free to others while the batch finishes a run
            taken = []
            other = threading.Thread(target=lambda: taken.append(s._lock.acquire(timeout=5) and s._lock.release() is None))
            other.start()
            other.join()
            free.append(taken == [True])
            return finish(started)

        monkeypatch.setattr(tier, "finish_leased_run", checked)
        outs = [s.spec.empty() for _ in ids]
        assert s.get_many_into(ids, outs) == [True] * 6
        assert free and all(free) and sorted(k for run in runs for k in run) == sorted(ids)
        assert all(np.array_equal(o[0], b[0]) and np.array_equal(o[1], b[1]) for o, b in zip(outs, blocks))
        assert s.stats()["tiers"]["file"]["hits"] == 6


def _leased_keys_spied(tier, monkeypatch) -> list[list[str]]:
    """The block ids of each run ``tier`` reads leased (queued or not), in order."""
    runs = []
    for name in ("start_leased_run", "read_leased_run"):
        real = getattr(tier, name)
        monkeypatch.setattr(tier, name, lambda leases, outs, real=real:
                            runs.append([lease.key[1] for lease in leases]) or real(leases, outs))
    return runs


def _advice_spied(monkeypatch) -> list[tuple[int, int, int]]:
    """The (fd, offset, length) of each POSIX_FADV_WILLNEED the file tier gives, in order."""
    calls = []
    monkeypatch.setattr(file_reads, "_FADVISE", lambda fd, offset, length, advice:
                        calls.append((fd, offset, length)) if advice == os.POSIX_FADV_WILLNEED else None)
    return calls


def _run_lengths_spied(tier, monkeypatch) -> list[int]:
    """The number of records in each run ``tier.read_runs`` cuts, in order."""
    real, runs = tier.read_runs, []

    def spied(leases, streams):
        cut = real(leases, streams)
        runs.extend(map(len, cut))
        return cut

    monkeypatch.setattr(tier, "read_runs", spied)
    return runs


def _span(leases) -> tuple[int, int]:
    """Where the back-to-back records of ``leases`` start, and their bytes in all."""
    return leases[0].loc.offset, leases[-1].loc.offset + leases[-1].loc.record_bytes - leases[0].loc.offset


def test_a_batch_advises_the_kernel_of_each_stretch_of_its_small_records(tmp_path, monkeypatch):
    """will_read: one WILLNEED per stretch of back-to-back records, up to ADVISE_BYTES in
    all; nothing under ADVISE_MIN, for records over RUN_BYTES or in O_DIRECT mode."""
    with _leased_tier(tmp_path, 20, 64 << 10) as (tier, _, leases):
        calls, fd = _advice_spied(monkeypatch), leases[0].file.fd
        monkeypatch.setattr(file_reads, "ADVISE_MIN", 4 * leases[0].loc.record_bytes)
        tier.will_read(leases)
        assert calls == [(fd, *_span(leases))]
        calls.clear()
        tier.will_read(leases[:5] + leases[6:])  # block 5 skipped: a gap
        assert calls == [(fd, *_span(leases[:5])), (fd, *_span(leases[6:]))]
        calls.clear()
        monkeypatch.setattr(file_reads, "ADVISE_BYTES", 5 * leases[0].loc.record_bytes)
        tier.will_read(leases)
        assert calls == [(fd, *_span(leases[:5]))]
        calls.clear()
        tier.will_read(leases[:3])  # under ADVISE_MIN: the kernel's readahead alone
        run_bytes = file_reads.RUN_BYTES
        monkeypatch.setattr(file_reads, "RUN_BYTES", leases[0].loc.record_bytes - 1)
        tier.will_read(leases)
        monkeypatch.setattr(file_reads, "RUN_BYTES", run_bytes)
        monkeypatch.setattr(tier, "_odirect", True)
        tier.will_read(leases)
        assert calls == []


def test_a_batch_advises_a_stream_over_its_start_and_reads_on_in_longer_runs(tmp_path, monkeypatch):
    """With a batch's ``streams``, kept across calls: read_runs extends a stream of
    back-to-back records and cuts runs of RUN_BYTES over its first STREAM_START_BYTES,
    of STREAM_RUN_BYTES past them; will_read advises a stream over its start only. A gap
    starts a new stream."""
    with _leased_tier(tmp_path, 20, 64 << 10) as (tier, _, leases):
        calls, fd, record = _advice_spied(monkeypatch), leases[0].file.fd, leases[0].loc.record_bytes
        monkeypatch.setattr(file_reads, "ADVISE_MIN", 1)
        monkeypatch.setattr(file_reads, "RUN_BYTES", record)
        monkeypatch.setattr(file_reads, "STREAM_START_BYTES", 5 * record)
        monkeypatch.setattr(file_reads, "STREAM_RUN_BYTES", 3 * record)
        streams: dict = {}
        runs = []
        for part in (leases[:3], leases[3:6], leases[6:9]):
            runs.append(tier.read_runs(part, streams))
            tier.will_read(part, streams)
        assert runs == [[range(0, 1), range(1, 2), range(2, 3)], [range(0, 1), range(1, 2), range(2, 3)],
                        [range(0, 3)]]  # runs from the 6th record (past 5) on span 3
        assert calls == [(fd, *_span(leases[:3])), (fd, _span(leases[3:5])[0], 2 * record)]
        calls.clear()
        assert tier.read_runs(leases[10:13], streams) == [range(i, i + 1) for i in range(3)]  # block 9 skipped
        tier.will_read(leases[10:13], streams)
        start = leases[10].loc.offset  # (in the page cache: no slow start)
        end = leases[12].loc.offset + record
        assert calls == [(fd, *_span(leases[10:13]))] and streams == {fd: (start, end, start, end)}
        calls.clear()
        assert tier.read_runs(leases[13:20]) == [range(i, i + 1) for i in range(7)]  # no streams
        tier.will_read(leases[13:20])
        assert calls == [(fd, *_span(leases[13:20]))]


def test_a_stream_left_to_the_kernels_readahead_at_its_start_is_not_advised_later(tmp_path, monkeypatch):
    """will_read with a batch's streams advises a stream only on from where its advice
    ends: a stretch under ADVISE_MIN at its start leaves the rest unadvised; a new stream
    (after a gap) is advised again."""
    with _leased_tier(tmp_path, 20, 64 << 10) as (tier, _, leases):
        calls, fd = _advice_spied(monkeypatch), leases[0].file.fd
        monkeypatch.setattr(file_reads, "ADVISE_MIN", 4 * leases[0].loc.record_bytes)
        streams: dict = {}
        for part in (leases[:2], leases[2:8], leases[8:14]):
            tier.read_runs(part, streams)
            tier.will_read(part, streams)
        assert calls == []
        part = leases[15:20]  # block 14 skipped: a new stream
        tier.read_runs(part, streams)
        tier.will_read(part, streams)
        assert calls == [(fd, *_span(part))] and streams[fd][3] == part[-1].loc.offset + part[-1].loc.record_bytes
        assert tier._last_streams[fd] == streams[fd]  # a next batch goes on with the advice given


def test_an_advice_the_kernel_refuses_leaves_the_batch_as_it_was(tmp_path, monkeypatch):
    with _leased_tier(tmp_path, 20, 64 << 10) as (tier, blocks, leases):
        def refused(*args):
            raise OSError(22, "Invalid argument")

        monkeypatch.setattr(file_reads, "_FADVISE", refused)
        tier.will_read(leases)
        outs = [[np.zeros(64 << 10, np.uint8)] for _ in blocks]
        assert tier.read_leased_run(leases, outs) == [None] * 20
        assert all(np.array_equal(out[0], data) for out, data in zip(outs, blocks.values()))


def test_a_store_batch_advises_the_kernel_before_it_reads_its_cold_records(tmp_path, monkeypatch):
    """A batch get's leased file-tier blocks are advised (each leased chunk before its
    runs start), and read back exactly."""
    monkeypatch.setattr("cascade.core.batch_reads.LEASE_CHUNK", 4)
    monkeypatch.setattr(file_reads, "ADVISE_MIN", 1)
    with _file_store(tmp_path, 10) as (s, blocks, ids):
        tier, calls, runs = s.tiers[0], _advice_spied(monkeypatch), []  # runs: (advices given, blocks) as each starts
        for name in ("start_leased_run", "read_leased_run"):
            real = getattr(tier, name)
            monkeypatch.setattr(tier, name, lambda leases, outs, real=real:
                                runs.append((len(calls), len(leases))) or real(leases, outs))
        outs = [s.spec.empty() for _ in ids]
        assert s.get_many_into(ids, outs) == [True] * 10
        assert all(np.array_equal(o[0], b[0]) and np.array_equal(o[1], b[1]) for o, b in zip(outs, blocks))
        locs = [tier._index[("default", b)] for b in ids]
        advised = sorted((offset, offset + length) for _, offset, length in calls)
        assert advised[0][0] == locs[0].offset and advised[-1][1] == locs[-1].offset + locs[-1].record_bytes
        assert sum(end - start for start, end in advised) == sum(loc.record_bytes for loc in locs)
        assert len(calls) == 3 and runs[0][0] == 1  # chunks of 4, 4 and 2, each advised before its runs start
        assert sum(n for _, n in runs) == 10


def test_a_long_store_batch_advises_its_stream_over_its_start_and_reads_on_in_longer_runs(tmp_path, monkeypatch):
    """A batch get of blocks written back to back advises its leased chunks until
    STREAM_START_BYTES of the stream are advised, across chunks, reads the rest in runs
    of STREAM_RUN_BYTES, and reads all exactly."""
    monkeypatch.setattr("cascade.core.batch_reads.LEASE_CHUNK", 4)
    monkeypatch.setattr(file_reads, "ADVISE_MIN", 1)
    with _file_store(tmp_path, 10) as (s, blocks, ids):
        tier, calls = s.tiers[0], _advice_spied(monkeypatch)
        locs = [tier._index[("default", b)] for b in ids]
        assert all(a.offset + a.record_bytes == b.offset for a, b in zip(locs, locs[1:]))  # one stream
        monkeypatch.setattr(file_reads, "RUN_BYTES", locs[0].record_bytes)
        monkeypatch.setattr(file_reads, "STREAM_START_BYTES", 3 * locs[0].record_bytes)
        monkeypatch.setattr(file_reads, "STREAM_RUN_BYTES", 4 * locs[0].record_bytes)
        runs = _run_lengths_spied(tier, monkeypatch)
        outs = [s.spec.empty() for _ in ids]
        assert s.get_many_into(ids, outs) == [True] * 10
        assert all(np.array_equal(o[0], b[0]) and np.array_equal(o[1], b[1]) for o, b in zip(outs, blocks))
        assert [(offset, length) for _, offset, length in calls] == [(locs[0].offset, 3 * locs[0].record_bytes)]
        assert runs == [1, 1, 1, 1, 4, 2]  # chunks of 4: from the 4th record on, past the stream's start


def test_a_file_removed_takes_the_last_stream_read_in_it_along(tmp_path):
    """A removed file's descriptor number may come back for another file, which must not
    go on with the removed one's stream (Reads._go_on)."""
    tier = FileTier(64 << 20, str(tmp_path / "f"), read_mode="buffered", segment_bytes=1 << 20)
    try:
        keys = [("ns", f"{i:032x}") for i in range(300)]
        for k in keys:
            tier.put(k, [np.full(4096, 1, np.uint8)])
        tier.sync()
        leases = [tier.lease(k) for k in keys[:3]]
        file = leases[0].file
        tier.read_runs(leases, {})
        for lease in leases:
            tier.release(lease)
        assert file.fd in tier._last_streams
        for k in keys:
            del tier[k]
        while tier.compact_next():
            pass
        assert not os.path.exists(file.path) and file.fd not in tier._last_streams
    finally:
        tier.close()


def _drop_page_cache(tier) -> None:
    """Evict the file tier's files from the page cache (benchmark.machine.drop_page_cache);
    skip the test where they stay resident (tmpfs keeps its pages)."""
    from benchmark.machine import drop_page_cache

    if drop_page_cache([f.path for f in tier._files.values()])["resident_fraction_after"] > 0:
        pytest.skip("the page cache keeps the tier's pages here (no drop)")


def test_a_batch_that_starts_where_the_last_stopped_goes_on_with_its_stream(tmp_path, monkeypatch):
    """A get_many_into that starts where the last batch in the file stopped, what that one
    read last still in the page cache, goes on with its stream: no advice past the stream's
    start, runs of STREAM_RUN_BYTES, as one call over all the blocks would read them. One
    that starts elsewhere, or after a drop of the page cache, starts a stream of its own."""
    monkeypatch.setattr("cascade.core.batch_reads.LEASE_CHUNK", 4)
    monkeypatch.setattr(file_reads, "ADVISE_MIN", 1)
    with _file_store(tmp_path, 10) as (s, blocks, ids):
        tier = s.tiers[0]
        locs = [tier._index[("default", b)] for b in ids]
        assert all(a.offset + a.record_bytes == b.offset for a, b in zip(locs, locs[1:]))  # one stream
        record = locs[0].record_bytes
        monkeypatch.setattr(file_reads, "RUN_BYTES", record)
        monkeypatch.setattr(file_reads, "STREAM_START_BYTES", 3 * record)
        monkeypatch.setattr(file_reads, "STREAM_RUN_BYTES", 4 * record)
        monkeypatch.setattr(file_reads, "SLOW_START_BYTES", 3 * record)  # (the slow start cuts as RUN_BYTES does here)
        monkeypatch.setattr(file_reads, "SLOW_RUN_BYTES", record)
        runs = _run_lengths_spied(tier, monkeypatch)
        outs = [s.spec.empty() for _ in ids]

        def read(lo: int, hi: int) -> None:
            for out in outs[lo:hi]:
                out[0].fill(0)
                out[1].fill(0)
            assert s.get_many_into(ids[lo:hi], outs[lo:hi]) == [True] * (hi - lo)
            assert all(np.array_equal(o[0], b[0]) and np.array_equal(o[1], b[1])
                       for o, b in zip(outs[lo:hi], blocks[lo:hi]))

        _drop_page_cache(tier)
        calls = _advice_spied(monkeypatch)
        read(0, 3)
        read(3, 10)
        assert [(offset, length) for _, offset, length in calls] == [(locs[0].offset, 3 * record)]
        assert runs == [1, 1, 1, 4, 3]  # the second call's chunks of 4 and 3: past the stream's start
        calls.clear()
        runs.clear()
        read(0, 3)  # not where the last batch stopped: a stream of its own
        _drop_page_cache(tier)
        read(3, 10)  # where it stopped, but its pages are gone: a stream of its own
        assert [(offset, length) for _, offset, length in calls] == [(locs[0].offset, 3 * record),
                                                                    (locs[3].offset, 3 * record)]
        assert runs == [1, 1, 1, 1, 1, 1, 1, 3]


def test_cached_pages_counts_a_files_pages_in_the_page_cache_and_reads_none(tmp_path):
    """record_io.cached_pages (cachestat(2)): the pages of a byte range in the page cache,
    without starting a read (a read would set off the kernel's readahead); an error for a
    descriptor that is not open; None where the kernel cannot tell (skipped)."""
    with _leased_tier(tmp_path, 8, 8 << 10) as (tier, _, leases):
        fd, size = leases[0].file.fd, leases[-1].loc.offset + leases[-1].loc.record_bytes
        if record_io.cached_pages(fd, 0, size) is None:
            pytest.skip("the kernel cannot tell (no cachestat(2), or not for this file system)")
        assert record_io.cached_pages(fd, 0, size) == size // PAGE  # just written: all cached
        assert record_io.cached_pages(fd, 0, 0) == 0
        _drop_page_cache(tier)
        assert record_io.cached_pages(fd, 0, PAGE) == 0
        assert record_io.cached_pages(fd, 0, size) == 0  # the call before read nothing
        os.pread(fd, PAGE, 0)
        assert record_io.cached_pages(fd, 0, PAGE) == 1
        with pytest.raises(OSError):
            record_io.cached_pages(-1, 0, PAGE)


def test_a_stream_that_starts_out_of_the_page_cache_is_read_in_short_runs_first(tmp_path, monkeypatch):
    """read_runs slow-starts a batch's stream of records of up to SLOW_RUN_BYTES whose first
    page is not in the page cache: runs of up to SLOW_RUN_BYTES over its first
    SLOW_START_BYTES (across calls), RUN_BYTES after them. A stream whose first page is
    cached, of bigger records, in O_DIRECT mode or where the kernel cannot tell (or asking
    it fails) is cut as before; the runs read back exactly."""
    with _leased_tier(tmp_path, 8, 8 << 10) as (tier, blocks, leases):
        fd, record = leases[0].file.fd, leases[0].loc.record_bytes
        if record_io.cached_pages(fd, 0, PAGE) is None:
            pytest.skip("the kernel cannot tell (no cachestat(2), or not for this file system)")
        monkeypatch.setattr(file_reads, "SLOW_START_BYTES", 3 * record)
        monkeypatch.setattr(file_reads, "SLOW_RUN_BYTES", record)
        assert tier.read_runs(leases, {}) == [range(0, 8)]  # cached: one run
        _drop_page_cache(tier)
        streams: dict = {}
        runs = [tier.read_runs(leases[:5], streams), tier.read_runs(leases[5:], streams)]
        assert runs == [[range(0, 1), range(1, 2), range(2, 3), range(3, 5)], [range(0, 3)]]
        start = leases[0].loc.offset
        assert streams == {fd: (start, leases[-1].loc.offset + record, start + 3 * record, start)}  # (not advised)
        assert record_io.cached_pages(fd, 0, 8 * record) == 0  # the probe read nothing
        monkeypatch.setattr(file_reads, "SLOW_RUN_BYTES", record - 1)
        assert tier.read_runs(leases, {}) == [range(0, 8)]  # records over SLOW_RUN_BYTES: as before
        monkeypatch.setattr(file_reads, "SLOW_RUN_BYTES", record)
        monkeypatch.setattr(record_io, "cached_pages", lambda fd, offset, length: None)
        assert tier.read_runs(leases, {}) == [range(0, 8)]  # the kernel cannot tell: as before
        monkeypatch.setattr(record_io, "cached_pages", lambda fd, offset, length: os.pread(-1, 1, 0))
        assert tier.read_runs(leases, {}) == [range(0, 8)]  # nor where asking it fails
        monkeypatch.undo()
        monkeypatch.setattr(tier, "_odirect", True)
        assert tier.read_runs(leases, {}) == [range(i, i + 1) for i in range(8)]
        monkeypatch.setattr(tier, "_odirect", False)
        outs = [[np.zeros(8 << 10, np.uint8)] for _ in blocks]
        for run in runs[0]:
            assert tier.finish_leased_run(tier.start_leased_run(leases[run.start:run.stop], outs[run.start:run.stop])) \
                == [None] * len(run)
        assert all(np.array_equal(out[0], data) for out, data in zip(outs[:5], blocks.values()))
