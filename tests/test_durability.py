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
    assert files >= 2 and len(synced) == files
