"""The file tier never serves corrupted bytes, and a restarted store finds its blocks."""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from cascade import CascadeStore, Config


def file_only(tmp_path) -> Config:
    return Config(model="tiny", shm_bytes=0, file_bytes=64 << 20, file_dir=str(tmp_path / "agg"),
                  file_segment_bytes=1 << 20)


def blocks(spec, n, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(spec.shape).astype(spec.dtype),
             rng.standard_normal(spec.shape).astype(spec.dtype)) for _ in range(n)]


def agg_files(cfg):
    return sorted(glob.glob(os.path.join(cfg.file_dir, "agg_rank000_*.bin")))


def test_bit_flips_and_truncation_are_counted_misses(tmp_path):
    cfg = file_only(tmp_path).replace(file_segment_bytes=1 << 20)
    with CascadeStore(cfg) as s:
        data = blocks(s.spec, 300)
        ids = [s.put(k, v) for k, v in data]
        files = [f for f in agg_files(cfg) if os.path.getsize(f)]
        assert len(files) >= 2
        # flip payload bytes of the first record of file 0 (header is 4096 bytes)
        with open(files[0], "r+b") as f:
            f.seek(4096 + 100)
            byte = f.read(1)
            f.seek(4096 + 100)
            f.write(bytes([byte[0] ^ 0xFF]))
        # truncate file 1 in the middle of its last record
        os.truncate(files[1], os.path.getsize(files[1]) - 2048)
        served_wrong = corrupt = 0
        for bid, (k, v) in zip(ids, data):
            got = s.get(bid)
            if got is None:
                corrupt += 1
            elif not (np.array_equal(got[0], k) and np.array_equal(got[1], v)):
                served_wrong += 1
        assert served_wrong == 0
        assert corrupt == 2
        assert s.stats()["tiers"]["file"]["corruptions"] == 2
        assert s.stats()["misses"] == 2


def test_a_corrupt_record_that_compaction_drops_is_a_counted_miss(tmp_path):
    """Compaction verifies what it copies and drops a corrupt record; the store's index
    must drop it too (before, a get of it raised BlockNotFound: index and tier disagreed)."""
    cfg = file_only(tmp_path)
    with CascadeStore(cfg) as s:
        data = blocks(s.spec, 300)
        ids = [s.put(k, v) for k, v in data]
        first = agg_files(cfg)[0]
        with open(first, "r+b") as f:  # flip a payload byte of the file's first record
            f.seek(4096 + 100)
            byte = f.read(1)
            f.seek(4096 + 100)
            f.write(bytes([byte[0] ^ 0xFF]))
        compactions = s.stats()["tiers"]["file"]["compactions"]
        for bid in ids[1:]:  # the rest of the first file dies: it is compacted (in the background)
            s.delete(bid)
            s.flush()  # waits for the compaction a delete asked for
            if s.stats()["tiers"]["file"]["compactions"] > compactions:
                break
        assert s.stats()["tiers"]["file"]["compactions"] > compactions
        assert not os.path.exists(first)
        assert not s.contains(ids[0])
        assert s.get(ids[0]) is None
        assert s.stats()["tiers"]["file"]["corruptions"] == 1
        survivors = [(bid, d) for bid, d in zip(ids, data) if s.contains(bid)]
        assert survivors
        for bid, (k, v) in survivors:
            got = s.get(bid)
            assert got is not None and np.array_equal(got[0], k) and np.array_equal(got[1], v)


def test_header_corruption_found_at_restart(tmp_path):
    cfg = file_only(tmp_path)
    with CascadeStore(cfg) as s:
        data = blocks(s.spec, 20, seed=1)
        ids = [s.put(k, v) for k, v in data]
    path = agg_files(cfg)[0]
    record = 4096 + 4096  # tiny-model record: header page + one payload page
    with open(path, "r+b") as f:  # break the header of record 5
        f.seek(5 * record + 20)
        f.write(b"\xff\xff")
    with CascadeStore(cfg) as s:
        assert s.stats()["tiers"]["file"]["bad_headers"] >= 1
        present = [s.get(b) is not None for b in ids]
        assert present.count(False) == 1 and not present[5]
        for bid, (k, v), ok in zip(ids, data, present):
            if ok:
                got = s.get(bid)
                assert np.array_equal(got[0], k) and np.array_equal(got[1], v)


def test_reopen_finds_every_block_with_its_parent(tmp_path):
    cfg = file_only(tmp_path)
    with CascadeStore(cfg) as s:
        data = blocks(s.spec, 50, seed=2)
        ids = s.put_many(data, chain=True)
        s.delete(ids[-1])
    with CascadeStore(cfg) as s:
        assert len(s) == 49 and s.longest_prefix(ids) == 49
        assert s.stats()["tiers"]["file"]["recovered"] == 49
        for bid, (k, v) in zip(ids[:-1], data):
            got = s.get(bid)
            assert np.array_equal(got[0], k) and np.array_equal(got[1], v)
        assert s._meta[("default", ids[10])].parent == ids[9]


def test_demoted_blocks_survive_restart(tmp_path, tiny_config):
    with CascadeStore(tiny_config) as s:
        data = blocks(s.spec, 100, seed=3)
        ids = [s.put(k, v) for k, v in data]
        on_file = [b for b in ids if s._meta[("default", b)].tier == 1]
    assert len(on_file) >= 36
    with CascadeStore(tiny_config) as s:
        assert all(s.contains(b) for b in on_file)


WRITER = textwrap.dedent("""
    import sys, numpy as np
    from cascade import CascadeStore, Config
    cfg = Config(model="tiny", shm_bytes=0, file_bytes=1 << 30, file_dir=sys.argv[1], file_segment_bytes=1 << 20)
    s = CascadeStore(cfg)
    i = 0
    while True:
        rng = np.random.default_rng(i)
        k = rng.standard_normal(s.spec.shape).astype(s.spec.dtype)
        v = rng.standard_normal(s.spec.shape).astype(s.spec.dtype)
        bid = s.put(k, v)
        print(i, bid, flush=True)   # acknowledged: put returned
        i += 1
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kill_after", [50, 333, 1200])
def test_sigkill_mid_write_loses_no_acknowledged_block(tmp_path, kill_after):
    cfg = file_only(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", WRITER, cfg.file_dir], stdout=subprocess.PIPE, text=True)
    acked = []
    for line in proc.stdout:
        i, bid = line.split()
        acked.append((int(i), bid))
        if len(acked) >= kill_after:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with CascadeStore(cfg) as s:
        for i, bid in acked:
            rng = np.random.default_rng(i)
            k = rng.standard_normal(s.spec.shape).astype(s.spec.dtype)
            v = rng.standard_normal(s.spec.shape).astype(s.spec.dtype)
            got = s.get(bid)
            assert got is not None, f"acknowledged block {i} lost"
            assert np.array_equal(got[0], k) and np.array_equal(got[1], v)


def test_reopen_with_other_block_size_is_a_clear_error(tmp_path):
    from cascade import ConfigError

    cfg = file_only(tmp_path)
    with CascadeStore(cfg) as s:
        s.put(*blocks(s.spec, 1)[0])
    with pytest.raises(ConfigError, match="use another file_dir"):
        CascadeStore(cfg.replace(block_tokens=32))
    with CascadeStore(cfg) as s:  # nothing was lost by the refused open
        assert len(s) == 1


def test_reopen_with_smaller_capacity_sheds_blocks(tmp_path):
    cfg = file_only(tmp_path)
    with CascadeStore(cfg) as s:
        ids = s.put_many(blocks(s.spec, 40, seed=9), chain=True)
    small = cfg.replace(file_bytes=10 * 8192)
    with CascadeStore(small) as s:
        assert len(s) == 10 and s.tiers[0].free >= 0
        assert s.longest_prefix(ids) == 10  # leaf-first: the chain's head survived


def test_flush_fsyncs_every_aggregated_file(tmp_path, monkeypatch):
    cfg = file_only(tmp_path)
    synced = []
    real_fsync = os.fsync
    with CascadeStore(cfg) as s:
        for k, v in blocks(s.spec, 300, seed=11):  # several 1 MiB segments
            s.put(k, v)
        files = len(s.tiers[0]._files)
        monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
        s.flush()
    assert files >= 2 and len(synced) == files + 1  # and the directory: the new files' names last too


def _on_disk(directory: str) -> int:
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(directory, "agg_rank000_*.bin")))


@pytest.mark.parametrize("fraction", [0.2, 0.5, 0.9])
def test_disk_use_stays_within_the_documented_multiple_of_file_bytes(tmp_path, fraction):
    """Churn (puts that evict, deletes, re-puts) on an 80 KiB file tier: the files on disk
    never exceed file_bytes / (1 - compact_dead_fraction) + max(seal bytes, one record),
    seal bytes = min(file_segment_bytes, file_bytes / 4) (cascade/tiers/file_tier.py),
    once the compactions asked for have ended (they run in the background; flush waits)."""
    record = 8192  # a tiny-model block (4 KiB) with its header page
    cfg = Config(model="tiny", shm_bytes=0, file_bytes=10 * record, file_dir=str(tmp_path / "agg"),
                 file_segment_bytes=1 << 30, compact_dead_fraction=fraction)
    seal = max(min(cfg.file_segment_bytes, cfg.file_bytes // 4), 2 * 4096)
    bound = int(cfg.file_bytes / (1 - cfg.compact_dead_fraction)) + max(seal, record)
    rng = np.random.default_rng(5)
    peak = 0
    with CascadeStore(cfg) as s:
        data = blocks(s.spec, 64)
        ids = []
        for step in range(600):
            n = int(rng.integers(0, len(data)))
            if ids and rng.random() < 0.3:
                bid = ids[int(rng.integers(0, len(ids)))]
                if s.contains(bid):
                    s.delete(bid)
            else:
                ids.append(s.put(*data[n]))
            s.flush()
            peak = max(peak, _on_disk(cfg.file_dir))
        assert s.stats()["tiers"]["file"]["evictions"] > 0 and s.stats()["deletes"] > 0
    assert peak <= bound, f"{peak} bytes on disk for a {cfg.file_bytes}-byte tier (bound {bound})"


def test_a_copy_left_by_a_crash_mid_compaction_does_not_bring_a_deleted_block_back(tmp_path):
    """A crash after compaction copied a file's records but before it unlinked the file
    leaves every record twice. Deleting such a block and compacting the copy away must
    not let the older copy come back at the next restart."""
    from cascade.tiers.file_tier import FileTier

    d = str(tmp_path / "agg")
    keys = [("ns", f"{i:032x}") for i in range(3)]
    tier = FileTier(64 << 20, d, segment_bytes=1 << 20)
    for i, key in enumerate(keys):
        tier.put(key, [bytes([i + 1]) * 4096])
    tier.close()
    with open(os.path.join(d, "agg_rank000_000001.bin"), "rb") as src:  # the first record was copied
        first = src.read(8192)
    with open(os.path.join(d, "agg_rank000_000009.bin"), "wb") as dst:
        dst.write(first)
    tier = FileTier(64 << 20, d, segment_bytes=1 << 20)
    assert sorted(tier) == sorted(keys)
    del tier[keys[0]]  # nothing live is left in file 9: compaction drops it
    assert not os.path.exists(os.path.join(d, "agg_rank000_000009.bin"))
    tier.close()
    tier = FileTier(64 << 20, d, segment_bytes=1 << 20)
    try:
        assert sorted(tier) == sorted(keys[1:])
        assert [tier[k] for k in keys[1:]] == [bytes([2]) * 4096, bytes([3]) * 4096]
    finally:
        tier.close()
