"""The file tier's own records across restarts and failed steps: a put that lost a race,
a replacement torn by a crash, a compaction whose end step raised, a compaction of dead
files, a file that cannot be read through, a relative directory, kills a restart cannot
write, a compaction that raises inside a lone tier's put."""
from __future__ import annotations

import errno
import os
from contextlib import nullcontext

import pytest

from cascade.tiers import compaction
from cascade.tiers.file_tier import FileTier
from cascade.tiers.records import HEADER_BYTES


def key(i: int) -> tuple[str, str]:
    return ("ns", f"{i:032x}")


def value(i: int) -> bytes:
    return bytes([i % 251 + 1]) * 4096


def fill(tier: FileTier, count: int) -> None:
    """``count`` blocks put: ``value(i)`` under ``key(i)``."""
    for i in range(count):
        tier.put(key(i), [value(i)])


def open_tier(directory) -> FileTier:
    return FileTier(64 << 20, str(directory), segment_bytes=1 << 20)


def test_a_put_that_lost_a_race_with_its_id_leaves_the_winner_at_a_restart(tmp_path):
    # the loser's written record was killed in place: at a restart such a tombstone kills
    # every earlier record of the key, the winner's included
    tier = open_tier(tmp_path)
    won, lost, other = tier.reserve(key(1), 4096), tier.reserve(key(1), 4096), tier.reserve(key(2), 4096)
    for reservation, i in ((won, 1), (lost, 1), (other, 2)):
        tier.fill(reservation, [value(i)])
    tier.commit(key(1), won)
    tier.discard(lost)  # what a put does when another put of its id committed first
    tier.commit(key(2), other)
    tier.close()
    tier = open_tier(tmp_path)
    assert tier[key(1)] == value(1) and tier[key(2)] == value(2)
    tier.close()


def test_a_replacement_torn_by_a_crash_leaves_the_durable_record(tmp_path):
    tier = open_tier(tmp_path)
    tier.put(key(1), [bytes([1]) * 8192])
    tier.sync()
    tier.close()
    tier = open_tier(tmp_path)
    reservation = tier.reserve(key(1), 8192)  # a re-put that a crash stops before its commit
    tier.fill(reservation, [bytes([2]) * 8192])
    path, offset = reservation.file.path, reservation.offset
    tier.close()
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, bytes(4096), offset + HEADER_BYTES + 4096)  # its last page never reached the disk
    finally:
        os.close(fd)
    for _ in range(2):  # and not lost at the restart after either
        tier = open_tier(tmp_path)
        assert tier[key(1)] == bytes([1]) * 8192
        assert tier.counters["torn_records"] <= 1
        tier.close()


def test_copies_a_failed_compaction_end_left_do_not_bring_deleted_blocks_back(tmp_path, monkeypatch):
    monkeypatch.setattr(compaction, "RELOCATE_BATCH", 4)

    def reopen() -> FileTier:
        tier = open_tier(tmp_path)
        tier.on_housekeeping_due = lambda: tier._write_kills(nullcontext())
        return tier

    tier = reopen()
    fill(tier, 200)
    first_file = tier.record_span(key(0))[0]
    first = [i for i in range(200) if tier.record_span(key(i))[0] == first_file]
    for i in first[::2]:
        del tier[key(i)]
    batches = []

    def relocated(keys):  # the directory update fails on the 11th batch of 16
        batches.append(keys)
        if len(batches) == 11:
            raise RuntimeError("injected: directory update failed")

    tier.on_relocate = relocated
    run = tier.start_compaction()
    tier.copy_compaction(run)
    with pytest.raises(RuntimeError, match="injected"):
        tier.end_compaction(run)
    tier.finish_compaction(run)
    tier.on_relocate = None
    left = sorted(run.source.keys)
    assert left  # records the failed end did not point at their copies
    del tier[left[0]]
    while tier.compact_next():  # the source goes, and with it the origin the copy names
        pass
    assert not os.path.exists(run.source.path) and os.path.exists(run.target.path)  # the copies stay
    tier.close()
    tier = reopen()
    assert left[0] not in tier
    assert all(tier[k] == value(int(k[1], 16)) for k in left[1:])
    tier.close()


def test_compacting_dead_files_keeps_no_empty_file_or_descriptor(tmp_path):
    tier = open_tier(tmp_path)
    before = len(os.listdir("/proc/self/fd"))
    for cycle in range(20):
        for i in range(300):
            tier.put(key(cycle * 1000 + i), [value(i)])
        for i in range(300):
            del tier[key(cycle * 1000 + i)]
        while tier.compact_next():
            pass
    files = [n for n in os.listdir(tmp_path) if n.endswith(".bin")]
    assert len(files) <= 3, files
    assert len(os.listdir("/proc/self/fd")) - before <= 3
    tier.close()


def test_a_file_that_cannot_be_read_through_at_open_is_counted_and_the_rest_served(tmp_path, monkeypatch):
    tier = open_tier(tmp_path)
    fill(tier, 300)
    bad = tier.record_span(key(299))[0]
    good = [i for i in range(300) if tier.record_span(key(i))[0] != bad]
    tier.close()
    pread = failing_in(monkeypatch, "pread", bad)
    tier = open_tier(tmp_path)  # it raised OSError: the whole tier (and store) failed to open
    monkeypatch.setattr(os, "pread", pread)
    assert tier.counters["bad_files"] == 1
    assert good and all(tier[key(i)] == value(i) for i in good)
    tier.close()


def test_a_relative_directory_stays_where_it_was_after_a_chdir(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir(mode=0o700)
    (tmp_path / "b").mkdir(mode=0o700)
    monkeypatch.chdir(tmp_path / "a")
    tier = FileTier(64 << 20, "cache", segment_bytes=1 << 20)
    monkeypatch.chdir(tmp_path / "b")  # e.g. a framework changing the working directory
    for i in range(600):  # new segment files: under a/cache, not b/cache
        tier.put(key(i), [value(i)])
    tier.close()
    assert not (tmp_path / "b" / "cache").exists()
    tier = FileTier(64 << 20, str(tmp_path / "a" / "cache"), segment_bytes=1 << 20)
    assert all(tier[key(i)] == value(i) for i in range(600))
    tier.close()


def test_a_new_file_that_cannot_be_made_is_a_full_tier(tmp_path, monkeypatch):
    from cascade.errors import TierFull

    tier = open_tier(tmp_path)

    def no_inode_left(file_id):
        raise OSError(errno.ENOSPC, "injected: No space left on device")

    monkeypatch.setattr(tier, "_create_file", no_inode_left)
    with pytest.raises(TierFull, match="cannot create a file"):  # a raw OSError once the active file was full
        for i in range(600):
            tier.put(key(i), [value(i)])
    assert tier.counters["full_events"] == 1
    tier.close()


def test_a_compaction_makes_its_new_files_name_durable_before_it_removes_the_source(tmp_path, monkeypatch):
    tier = open_tier(tmp_path)
    fill(tier, 300)
    source = tier.record_span(key(0))[0]
    steps: list[tuple[str, str]] = []
    fsync, unlink = os.fsync, os.unlink

    def recorded_fsync(fd):
        steps.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def recorded_unlink(path, *args, **kwargs):
        steps.append(("unlink", str(path)))
        unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", recorded_fsync)
    monkeypatch.setattr(os, "unlink", recorded_unlink)
    for i in range(300):  # a lone tier compacts as its files pass their dead fraction
        if tier.record_span(key(i))[0] == source and i % 4:
            del tier[key(i)]
    while tier.compact_next():
        pass
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "unlink", unlink)
    assert ("unlink", source) in steps
    # a power loss after the unlink keeps the copies' file: its name was made durable first
    assert ("fsync", str(tmp_path)) in steps[:steps.index(("unlink", source))]
    tier.close()
    tier = open_tier(tmp_path)
    assert all(tier[key(i)] == value(i) for i in range(0, 300, 4))
    tier.close()


def test_a_flush_makes_the_names_of_new_files_durable_too(tmp_path, monkeypatch):
    import numpy as np

    from cascade import CascadeStore, Config

    cfg = Config(model="tiny", shm_bytes=0, remote_bytes=0, file_bytes=8 << 20, file_dir=str(tmp_path / "f"),
                 file_segment_bytes=1 << 20)
    with CascadeStore(cfg) as store:
        for i in range(200):  # past one segment: a new file was made
            store.put(*(np.full(store.spec.shape, i, store.spec.np_dtype) for _ in range(2)))
        synced: list[str] = []
        fsync = os.fsync

        def recorded(fd):
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
            fsync(fd)

        monkeypatch.setattr(os, "fsync", recorded)
        store.flush()
        monkeypatch.setattr(os, "fsync", fsync)
        files = {f.path for f in store.tiers[0]._files.values()}  # (spares made ahead hold nothing yet)
        assert len(files) >= 2 and files <= set(synced)
        assert str(tmp_path / "f") in synced  # the directory: the new file keeps its name after a power loss


def failing_in(monkeypatch, call: str, path: str):
    """Every ``os.<call>`` (``pread``, or ``pwrite``: a header rewritten in place, a kill,
    a void) on a descriptor of ``path`` fails with EIO; the original call, to restore."""
    original = getattr(os, call)

    def failing(fd, *args):
        if os.readlink(f"/proc/self/fd/{fd}") == path:
            raise OSError(errno.EIO, "injected: Input/output error")
        return original(fd, *args)

    monkeypatch.setattr(os, call, failing)
    return original


def test_a_superseded_record_a_restart_cannot_kill_never_comes_back(tmp_path, monkeypatch):
    tier = open_tier(tmp_path)
    fill(tier, 256)  # two full files: the replacement below lies alone in a third
    old_file = tier.record_span(key(0))[0]
    reservation = tier.reserve(key(0), 4096)  # a replacement a crash stops before it killed the old record
    tier.fill(reservation, [value(1000)])
    tier.close()
    failing_in(monkeypatch, "pwrite", old_file)
    tier = open_tier(tmp_path)  # the kill of the old record fails
    assert tier[key(0)] == value(1000) and tier.stats()["pending_deletes"] == 1
    new_file = tier.record_span(key(0))[0]
    del tier[key(0)]  # its file is all dead now, but it holds what makes a restart drop the old record
    assert os.path.exists(new_file) and tier.stats()["compactions"] == 0
    tier.close()
    monkeypatch.undo()
    tier = open_tier(tmp_path)  # the kill is written now, and files may go again
    assert key(0) not in tier and tier.stats()["pending_deletes"] == 0
    del tier[key(1)]
    while tier.compact_next():
        pass
    assert not os.path.exists(new_file)
    tier.close()
    tier = open_tier(tmp_path)
    assert key(0) not in tier and key(1) not in tier
    assert all(tier[key(i)] == value(i) for i in range(2, 256))
    tier.close()


def test_a_copy_a_restart_cannot_rewrite_leaves_its_origin_live(tmp_path, monkeypatch):
    """A crash mid-compaction leaves copies naming their live origins; a copy whose header
    cannot be rewritten (to forget its origin) is voided and its origin stays, so a
    delete of the block kills the record the next restart reads."""
    def reopen() -> FileTier:
        tier = open_tier(tmp_path)
        tier.on_housekeeping_due = lambda: tier._write_kills(nullcontext())  # kills written, nothing compacted
        return tier

    tier = reopen()
    fill(tier, 256)
    source = tier.record_span(key(0))[0]
    first = [i for i in range(256) if tier.record_span(key(i))[0] == source]
    for i in first[1::2]:
        del tier[key(i)]
    run = tier.start_compaction()
    tier.copy_compaction(run)
    assert run.done
    tier.close()  # a crash before the end: source and copies both on disk
    failing_in(monkeypatch, "pwrite", run.target.path)
    tier = open_tier(tmp_path)
    kept = first[::2]
    assert all(tier[key(i)] == value(i) for i in kept)
    assert tier.record_span(key(kept[0]))[0] == source and tier.stats()["pending_deletes"] > 0
    del tier[key(kept[0])]
    tier.close()
    monkeypatch.undo()
    tier = open_tier(tmp_path)
    assert key(kept[0]) not in tier
    assert all(tier[key(i)] == value(i) for i in kept[1:] + list(range(first[-1] + 1, 256)))
    tier.close()


def test_a_compaction_that_raises_inline_never_fails_the_put_that_ran_it(tmp_path, monkeypatch, caplog):
    tier = open_tier(tmp_path)
    fill(tier, 256)
    source = tier.record_span(key(0))[0]
    first = [i for i in range(256) if tier.record_span(key(i))[0] == source]
    for i in first[1:len(first) // 2]:  # one record short of the dead fraction
        del tier[key(i)]
    assert tier.stats()["compactions"] == 0

    def no_memory(*args):  # the copy fails with what is not an I/O error (copy_compaction re-raises it)
        raise MemoryError("injected")

    monkeypatch.setattr(compaction, "pwritev_all", no_memory)
    tier.put(key(0), [value(1000)])  # its commit kills the old record: the source is due, compacted inline
    monkeypatch.undo()
    assert tier[key(0)] == value(1000)
    stats = tier.stats()
    assert stats["compaction_errors"] == 1 and stats["compactions"] == 0 and "a compaction failed" in caplog.text
    held = {tier.record_span(k)[0] for k in tier} | {tier._active.path}
    assert source in held and {str(p) for p in tmp_path.glob("*.bin")} == held  # the copies' file is gone
    tier.close()
    tier = open_tier(tmp_path)
    assert tier[key(0)] == value(1000)
    assert all(tier[key(i)] == value(i) for i in range(len(first) // 2, 256))
    tier.close()
