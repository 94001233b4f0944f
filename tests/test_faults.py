"""Faults: a full disk or /dev/shm, bit flips in DRAM slabs, crashes mid-write.

Losing cache data on a failure is acceptable; serving wrong data or going down is not.
Mount-based tests need root (they mount a small tmpfs) and skip otherwise.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest

from cascade import CascadeStore, Config
from cascade.errors import TierFull
from cascade.tiers.file_tier import FileTier

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")


def block(spec, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(spec.shape).astype(spec.dtype),
            rng.standard_normal(spec.shape).astype(spec.dtype))


def same(got, expected):
    return got is not None and np.array_equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])


@contextmanager
def small_tmpfs(path, size: str):
    os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@root_only
def test_full_file_tier_keeps_serving_and_recovers_when_space_returns(tmp_path):
    with small_tmpfs(tmp_path / "fs", "512k") as fs:
        cfg = Config(model="tiny", shm_bytes=8 * 4096, file_bytes=64 << 20, file_dir=str(fs / "agg"),
                     file_segment_bytes=1 << 20)
        with CascadeStore(cfg) as s:
            data = {}
            for i in range(200):  # the file system holds ~60 records: it fills up
                data[s.put(*block(s.spec, i))] = i
            stats = s.stats()
            assert stats["rejected"] == 0  # every put was taken
            assert stats["tiers"]["file"]["full_events"] > 0
            # A failed background move pauses the demoter (else it retried the oldest block
            # ~100 times here, shielding it while puts dropped younger ones in its place).
            assert 1 <= stats["background_demotion_errors"] <= 5
            newest = list(data)[-8:]  # still in SHM
            assert all(s.contains(b) for b in newest)
            wrong = sum(1 for bid, i in data.items() if (g := s.get(bid)) is not None and not same(g, block(s.spec, i)))
            assert wrong == 0
            on_file = s.stats()["tiers"]["file"]["blocks"]
            subprocess.run(["mount", "-o", "remount,size=8m", str(fs)], check=True)  # space returns
            for i in range(200, 300):
                data[s.put(*block(s.spec, i))] = i
            assert s.stats()["tiers"]["file"]["blocks"] > on_file + 50
            assert s.stats()["background_demotions"] > stats["background_demotions"]  # resumed
            wrong = sum(1 for bid, i in data.items() if (g := s.get(bid)) is not None and not same(g, block(s.spec, i)))
            assert wrong == 0


@root_only
def test_full_dev_shm_runs_on_the_other_tiers(tmp_path, caplog):
    """A 64 KiB tmpfs under a 1 MiB SHM tier: the tier opens (memory is committed lazily),
    says the file system is too small, and puts that it cannot back go to the file tier
    (TierFull at reserve, never SIGBUS at copy)."""
    with small_tmpfs(tmp_path / "shm", "64k") as shm:
        cfg = Config(model="tiny", shm_bytes=1 << 20, shm_dir=str(shm / "slabs"), file_bytes=16 << 20,
                     file_dir=str(tmp_path / "agg"))
        with CascadeStore(cfg) as s:
            assert [t.name for t in s.tiers] == ["shm", "file"]
            assert "less than the tier's" in caplog.text
            data = {s.put(*block(s.spec, i)): i for i in range(40)}  # 160 KiB: more than the tmpfs holds
            st = s.stats()["tiers"]
            assert st["shm"]["blocks"] > 0 and st["file"]["blocks"] > 0 and s.stats()["rejected"] == 0
            assert all(same(s.get(bid), block(s.spec, i)) for bid, i in data.items())
        assert os.listdir(shm / "slabs") == []  # nothing half-made left behind


def test_bit_flip_in_shm_slab_is_detected_with_verification(tmp_path):
    cfg = Config(model="tiny", shm_bytes=16 * 4096, file_bytes=0, verify_dram_reads=True,
                 file_dir=str(tmp_path))
    with CascadeStore(cfg) as s:
        ids = [s.put(*block(s.spec, i)) for i in range(4)]
        slab = s.tiers[0]
        with open(slab.path, "r+b") as f:  # flip one byte of block 2
            f.seek(slab.offset(("default", ids[2])) + 123)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0x01]))
        assert s.get(ids[2]) is None
        assert s.stats()["tiers"]["shm"]["corruptions"] == 1
        assert all(same(s.get(ids[i]), block(s.spec, i)) for i in (0, 1, 3))


WRITER = textwrap.dedent("""
    import sys, numpy as np
    from cascade import CascadeStore, Config
    cfg = Config(model="tiny", shm_bytes=16 * 4096, file_bytes=1 << 30, file_dir=sys.argv[1],
                 file_segment_bytes=1 << 20)
    s = CascadeStore(cfg)
    print("slab", s.tiers[0].path, flush=True)
    i = int(sys.argv[2])
    while True:
        rng = np.random.default_rng(i)
        k = rng.standard_normal(s.spec.shape).astype(s.spec.dtype)
        v = rng.standard_normal(s.spec.shape).astype(s.spec.dtype)
        print(i, s.put(k, v), flush=True)
        i += 1
""")


@pytest.mark.timeout(240)
def test_sigkill_at_random_points_loses_no_acknowledged_block(tmp_path):
    """Kill a writer at random moments, 12 times over one directory; after each restart
    every acknowledged block is there byte-exact and the dead writer's slab is gone.
    Besides the newest 16, one more block may have sat in the writer's SHM: the one the
    background demoter held (its copy not yet committed) while the put thread, finding
    SHM full, demoted newer blocks past it (they are never more than one: the demoter
    moves one block at a time, and nothing else keeps a block from moving here)."""
    cfg = Config(model="tiny", shm_bytes=16 * 4096, file_bytes=1 << 30, file_dir=str(tmp_path / "agg"),
                 file_segment_bytes=1 << 20)
    rnd = random.Random(7)
    acked: dict[str, int] = {}
    in_shm_at_kill: set[str] = set()  # the newest 16 of each round sat in the writer's SHM
    next_seed = 0
    for _ in range(12):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, cfg.file_dir, str(next_seed)],
                                stdout=subprocess.PIPE, text=True)
        slab = proc.stdout.readline().split()[1]
        deadline = time.monotonic() + rnd.uniform(0.05, 0.6)
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            i, bid = line.split()
            acked[bid] = int(i)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for line in proc.stdout:  # acknowledged before the kill landed
            parts = line.split()
            if len(parts) == 2:
                acked[parts[1]] = int(parts[0])
        next_seed = max(acked.values()) + 1
        in_shm_at_kill |= {b for b, i in acked.items() if i >= next_seed - 16}
        # blocks still in the writer's SHM died with it (cache data may be lost); those
        # demoted to the file tier must all be back
        with CascadeStore(cfg.replace(shm_bytes=0)) as s:
            assert not os.path.exists(slab), "the dead writer's SHM slab was left behind"
            on_file = [b for b in acked if s.contains(b)]
            lost = set(acked) - set(on_file) - in_shm_at_kill
            assert len(lost) <= 1, f"{len(lost) - 1} acknowledged file-tier blocks lost"  # one: the demoter's
            in_shm_at_kill |= lost
            for bid in on_file:
                assert same(s.get(bid), block(s.spec, acked[bid])), bid
    assert len(acked) > 100


def disk_bound(cfg, record_bytes: int) -> int:
    """The documented bound on a file tier's disk use (cascade/tiers/file_tier.py), from the
    config: capacity / (1 - compact_dead_fraction) + max(seal bytes, one record)."""
    seal = max(min(cfg.file_segment_bytes, cfg.file_bytes // 4), 2 * 4096)
    return int(cfg.file_bytes / (1 - cfg.compact_dead_fraction)) + max(seal, record_bytes)


def _ghosts_and_orphans(store) -> tuple[int, int]:
    """(blocks the store maps in a tier that does not hold them, blocks a tier holds that
    the store does not map): both must be 0 after any call returned."""
    mapped = {(key, meta.tier) for key, meta in store._meta.items()}
    held = {(key, t) for t, tier in enumerate(store.tiers) for key in tier}
    return len(mapped - held), len(held - mapped)


def _closes(store, within: float = 60.0) -> bool:
    done = threading.Thread(target=store.close, daemon=True)
    done.start()
    done.join(within)
    return not done.is_alive()


@root_only
@pytest.mark.parametrize("file_blocks", [8192, 56])  # the disk fills first; the tier's capacity fills first
def test_full_disk_get_and_delete_never_raise_and_nothing_comes_back(tmp_path, file_blocks):
    """A file tier on a full file system (a 512 KiB tmpfs holds ~60 records): gets, deletes
    and evictions never raise TierFull, leave no ghost or orphan, close() returns, dead
    space that cannot be compacted is reported, and after a restart no deleted or evicted
    block is served again."""
    with small_tmpfs(tmp_path / "fs", "512k") as fs:
        cfg = Config(model="tiny", shm_bytes=8 * 4096, file_bytes=file_blocks * 8192, file_dir=str(fs / "agg"),
                     file_segment_bytes=1 << 20)
        gone: set[str] = set()  # deleted or evicted: must never be served again
        data: dict[str, int] = {}
        full = False
        for round_ in range(3):  # each reopen seals the last active file: compaction has work
            s = CascadeStore(cfg)
            try:
                for i in range(round_ * 200, round_ * 200 + 200):
                    data[s.put(*block(s.spec, i))] = i
                for n, bid in enumerate(list(data)):
                    if bid in gone:
                        continue
                    if n % 2 == 0 and s.contains(bid):
                        s.delete(bid)  # never TierFull
                        gone.add(bid)
                    got = s.get(bid)  # never TierFull; promotions demote into the full disk
                    if bid in gone:
                        assert got is None, f"deleted block {bid} served"
                    elif got is not None:
                        assert same(got, block(s.spec, data[bid]))
                    assert _ghosts_and_orphans(s) == (0, 0)
                lustre = s.stats()["tiers"]["file"]
                full |= lustre["full_events"] > 0 or lustre["compactions_deferred"] > 0
                # what exceeds the bound is dead space reported as stuck, not piling up unseen
                assert lustre["disk_bytes"] - lustre["dead_bytes_stuck"] <= disk_bound(cfg, 8192)
                gone |= {bid for bid in data if not s.contains(bid)}  # evicted: gone for good
            finally:
                assert _closes(s), "close() hung"
        assert full  # the disk did fill up
        subprocess.run(["mount", "-o", "remount,size=8m", str(fs)], check=True)  # space returns
        with CascadeStore(cfg) as s:
            lustre = s.stats()["tiers"]["file"]
            assert lustre["dead_bytes_stuck"] == 0 and lustre["disk_bytes"] <= disk_bound(cfg, 8192)
            served = [bid for bid in gone if s.get(bid) is not None]
            assert served == [], f"{len(served)} deleted or evicted blocks came back after a restart"
            assert _ghosts_and_orphans(s) == (0, 0)


@root_only
def test_a_store_reopens_on_a_disk_its_blocks_filled_to_the_last_page(tmp_path):
    """The open rewrites the directory's manifest; on a file system with no page left it
    keeps the one there (the layout it checked) instead of failing, and leaves no
    temporary file behind."""
    with small_tmpfs(tmp_path / "fs", "256k") as fs:
        cfg = Config(model="tiny", shm_bytes=8 * 4096, file_bytes=64 << 20, file_dir=str(fs / "agg"),
                     file_segment_bytes=1 << 20, demote_high=1.0)
        with CascadeStore(cfg) as s:
            ids = [s.put(*block(s.spec, i)) for i in range(8)]
        fd = os.open(fs / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            with pytest.raises(OSError):  # ENOSPC: every page that was left is taken
                while True:
                    os.write(fd, b"x" * 4096)
        finally:
            os.close(fd)
        with CascadeStore(cfg) as s:
            assert all(same(s.get(b), block(s.spec, i)) for i, b in enumerate(ids))
        assert [n for n in os.listdir(fs / "agg") if n.endswith(".tmp")] == []


@root_only
def test_compaction_on_a_full_disk_forgets_nothing_and_is_retried(tmp_path):
    """Deletes that make a sealed file due for compaction on a full disk: the delete does
    not raise, every live record stays readable (compaction forgets a record only after
    its copy is durable), the stuck dead space is reported, and compaction runs once
    space returns; a restart serves no deleted block."""
    with small_tmpfs(tmp_path / "fs", "512k") as fs:
        d = str(fs / "agg")
        payload = {("ns", f"{i:032x}"): bytes([i]) * 4096 for i in range(200)}
        tier = FileTier(64 << 20, d, segment_bytes=1 << 20)
        stored = []
        for key, value in payload.items():
            try:
                tier.put(key, [value])
            except TierFull:
                break
            stored.append(key)
        tier.close()
        assert 10 < len(stored) < len(payload)  # the disk filled up
        tier = FileTier(64 << 20, d, segment_bytes=1 << 20)  # the old active file is sealed now
        deleted = stored[: len(stored) * 3 // 4]
        for key in deleted:
            del tier[key]  # never TierFull, although compaction is due and cannot copy
        kept = stored[len(deleted):]
        assert sorted(tier) == sorted(kept)
        assert all(tier[key] == payload[key] for key in kept)  # nothing forgotten, nothing ghosted
        st = tier.stats()
        assert st["compactions_deferred"] > 0 and st["dead_bytes_stuck"] > 0 and st["pending_deletes"] == 0
        subprocess.run(["mount", "-o", "remount,size=8m", str(fs)], check=True)  # space returns
        del tier[kept.pop()]
        deleted.append(stored[len(deleted)])
        st = tier.stats()
        assert st["compactions"] > 0 and st["dead_bytes_stuck"] == 0
        assert all(tier[key] == payload[key] for key in kept)
        tier.close()
        tier = FileTier(64 << 20, d, segment_bytes=1 << 20)
        assert sorted(tier) == sorted(kept)  # no deleted record came back
        tier.close()


def test_a_delete_that_cannot_be_written_is_kept_pending_and_said(tmp_path, monkeypatch, caplog):
    """An I/O error while killing a record in place: the delete still takes effect now,
    is reported (a warning, ``pending_deletes``), and is written by a later change, so a
    restart does not serve the block again."""
    d = str(tmp_path / "agg")
    keys = [("ns", f"{i:032x}") for i in range(3)]
    tier = FileTier(64 << 20, d, segment_bytes=1 << 20)
    for key in keys:
        tier.put(key, [bytes(4096)])
    real_pwrite = os.pwrite

    def failing_pwrite(fd, data, offset):
        raise OSError(5, os.strerror(5))

    monkeypatch.setattr(os, "pwrite", failing_pwrite)
    del tier[keys[0]]
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    assert keys[0] not in tier and tier.stats()["pending_deletes"] == 1
    assert "cannot record a delete" in caplog.text
    del tier[keys[1]]  # a later change writes the pending one too
    assert tier.stats()["pending_deletes"] == 0
    tier.close()
    tier = FileTier(64 << 20, d, segment_bytes=1 << 20)
    assert sorted(tier) == [keys[2]]
    tier.close()
