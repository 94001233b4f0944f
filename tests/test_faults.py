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
import time
from contextlib import contextmanager

import numpy as np
import pytest

from cascade import CascadeStore, Config

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
            newest = list(data)[-8:]  # still in SHM
            assert all(s.contains(b) for b in newest)
            wrong = sum(1 for bid, i in data.items() if (g := s.get(bid)) is not None and not same(g, block(s.spec, i)))
            assert wrong == 0
            on_file = s.stats()["tiers"]["file"]["blocks"]
            subprocess.run(["mount", "-o", "remount,size=8m", str(fs)], check=True)  # space returns
            for i in range(200, 300):
                data[s.put(*block(s.spec, i))] = i
            assert s.stats()["tiers"]["file"]["blocks"] > on_file + 50
            wrong = sum(1 for bid, i in data.items() if (g := s.get(bid)) is not None and not same(g, block(s.spec, i)))
            assert wrong == 0


@root_only
def test_full_dev_shm_runs_on_the_other_tiers(tmp_path, caplog):
    with small_tmpfs(tmp_path / "shm", "64k") as shm:
        cfg = Config(model="tiny", shm_bytes=1 << 20, shm_dir=str(shm), file_bytes=16 << 20,
                     file_dir=str(tmp_path / "agg"))
        with CascadeStore(cfg) as s:
            assert [t.name for t in s.tiers] == ["file"]
            assert "SHM tier off" in caplog.text
            bid = s.put(*block(s.spec, 1))
            assert same(s.get(bid), block(s.spec, 1))
        assert os.listdir(shm) == []  # nothing half-made left behind


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
    every acknowledged block is there byte-exact and the dead writer's slab is gone."""
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
            lost = set(acked) - set(on_file)
            assert lost <= in_shm_at_kill, f"{len(lost - in_shm_at_kill)} acknowledged file-tier blocks lost"
            for bid in on_file:
                assert same(s.get(bid), block(s.spec, acked[bid])), bid
    assert len(acked) > 100
