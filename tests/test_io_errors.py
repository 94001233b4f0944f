"""I/O errors of the file tier that say nothing about the bytes or the room: a read that
fails is a counted miss and the block stays (a later read serves it), a compaction whose
copy cannot read is put off, a put whose write fails is a TierWriteError (a TierFull that
counts no full event), a source file that cannot be unlinked is left for a restart to
resolve with its descriptors closed; a file cut inside a header counts a torn record."""
from __future__ import annotations

import errno
import os
import threading

import numpy as np
import pytest

from cascade import BlockSpec, CascadeStore, Config, TierFull, TierWriteError
from cascade.tiers import record_io
from cascade.tiers.records import HEADER_BYTES

SPEC = BlockSpec.flat(64 << 10)
RECORD = HEADER_BYTES + SPEC.block_bytes


def config(tmp_path, **options) -> Config:
    base = dict(shm_bytes=0, remote_bytes=0, file_bytes=64 << 20, file_dir=str(tmp_path / "f"),
                file_read_mode="buffered")
    return Config(**{**base, **options})


def ident(i: int) -> str:
    return f"{i + 1:032x}"


def block(i: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(i)
    return (rng.integers(0, 256, SPEC.shape, dtype=np.uint8), rng.integers(0, 256, SPEC.shape, dtype=np.uint8))


def served(store: CascadeStore, i: int) -> bool:
    """Whether block ``i`` is a hit with its own bytes (a miss: False; wrong bytes fail)."""
    outs = SPEC.empty()
    if not store.get_into(ident(i), *outs):
        return False
    assert all(np.array_equal(o, b) for o, b in zip(outs, block(i))), f"block {i} served wrong bytes"
    return True


def eio() -> OSError:
    return OSError(errno.EIO, os.strerror(errno.EIO))


def fail_reads(monkeypatch, fails) -> list[int]:
    """Every file-tier read (queued ones read now) raises EIO while ``fails(offset, iov)``
    says so; the offsets of the reads that failed."""
    read, failed = record_io.preadv_hashed, []

    def preadv_hashed(fd, offset, iov, spans):
        if fails(offset, iov):
            failed.append(offset)
            raise eio()
        return read(fd, offset, iov, spans)

    monkeypatch.setattr(record_io, "preadv_hashed", preadv_hashed)
    monkeypatch.setattr(record_io, "submit", record_io.submit_python)
    return failed


def test_a_read_failing_with_an_io_error_is_a_counted_miss_and_the_block_stays(tmp_path, monkeypatch):
    with CascadeStore(config(tmp_path), block_spec=SPEC) as store:
        for i in range(4):
            store.put(*block(i), block_id=ident(i))
        once = [True]
        failed = fail_reads(monkeypatch, lambda offset, iov: once and once.pop())
        assert not served(store, 1) and failed  # the read failed: a miss
        file = store.stats()["tiers"]["file"]
        assert (file["read_errors"], file["corruptions"], file["corrupt_reads"]) == (1, 0, 0)
        assert store.contains(ident(1)) and served(store, 1)  # kept: the next read serves it
    with CascadeStore(config(tmp_path), block_spec=SPEC) as store:  # and so does a restart
        assert all(served(store, i) for i in range(4))


def test_a_batch_read_failing_for_one_record_misses_only_that_one_and_keeps_it(tmp_path, monkeypatch):
    with CascadeStore(config(tmp_path), block_spec=SPEC) as store:
        ids = [ident(i) for i in range(4)]
        store.put_many([block(i) for i in range(4)], block_ids=ids)
        bad = store.tiers[0].record_span(("default", ids[2]))[1] - HEADER_BYTES  # the record's first byte
        armed = [True]

        def covers_bad(offset, iov):  # any read of a stretch holding record 2 (the joined run, then its own)
            return armed[0] and offset <= bad < offset + sum(memoryview(b).nbytes for b in iov)

        failed = fail_reads(monkeypatch, covers_bad)
        outs = [SPEC.empty() for _ in ids]
        assert store.get_many_into(ids, outs) == [True, True, False, True] and failed
        assert all(np.array_equal(outs[i][0], block(i)[0]) for i in (0, 1, 3))
        file = store.stats()["tiers"]["file"]
        assert (file["read_errors"], file["corruptions"]) == (1, 0)
        armed[0] = False
        outs = [SPEC.empty() for _ in ids]
        assert store.get_many_into(ids, outs) == [True] * 4
        assert all(np.array_equal(o[1], block(i)[1]) for i, o in enumerate(outs))


def test_a_compaction_whose_copy_cannot_read_is_put_off_and_loses_nothing(tmp_path, monkeypatch):
    cfg = config(tmp_path, file_bytes=32 * RECORD)
    kept = [i for i in range(24) if i % 4 == 0]
    with CascadeStore(cfg, block_spec=SPEC) as store:
        for i in range(24):
            store.put(*block(i), block_id=ident(i))
        store.flush()
        once = [True]
        failed = fail_reads(monkeypatch, lambda offset, iov: threading.current_thread().name == "cascade-housekeeper"
                            and once and once.pop())
        for i in range(24):
            if i not in kept:
                store.delete(ident(i))
        store.flush()  # waits for the housekeeper's compactions
        assert failed, "no compaction read a record"
        file = store.stats()["tiers"]["file"]
        assert file["compactions_deferred"] >= 1 and (file["corruptions"], file["corrupt_reads"]) == (0, 0)
        assert [served(store, i) for i in range(24)] == [i in kept for i in range(24)]
    monkeypatch.undo()
    with CascadeStore(cfg, block_spec=SPEC) as store:
        assert [served(store, i) for i in range(24)] == [i in kept for i in range(24)]


@pytest.mark.parametrize("code, error, full_events", [(errno.EIO, TierWriteError, 0), (errno.ENOSPC, TierFull, 1)])
def test_a_put_whose_write_fails_says_whether_room_was_lacking(tmp_path, monkeypatch, code, error, full_events):
    with CascadeStore(config(tmp_path), block_spec=SPEC) as store:
        monkeypatch.setattr(os, "pwritev", lambda *a: (_ for _ in ()).throw(OSError(code, os.strerror(code))))
        with pytest.raises(error) as raised:
            store.put(*block(0), block_id=ident(0))
        assert type(raised.value) is error and isinstance(raised.value, TierFull)  # "not cached" either way
        assert os.strerror(code) in str(raised.value)
        monkeypatch.undo()
        st = store.stats()
        assert st["rejected"] == 1 and st["tiers"]["file"]["full_events"] == full_events
        assert not store.contains(ident(0))
        store.put(*block(0), block_id=ident(0))
        assert served(store, 0)


def _segment_fds() -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.endswith(".bin"):
            found.append(target)
    return found


def test_a_compacted_file_that_cannot_be_unlinked_is_left_for_a_restart(tmp_path, monkeypatch):
    cfg = config(tmp_path, file_bytes=32 * RECORD)
    kept = [i for i in range(24) if i % 4 == 0]
    unlink, refused = os.unlink, []

    def failing_unlink(path, *args, **kwargs):
        if threading.current_thread().name == "cascade-housekeeper" and str(path).endswith(".bin") and not refused:
            refused.append(path)
            raise eio()
        return unlink(path, *args, **kwargs)

    with CascadeStore(cfg, block_spec=SPEC) as store:
        for i in range(24):
            store.put(*block(i), block_id=ident(i))
        store.flush()
        monkeypatch.setattr(os, "unlink", failing_unlink)
        for i in range(24):
            if i not in kept:
                store.delete(ident(i))
        store.flush()
        monkeypatch.undo()
        assert refused and os.path.exists(refused[0])
        file = store.stats()["tiers"]["file"]
        assert file["unlink_errors"] == 1 and file["compactions"] >= 1
        assert [served(store, i) for i in range(24)] == [i in kept for i in range(24)]
    assert not [p for p in _segment_fds() if p.startswith(str(tmp_path))]  # every descriptor closed
    with CascadeStore(cfg, block_spec=SPEC) as store:  # as after a crash before the unlink
        assert [served(store, i) for i in range(24)] == [i in kept for i in range(24)]


def test_a_file_cut_inside_a_header_counts_a_torn_record(tmp_path):
    with CascadeStore(config(tmp_path), block_spec=SPEC) as store:
        for i in range(4):
            store.put(*block(i), block_id=ident(i))
        path, start, _, _ = store.tiers[0].record_span(("default", ident(2)))
    os.truncate(path, start - HEADER_BYTES + 100)  # record 2's header cut short
    with CascadeStore(config(tmp_path), block_spec=SPEC) as store:
        assert store.stats()["tiers"]["file"]["torn_records"] == 1
        assert [served(store, i) for i in range(4)] == [True, True, False, False]


def test_an_adoption_meeting_an_io_error_keeps_the_old_files_and_the_next_start_finishes_it(tmp_path, monkeypatch):
    from cascade.core.factory import open_file_tier
    from cascade.tiers.adoption import adopt_orphans, ranks_with_files

    cfg = config(tmp_path)
    keys = [("default", ident(i)) for i in range(4)]
    old = open_file_tier(cfg, 1)  # a rank of a bigger job, gone at the restart
    for i, key in enumerate(keys):
        old.put(key, [b.reshape(-1) for b in block(i)], parent=keys[i - 1][1] if i else None)
    old.close()

    def adopt() -> tuple:
        own = open_file_tier(cfg, 0)
        try:
            report = adopt_orphans(own, 1, lambda o: open_file_tier(cfg, o, capacity=1 << 62))
            return report, sorted(k for k in keys if k in own), {k: own.parent_of(k) for k in keys if k in own}
        finally:
            own.close()

    once = [True]
    failed = fail_reads(monkeypatch, lambda offset, iov: once and once.pop())
    report, held, _ = adopt()
    assert failed and (report.blocks, report.deferred, report.corrupt, report.dropped) == (3, 1, 0, 0)
    assert ranks_with_files(cfg.file_dir) == {0, 1} and len(held) == 3  # rank 1's files kept
    report, held, parents = adopt()  # the next start copies the one it could not read
    assert (report.blocks, report.deferred, report.corrupt) == (1, 0, 0)
    assert ranks_with_files(cfg.file_dir) == {0} and held == keys
    assert parents == {k: (keys[i - 1][1] if i else None) for i, k in enumerate(keys)}
    with CascadeStore(cfg, block_spec=SPEC) as store:
        assert all(served(store, i) for i in range(4))


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_an_adoption_whose_write_fails_keeps_the_old_files(tmp_path, monkeypatch, code):
    from cascade.core.factory import open_file_tier
    from cascade.tiers.adoption import adopt_orphans, ranks_with_files

    cfg = config(tmp_path)
    keys = [("default", ident(i)) for i in range(3)]
    old = open_file_tier(cfg, 1)
    for i, key in enumerate(keys):
        old.put(key, [b.reshape(-1) for b in block(i)])
    old.close()
    write = os.pwritev
    once = [True]

    def pwritev(fd, iov, offset):  # the first copy's write fails: a full disk, or EIO
        if once and once.pop():
            raise OSError(code, os.strerror(code))
        return write(fd, iov, offset)

    monkeypatch.setattr(os, "pwritev", pwritev)
    own = open_file_tier(cfg, 0)
    report = adopt_orphans(own, 1, lambda o: open_file_tier(cfg, o, capacity=1 << 62))
    own.close()
    monkeypatch.undo()
    assert (report.blocks, report.deferred, report.dropped) == (2, 1, 0)
    assert ranks_with_files(cfg.file_dir) == {0, 1}  # the only copy of the third is kept
    own = open_file_tier(cfg, 0)
    report = adopt_orphans(own, 1, lambda o: open_file_tier(cfg, o, capacity=1 << 62))  # the next start copies it
    own.close()
    assert (report.blocks, report.deferred) == (1, 0) and ranks_with_files(cfg.file_dir) == {0}
    with CascadeStore(cfg, block_spec=SPEC) as store:
        assert all(served(store, i) for i in range(3))


def test_an_adoption_skips_expired_blocks_keeps_ttls_and_counts_what_it_drops(tmp_path):
    import time

    from cascade.core.factory import open_file_tier
    from cascade.tiers.adoption import adopt_orphans

    cfg = config(tmp_path)
    old = open_file_tier(cfg, 1)
    ttls = {("default", ident(0)): time.time() - 1, ("default", ident(1)): time.time() + 3600}
    old.expiry_of = lambda key: ttls.get(key, 0.0)
    for i in range(6):  # block 0 is past its TTL, 1 has an hour left, 2-5 have none
        old.put(("default", ident(i)), [b.reshape(-1) for b in block(i)])
    old.close()
    small = open_file_tier(cfg, 0, capacity=3 * RECORD)  # room for three of the five live blocks
    report = adopt_orphans(small, 1, lambda o: open_file_tier(cfg, o, capacity=1 << 62))
    expires = small.expires_of(("default", ident(1)))
    small.close()
    assert (report.blocks, report.expired, report.dropped, report.deferred) == (3, 1, 2, 0)
    assert 3500 < expires - time.time() <= 3600  # written with the copy itself, not after it
