"""The file tier's upkeep outside the store's lock (cascade/tiers/compaction.py,
cascade/core/housekeeper.py). Compaction in three steps: what changes while a file is
copied (deletes, re-puts, refreshed expiries, reads), a crash between the steps, a failed
or stopped copy, back-pressure on writers, and a store whose other calls go on meanwhile.
Kills written by the housekeeper: a delete that returns before its kill is on disk, a
kill that fails, one whose file went meanwhile, and files freed at their last read."""
from __future__ import annotations

import errno
import os
import threading
import time
from contextlib import nullcontext

import numpy as np
import pytest

from cascade import CascadeStore, Config
from cascade.errors import CorruptBlock
from cascade.models import BlockSpec
from cascade.tiers import compaction
from cascade.tiers.file_set import SPARE_FILES
from cascade.tiers.file_tier import FileTier
from cascade.tiers.record_io import header_key
from cascade.tiers.records import HEADER_BYTES, unpack_header

SEG = 1 << 20  # 128 records of one page each per file


def key(i: int) -> tuple[str, str]:
    return ("ns", f"{i:032x}")


def value(i: int, version: int = 0) -> bytes:
    return bytes([(i + 7 * version) % 251 + 1]) * 4096


def open_tier(d: str, capacity: int = 64 << 20, *, queue_kills: bool = False) -> FileTier:
    """A tier whose compactions the test runs step by step; its kills are written at once
    (as a housekeeper with nothing else to do would), or with ``queue_kills`` left queued."""
    tier = FileTier(capacity, d, segment_bytes=SEG)
    tier.on_housekeeping_due = (lambda: None) if queue_kills else (lambda: tier._write_kills(nullcontext()))
    return tier


def with_due_file(d: str, *, queue_kills: bool = False) -> tuple[FileTier, list[int], list[int]]:
    """200 records, the first file's even ones deleted: (tier, live ids in the first file, others)."""
    tier = open_tier(d, queue_kills=queue_kills)
    for i in range(200):
        tier.put(key(i), [value(i)])
    first_path = tier.record_span(key(0))[0]
    first = [i for i in range(200) if tier.record_span(key(i))[0] == first_path]
    for i in first[::2]:
        del tier[key(i)]
    return tier, first[1::2], [i for i in range(200) if i not in first]


def end(tier: FileTier, run: compaction.CompactionRun) -> bool:
    """The end step (under the store's lock in a store) and the finish (outside it)."""
    ended = tier.end_compaction(run)
    fds = list(run.unlinked)
    tier.finish_compaction(run)
    for fd in fds:  # closed by the finish, not by the end step
        with pytest.raises(OSError):
            os.fstat(fd)
    return ended


def after_restart(d: str) -> dict[tuple[str, str], bytes]:
    """What a tier reopened on ``d`` holds."""
    tier = open_tier(d)
    try:
        return contents(tier)
    finally:
        tier.close()


def contents(tier: FileTier) -> dict[tuple[str, str], bytes]:
    return {k: tier[k] for k in tier}


def in_file(tier: FileTier, f) -> set[tuple[str, str]]:
    """The keys whose live record lies in file ``f``."""
    return {k for k in tier if tier._index[k].file_id == f.file_id}


def test_records_deleted_or_replaced_while_copied_stay_so_after_the_end_and_a_restart(tmp_path):
    d = str(tmp_path / "agg")
    tier, live, others = with_due_file(d)
    run = tier.start_compaction()
    assert run is not None and tier.start_compaction() is None  # one at a time
    source = run.source.path
    deleted, replaced, deleted_after_copy = live[0], live[1], live[2]
    del tier[key(deleted)]
    tier.put(key(replaced), [value(replaced, 1)])
    tier.copy_compaction(run)
    del tier[key(deleted_after_copy)]
    assert tier[key(live[3])] == value(live[3])  # still read where it was
    assert tier.end_compaction(run)
    assert not os.path.exists(source) and tier.stats()["compactions"] == 1
    assert run.unlinked and all(os.fstat(fd) for fd in run.unlinked)  # unlinked, closed only outside the lock
    tier.finish_compaction(run)
    expected = {key(i): value(i) for i in live[3:] + others}
    expected[key(replaced)] = value(replaced, 1)
    assert contents(tier) == expected
    tier.close()
    for _ in range(2):  # and again: nothing the first restart rewrote brings a record back
        tier = open_tier(d)
        assert contents(tier) == expected
        tier.close()


def test_a_crash_between_copy_and_end_keeps_exactly_the_live_records(tmp_path):
    """The source and its copies both on disk: a copy stands for its origin while the
    origin lives, and is dropped where the origin was deleted or replaced first."""
    d = str(tmp_path / "agg")
    tier, live, others = with_due_file(d)
    run = tier.start_compaction()
    deleted, replaced = live[0], live[1]
    tier.copy_compaction(run)
    del tier[key(deleted)]  # after their copies were written
    tier.put(key(replaced), [value(replaced, 1)])
    assert run.done
    tier.close()  # no end step: as a crash would leave it
    expected = {key(i): value(i) for i in live[2:] + others}
    expected[key(replaced)] = value(replaced, 1)
    for _ in range(2):
        tier = open_tier(d)
        assert contents(tier) == expected
        assert tier.stats()["blocks"] == len(expected)
        tier.close()


def test_a_record_reserved_before_a_compaction_and_committed_after_it_wins(tmp_path):
    """The new record lies in a file older than the compaction's copy of the old one:
    the commit voids the copy instead of killing it in place (which a restart would read
    as killing the new record too)."""
    d = str(tmp_path / "agg")
    tier, live, _ = with_due_file(d)
    i = live[0]
    reservation = tier.reserve(key(i), 4096)
    run = tier.start_compaction()
    tier.copy_compaction(run)
    assert end(tier, run)
    assert tier.record_span(key(i))[0] == run.target.path  # moved by the compaction
    tier.fill(reservation, [value(i, 1)])
    tier.commit(key(i), reservation)
    assert tier[key(i)] == value(i, 1)
    tier.close()
    assert after_restart(d)[key(i)] == value(i, 1)


def test_a_refreshed_expiry_is_written_to_the_copy(tmp_path):
    d = str(tmp_path / "agg")
    tier, live, _ = with_due_file(d)
    run = tier.start_compaction()
    tier.copy_compaction(run)
    tier.set_expiry(key(live[0]), 4e9)
    assert end(tier, run)
    tier.sync()
    tier.close()
    tier = open_tier(d)
    try:
        assert tier.expires_of(key(live[0])) == 4e9
    finally:
        tier.close()


@pytest.mark.parametrize("failure", ["enospc", "eio", "stopped"])
def test_a_failed_or_stopped_copy_drops_its_target_and_keeps_the_source(tmp_path, monkeypatch, failure):
    d = str(tmp_path / "agg")
    tier, live, others = with_due_file(d)
    before = contents(tier)
    run = tier.start_compaction()
    stop = threading.Event()
    if failure == "stopped":
        stop.set()
    else:
        code = errno.ENOSPC if failure == "enospc" else errno.EIO
        monkeypatch.setattr(compaction, "pwritev_all", lambda *a: (_ for _ in ()).throw(OSError(code, os.strerror(code))))
    tier.copy_compaction(run, stop)
    assert not end(tier, run)
    assert not os.path.exists(run.target.path) and os.path.exists(run.source.path)
    stats = tier.stats()
    assert stats["compactions"] == 0
    assert stats["compactions_deferred"] == (0 if failure == "stopped" else 1)
    assert stats["full_events"] == (1 if failure == "enospc" else 0)
    assert contents(tier) == before
    assert run.source.keys == in_file(tier, run.source)  # given back whole: a later run copies them all
    monkeypatch.undo()
    if failure == "stopped":  # not put off: the next change may compact at once
        assert (run := tier.start_compaction()) is not None
        tier.copy_compaction(run)
        assert end(tier, run)
    tier.close()
    assert after_restart(d) == before


def test_a_file_compacted_while_read_goes_when_its_last_read_ends(tmp_path):
    """Unlinked at its last read's end (under the store's lock); its descriptors are
    closed, which frees its blocks, by the housekeeper, outside that lock."""
    d = str(tmp_path / "agg")
    tier, live, _ = with_due_file(d)
    asked = []
    tier.on_housekeeping_due = lambda: asked.append(1)
    run = tier.start_compaction()
    lease = tier.lease(key(live[0]))  # a read of the source begins while it is copied
    tier.copy_compaction(run)
    assert end(tier, run)
    assert os.path.exists(run.source.path)  # read from meanwhile
    out = bytearray(4096)
    tier.read_leased(lease, [out])
    assert bytes(out) == value(live[0])
    asked.clear()
    fds = [run.source.fd]
    tier.release(lease)
    assert not os.path.exists(run.source.path) and asked
    assert os.fstat(fds[0])  # still open: not closed under the lock
    tier.housekeep(nullcontext(), threading.Event())
    with pytest.raises(OSError):
        os.fstat(fds[0])
    tier.close()


def test_writes_that_outrun_a_compaction_wait_for_it(tmp_path):
    """Over its disk bound while a compaction copies, the tier is ``behind``: a writer's
    wait_for_compaction() returns once the compaction ends, not before."""
    d = str(tmp_path / "agg")
    tier = open_tier(d, capacity=1 << 20)  # bound: 2 MiB + 256 KiB (seal bytes)
    i = 0
    while sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d) if n.endswith(".bin")) <= 3 << 20:
        tier.put(key(i), [value(i)])
        if i % 4:
            del tier[key(i)]
        i += 1
    run = tier.start_compaction()
    assert run is not None
    tier.fill(reservation := tier.reserve(key(i), 4096), [value(i)])
    tier.commit(key(i), reservation)
    assert tier.behind
    waited = threading.Thread(target=tier.wait_for_compaction)
    waited.start()
    waited.join(0.3)
    assert waited.is_alive()
    tier.copy_compaction(run)
    end(tier, run)
    waited.join(5)
    assert not waited.is_alive() and not tier.behind
    tier.close()


def _store(tmp_path, **config) -> CascadeStore:
    cfg = Config(model="tiny", shm_bytes=0, file_bytes=64 << 20, file_dir=str(tmp_path / "agg"),
                 file_segment_bytes=SEG, file_read_mode="buffered", **config)
    return CascadeStore(cfg, block_spec=BlockSpec.flat(4096))


def _pairs(n: int, version: int = 0) -> tuple[np.ndarray, np.ndarray]:
    data = np.frombuffer(value(n, version), dtype=np.uint8)
    return data[:2048].copy(), data[2048:].copy()


class HeldCopy:
    """The compaction's writes wait at the first one until released."""

    def __init__(self, monkeypatch) -> None:
        self.reached, self.release = threading.Event(), threading.Event()
        real = compaction.pwritev_all

        def held(*args):
            self.reached.set()
            assert self.release.wait(30)
            return real(*args)
        monkeypatch.setattr(compaction, "pwritev_all", held)


def test_a_store_serves_every_call_while_its_file_tier_compacts(tmp_path, monkeypatch):
    held = HeldCopy(monkeypatch)
    with _store(tmp_path) as store:
        ids = [store.put(*_pairs(n)) for n in range(200)]
        first = ids[:128]
        for bid in first[::2]:
            store.delete(bid)
        assert held.reached.wait(10)  # the compactor is copying the first file
        done = threading.Event()

        def calls() -> None:
            for n, bid in zip(range(1, 128, 2), first[1::2]):
                got = store.get(bid)
                assert got is not None and bytes(got[0]) + bytes(got[1]) == value(n)
            store.put(*_pairs(500))
            store.delete(first[1])
            store.stats()
            done.set()
        caller = threading.Thread(target=calls)
        caller.start()
        caller.join(20)
        assert done.is_set()  # before the copy went on: none of them waited for it
        held.release.set()
        store.flush()  # waits for the compaction
        stats = store.stats()["tiers"]["file"]
        assert stats["compactions"] >= 1 and stats["corrupt_reads"] == 0
        for n, bid in zip(range(3, 128, 2), first[3::2]):
            got = store.get(bid)
            assert got is not None and bytes(got[0]) + bytes(got[1]) == value(n)
        assert store.get(first[1]) is None


def test_close_stops_a_compaction_under_way_and_loses_nothing(tmp_path, monkeypatch):
    held = HeldCopy(monkeypatch)
    store = _store(tmp_path)
    ids = [store.put(*_pairs(n)) for n in range(200)]
    for bid in ids[:128:2]:
        store.delete(bid)
    assert held.reached.wait(10)
    closer = threading.Thread(target=store.close)
    closer.start()
    time.sleep(0.2)
    held.release.set()  # the copy goes on to its next record, sees the stop, and is undone
    closer.join(20)
    assert not closer.is_alive()
    monkeypatch.undo()
    with _store(tmp_path) as store:
        for n, bid in list(enumerate(ids))[1:128:2] + list(enumerate(ids))[128:]:
            got = store.get(bid)
            assert got is not None and bytes(got[0]) + bytes(got[1]) == value(n)
        assert all(store.get(bid) is None for bid in ids[:128:2])


def test_a_corrupt_record_kept_by_the_store_is_reported_once_however_often_it_is_copied(tmp_path):
    """A corrupt record the store keeps (another rank pins it) is copied as it is at each
    compaction of its file; the store hears of it once (it used to count it at each one)."""
    d = str(tmp_path / "agg")
    tier, live, _ = with_due_file(d)
    path, offset, _, _ = tier.record_span(key(live[0]))
    with open(path, "r+b") as f:
        f.seek(offset + 100)
        f.write(b"\xff\x00")
    reported: list = []
    tier.on_corrupt = reported.extend  # keeps them, as a store does while another rank pins them
    for _ in range(2):
        run = tier.start_compaction()
        tier.copy_compaction(run)
        assert end(tier, run)
        for i in live[1:]:  # the rest of the copied file dies: it is due again
            if key(i) in tier:
                del tier[key(i)]
    assert reported == [key(live[0])] and key(live[0]) in tier
    with pytest.raises(CorruptBlock):
        tier[key(live[0])]  # still never served
    tier.close()


def test_a_block_deleted_after_its_record_moved_and_put_again_survives_a_restart(tmp_path):
    """The delete kills the moved copy in place (killing every earlier record of its key
    at a restart), so the new record must lie after it: puts after a compaction's start
    go to a file newer than its target."""
    d = str(tmp_path / "agg")
    tier, live, _ = with_due_file(d)
    i = live[0]
    run = tier.start_compaction()
    tier.copy_compaction(run)
    assert end(tier, run)
    del tier[key(i)]
    tier.put(key(i), [value(i, 2)])
    tier.close()
    assert after_restart(d)[key(i)] == value(i, 2)


def test_each_compaction_leaves_no_empty_file_behind(tmp_path):
    d = str(tmp_path / "agg")
    tier, live, _ = with_due_file(d)
    for _ in range(3):  # from the second start on, the active file (opened by the first) is empty
        run = tier.start_compaction()
        assert run is not None
        tier.copy_compaction(run)
        assert end(tier, run)
        moved = [i for i in live if key(i) in tier and tier.record_span(key(i))[0] == run.target.path]
        for i in moved[::2]:  # the file they moved to is half dead: due next
            del tier[key(i)]
    sizes = [os.path.getsize(os.path.join(d, n)) for n in os.listdir(d) if n.endswith(".bin")]
    assert sizes.count(0) == 1  # the active file only
    tier.close()


def _kill_on_disk(span: tuple[str, int, int, int]) -> bool:
    """Whether the record whose payload ``span`` gives (record_span) is a tombstone on disk."""
    path, payload_offset = span[0], span[1]
    with open(path, "rb") as f:
        f.seek(payload_offset - HEADER_BYTES)
        header = unpack_header(f.read(HEADER_BYTES), header_key(os.path.dirname(path)))
    return header is not None and header.tombstone


class HeldKills:
    """The housekeeper's tombstone writes wait until released (or fail, with ``error``)."""

    def __init__(self, monkeypatch, error: int | None = None) -> None:
        self.reached, self.release, self.error = threading.Event(), threading.Event(), error
        real = os.pwrite

        def held(fd, data, offset):
            if threading.current_thread().name == "cascade-housekeeper" and len(data) == HEADER_BYTES:
                self.reached.set()
                if self.error is not None:
                    raise OSError(self.error, os.strerror(self.error))
                assert self.release.wait(30)
            return real(fd, data, offset)
        monkeypatch.setattr(os, "pwrite", held)


def test_a_delete_returns_while_its_kill_waits_for_the_disk_and_flush_writes_it(tmp_path, monkeypatch):
    """The kill (a header rewrite) runs on the housekeeper: the delete, gets, puts and
    other deletes go on while it waits for the disk; flush() returns once it is on disk."""
    held = HeldKills(monkeypatch)
    with _store(tmp_path) as store:
        ids = [store.put(*_pairs(n)) for n in range(8)]
        file_tier = store.tiers[-1]
        spans = [file_tier.record_span(("default", bid)) for bid in ids]
        store.delete(ids[0])
        assert held.reached.wait(10)  # the housekeeper is writing the kill
        done = threading.Event()

        def calls() -> None:
            got = store.get(ids[1])
            assert got is not None and bytes(got[0]) + bytes(got[1]) == value(1)
            store.put(*_pairs(100))
            store.delete(ids[2])
            assert store.get(ids[0]) is None
            done.set()
        caller = threading.Thread(target=calls)
        caller.start()
        caller.join(20)
        assert done.is_set()  # none of them waited for the kill
        flusher = threading.Thread(target=store.flush)
        flusher.start()
        flusher.join(0.3)
        assert flusher.is_alive()  # flush waits for it
        held.release.set()
        flusher.join(20)
        assert not flusher.is_alive()
        assert _kill_on_disk(spans[0]) and _kill_on_disk(spans[2]) and not _kill_on_disk(spans[3])
        assert file_tier.stats()["pending_deletes"] == 0


def test_a_kill_the_housekeeper_cannot_write_is_kept_pending_and_written_later(tmp_path, monkeypatch, caplog):
    held = HeldKills(monkeypatch, error=errno.EIO)
    with _store(tmp_path) as store:
        ids = [store.put(*_pairs(n)) for n in range(4)]
        file_tier = store.tiers[-1]
        store.delete(ids[0])
        assert store._housekeeper.wait_idle(10)  # (a flush would retry it itself)
        assert held.reached.is_set() and file_tier.stats()["pending_deletes"] == 1
        assert "cannot record a delete" in caplog.text
        held.error = None
        held.release.set()
        store.delete(ids[1])  # a later change retries it; its own kill goes to the housekeeper
        store.flush()
        assert file_tier.stats()["pending_deletes"] == 0
    monkeypatch.undo()
    with _store(tmp_path) as store:
        assert [store.get(bid) is None for bid in ids] == [True, True, False, False]


def test_a_file_with_kills_queued_is_compacted_only_after_they_are_written(tmp_path):
    """A queued kill holds its file: not compacted (nor closed) before the kill is written,
    so the write never lands in a closed or reused descriptor."""
    d = str(tmp_path / "agg")
    tier, live, others = with_due_file(d, queue_kills=True)
    first = tier.record_span(key(live[0]))[0]
    assert tier._queued_kills and tier.start_compaction() is None  # held by its kills
    for i in others[:4]:
        tier.put(key(i), [value(i, 1)])
    tier.housekeep(nullcontext(), threading.Event())  # the kills, then the compaction
    assert not os.path.exists(first) and tier.stats()["compactions"] == 1
    expected = {key(i): value(i) for i in live + others}
    expected.update({key(i): value(i, 1) for i in others[:4]})
    assert contents(tier) == expected
    tier.close()
    assert after_restart(d) == expected


def test_close_writes_the_kills_still_queued(tmp_path):
    d = str(tmp_path / "agg")
    tier, live, others = with_due_file(d, queue_kills=True)
    del tier[key(live[0])]
    assert tier.stats()["pending_deletes"] > 0  # queued: no housekeeper ran
    tier.close()
    assert after_restart(d) == {key(i): value(i) for i in live[1:] + others}


def test_with_file_fsync_the_kills_written_together_cost_one_fsync_per_file(tmp_path, monkeypatch):
    held = HeldKills(monkeypatch)
    fsyncs, real_fsync = [], os.fsync

    def counted(fd):
        if threading.current_thread().name == "cascade-housekeeper":
            fsyncs.append(fd)
        return real_fsync(fd)
    monkeypatch.setattr(os, "fsync", counted)
    with _store(tmp_path, file_fsync=True) as store:
        ids = [store.put(*_pairs(n)) for n in range(40)]  # one file
        spans = [store.tiers[-1].record_span(("default", bid)) for bid in ids]
        store.delete(ids[0])
        assert held.reached.wait(10)
        for bid in ids[1:33]:  # queued while the first is written
            store.delete(bid)
        held.release.set()
        store.flush()
        assert all(_kill_on_disk(span) for span in spans[:33]) and not _kill_on_disk(spans[33])
        assert 2 <= len(fsyncs) <= 3  # the first kill's, then the rest's together (33 one by one before)


def test_with_file_fsync_kills_whose_fsync_fails_are_kept_pending(tmp_path, monkeypatch):
    """The housekeeper's fsync of a file fails (EIO): every kill it wrote into that file
    is kept pending (not known durable), and a later change writes them again."""
    real_fsync = os.fsync
    failing = threading.Event()
    failing.set()

    def fsync(fd):
        if failing.is_set() and threading.current_thread().name == "cascade-housekeeper":
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    with _store(tmp_path, file_fsync=True) as store:
        ids = [store.put(*_pairs(n)) for n in range(8)]
        file_tier = store.tiers[-1]
        for bid in ids[:3]:
            store.delete(bid)
        assert store._housekeeper.wait_idle(10)
        assert file_tier.stats()["pending_deletes"] == 3
        failing.clear()
        store.delete(ids[3])  # retries the pending ones under the lock; its own goes to the housekeeper
        store.flush()
        assert file_tier.stats()["pending_deletes"] == 0
    monkeypatch.undo()
    with _store(tmp_path) as store:
        assert [store.get(bid) is None for bid in ids] == [True] * 4 + [False] * 4


class BetweenSteps:
    """A stand-in for the store's lock that runs ``between(n)`` before its n-th entry."""

    def __init__(self, between) -> None:
        self.entries, self.between = 0, between

    def __enter__(self) -> None:
        self.between(self.entries)
        self.entries += 1

    def __exit__(self, *exc) -> None:
        pass


def test_deletes_and_puts_between_the_end_steps_stay_so_after_the_end_and_a_restart(tmp_path, monkeypatch):
    """The end points the index at the copies a batch at a time, the lock given up in
    between: records deleted or replaced before their batch, or after it, end as they
    would with the end in one step."""
    monkeypatch.setattr(compaction, "RELOCATE_BATCH", 4)
    d = str(tmp_path / "agg")
    tier, live, others = with_due_file(d)
    run = tier.start_compaction()
    tier.copy_compaction(run)
    first, late = live[:4], live[-4:]  # in the first batch; in the last
    changes = {}

    def between(entry: int) -> None:
        if entry == 2:  # after the first batch, before the others
            del tier[key(first[0])]
            del tier[key(late[0])]
            tier.put(key(first[1]), [value(first[1], 1)])
            tier.put(key(late[1]), [value(late[1], 1)])
            changes.update(done=True)
    assert tier.end_compaction(run, BetweenSteps(between)) and changes
    tier.finish_compaction(run)
    expected = {key(i): value(i) for i in live + others if i not in (first[0], late[0])}
    expected[key(first[1])] = value(first[1], 1)
    expected[key(late[1])] = value(late[1], 1)
    assert contents(tier) == expected and not os.path.exists(run.source.path)
    tier.close()
    for _ in range(2):
        assert after_restart(d) == expected


def test_an_end_step_that_raises_keeps_every_record(tmp_path, monkeypatch):
    """The directory's update fails in the second batch: the run ends without the source
    going; every record stays readable, now and after a restart."""
    monkeypatch.setattr(compaction, "RELOCATE_BATCH", 4)
    d = str(tmp_path / "agg")
    tier, live, others = with_due_file(d)
    calls = []

    def on_relocate(keys) -> None:
        calls.append(keys)
        if len(calls) == 2:
            raise RuntimeError("directory update failed")
    tier.on_relocate = on_relocate
    run = tier.start_compaction()
    tier.copy_compaction(run)
    with pytest.raises(RuntimeError):
        tier.end_compaction(run)
    tier.finish_compaction(run)
    assert os.path.exists(run.source.path) and not tier._compacting and tier.stats()["compactions"] == 0
    assert run.source.keys == in_file(tier, run.source) and run.target.keys == in_file(tier, run.target)
    assert len(run.target.keys) == 8 and len(run.source.keys) == len(live) - 8  # two batches moved before it raised
    expected = {key(i): value(i) for i in live + others}
    assert contents(tier) == expected
    tier.close()
    assert after_restart(d) == expected


def _unique_pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    data = np.random.default_rng(n).integers(0, 255, 4096, dtype=np.uint8)
    return data[:2048], data[2048:]


def test_with_a_store_new_files_are_made_ahead_on_the_housekeeper_thread(tmp_path, monkeypatch):
    """Once the housekeeper has run, puts that roll over to a new file and compactions'
    starts take spares it made: no file is created on a caller's thread, and files are
    handed out in id order (a restart reads later files as newer)."""
    creators, handed = [], []
    create, hand_out = FileTier._create_file, FileTier._hand_out

    def recording_create(self, file_id):
        creators.append(threading.current_thread().name)
        return create(self, file_id)

    def recording_hand_out(self, f):
        handed.append(f.file_id)
        return hand_out(self, f)

    monkeypatch.setattr(FileTier, "_create_file", recording_create)
    monkeypatch.setattr(FileTier, "_hand_out", recording_hand_out)
    store = _store(tmp_path)
    tier = store.tiers[0]
    ids = [store.put(*_unique_pairs(i)) for i in range(130)]  # 128 records a file: the second made here (no spare yet)
    store.flush()
    spares = [f.path for f in tier._spares]
    assert len(spares) == SPARE_FILES and all(os.path.getsize(p) == 0 for p in spares)
    assert creators[-SPARE_FILES:] == ["cascade-housekeeper"] * SPARE_FILES
    creators.clear()
    for i in range(130, 600):  # three more files, and compactions of the half-dead ones
        ids.append(store.put(*_unique_pairs(i)))
        if i % 2:
            store.delete(ids[i - 130])
        store.flush()  # the housekeeper's round done (else a put may outrun it and make a file itself)
    assert tier.stats()["compactions"] >= 1 and len(handed) >= 6
    assert creators and set(creators) == {"cascade-housekeeper"}
    assert handed == sorted(handed) and len(set(handed)) == len(handed)
    spares = [f.path for f in tier._spares]
    store.close()
    assert spares and not any(os.path.exists(p) for p in spares)  # close removes the spares left
    with _store(tmp_path) as again:
        assert all(np.array_equal(again.get(ids[i])[1], _unique_pairs(i)[1]) for i in range(470, 600))
        assert again.get(ids[1]) is None and again.get(ids[469]) is None


def test_spares_made_before_a_file_created_meanwhile_are_never_handed_out(tmp_path):
    """Spares whose ids were taken before a file created under the lock meanwhile are
    unlinked, not handed out."""
    tier = open_tier(str(tmp_path / "agg"))
    direct = []
    tier._make_spares(BetweenSteps(lambda n: direct.append(tier._new_file()) if n == 1 else None))
    assert direct[0].file_id > max(f.file_id for f in tier._spares)  # made while the spares were
    stale = [f.path for f in tier._spares]
    assert tier._new_file().file_id > direct[0].file_id
    assert not tier._spares and not any(os.path.exists(p) for p in stale)
    tier._make_spares(nullcontext())
    lowest = tier._spares[0].file_id
    assert [f.file_id for f in tier._spares] == list(range(lowest, lowest + SPARE_FILES))
    assert tier._new_file().file_id == lowest
    tier.close()


def test_a_spare_whose_name_is_taken_is_passed_over(tmp_path):
    tier = open_tier(str(tmp_path / "agg"))
    n = tier._next_id
    os.mkdir(tier._file_path(n))  # someone else's directory where the next spare would go
    tier._make_spares(nullcontext())
    assert [f.file_id for f in tier._spares] == list(range(n + 1, n + SPARE_FILES))
    for _ in range(SPARE_FILES - 1):
        assert tier._new_file().file_id > n
    made = tier._new_file()  # none left: made under the lock
    assert made.file_id == n + SPARE_FILES and os.path.getsize(made.path) == 0
    assert os.path.isdir(tier._file_path(n))
    tier.close()
