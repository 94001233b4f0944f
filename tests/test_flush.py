"""flush() makes puts durable without holding the store's lock through the fsyncs: gets
and puts of other threads go on meanwhile; every descriptor it opens for them is closed,
on an fsync error too, which it raises."""
from __future__ import annotations

import errno
import os
import threading

import numpy as np
import pytest

from cascade import CascadeStore, Config


def _stray_fds(s: CascadeStore) -> int:
    """Open descriptors of this process other than those the file tier holds for its files
    and spares, counted with the housekeeper idle (a put may roll over to a spare meanwhile;
    the housekeeper then makes another)."""
    s._housekeeper.wait_idle()
    tier = s.tiers[0]
    held = {str(fd) for f in [*tier._files.values(), *tier._spares] for fd in (f.fd, f.direct_fd) if fd is not None}
    return len(set(os.listdir("/proc/self/fd")) - held)


@pytest.fixture
def store(tmp_path):
    cfg = Config(model="tiny", shm_bytes=0, file_dir=str(tmp_path / "f"), file_segment_bytes=1 << 20)
    with CascadeStore(cfg) as s:
        yield s


def _blocks(s: CascadeStore, count: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(s.spec.shape).astype(s.spec.np_dtype),
             rng.standard_normal(s.spec.shape).astype(s.spec.np_dtype)) for _ in range(count)]


def test_flush_fsyncs_every_file_of_the_tier_outside_the_store_lock(store, monkeypatch):
    s = store
    ids = s.put_many(_blocks(s, 300, 0))  # several segment files
    tier = s.tiers[0]
    files = {os.fstat(f.fd).st_ino for f in tier._files.values()}
    assert len(files) > 1
    real, synced, got = os.fsync, [], []

    def fsync(fd):  # another thread takes the lock, gets and puts while this file is fsynced
        synced.append(os.fstat(fd).st_ino)
        fresh = _blocks(s, 1, len(synced) + 9)[0]
        other = threading.Thread(target=lambda: got.append((s.get(ids[0]) is not None, s.put(*fresh))))
        other.start()
        other.join(5)  # under the lock, it could not end
        real(fd)

    before = _stray_fds(s)
    monkeypatch.setattr(os, "fsync", fsync)
    s.flush()
    monkeypatch.undo()
    assert set(synced) >= files and all(hit for hit, _ in got) and len(got) == len(synced)
    assert _stray_fds(s) == before  # every descriptor opened for the fsyncs is closed
    assert all(s.contains(bid) for _, bid in got)


def test_a_failed_fsync_is_raised_with_every_descriptor_closed_and_the_store_serving(store, monkeypatch):
    s = store
    blocks = _blocks(s, 300, 1)
    ids = s.put_many(blocks)
    calls = []

    def failing(fd):
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(errno.EIO, "injected")

    before = _stray_fds(s)
    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError, match="injected"):
        s.flush()
    monkeypatch.undo()
    assert len(calls) == len(s.tiers[0]._files) + 1 > 2  # the others (the directory too) were still fsynced
    assert _stray_fds(s) == before and len(s._inflight) == 0
    out = s.get(ids[3])
    assert out is not None and np.array_equal(out[1], blocks[3][1])
    s.flush()
