"""Pinned staging (issue 24 item 2): host <-> device copies go through one pinned arena,
allocated once and sub-allocated, or straight through the SHM slab registered with the
driver; never through fresh pageable memory. Runs without a GPU: HostMemoryCopier's
"pinned" memory is host memory it counts, and it records every copy's pointers."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from cascade import CascadeStore, Config, buffers
from cascade.models import BlockSpec
from cascade.testing.device_buffers import HostCudaArray, HostMemoryCopier

ARENA = 1 << 20
SHAPE = (2, 2, 16, 16)


@pytest.fixture
def copier():
    with buffers.use_device_copier(HostMemoryCopier(), staging_bytes=ARENA) as c:
        yield c


def _in(ptr: int, arr: np.ndarray) -> bool:
    start = int(arr.ctypes.data)
    return start <= ptr < start + arr.nbytes


def test_pageable_copies_stage_through_one_arena_allocated_once(copier):
    arena = buffers.staging_arena()
    src = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)
    for _ in range(5):
        dev, back = HostCudaArray(np.zeros(4096, np.uint8)), np.zeros(4096, np.uint8)
        buffers.copy(dev, src)
        buffers.copy(back, dev)
        assert back.tobytes() == src.tobytes()
    assert copier.pinned_allocs == [ARENA]  # pinned once, lazily
    h2d = [p for c, p in zip(copier.calls, copier.pointers) if c[0] == "h2d"]
    d2h = [p for c, p in zip(copier.calls, copier.pointers) if c[0] == "d2h"]
    assert len(h2d) == len(d2h) == 5
    assert all(_in(src_ptr, arena.memory) for _, src_ptr in h2d)  # the DMA reads pinned memory
    assert all(_in(dst_ptr, arena.memory) for dst_ptr, _ in d2h)
    assert arena.stats["fallbacks"] == 0


@pytest.mark.parametrize("n", [ARENA // 4 + 1, 3 * ARENA + 123])
def test_copies_larger_than_a_quarter_of_the_arena_are_chunked_through_it(copier, n):
    arena = buffers.staging_arena()
    src = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    dev, back = HostCudaArray(np.zeros(n, np.uint8)), np.zeros(n, np.uint8)
    buffers.copy(dev, src)
    buffers.copy(back, dev)
    assert back.tobytes() == src.tobytes() and dev.array.tobytes() == src.tobytes()
    chunk = ARENA // 8
    assert max(c[1] for c in copier.calls) == chunk
    assert len(copier.calls) == 2 * -(-n // chunk)
    h2d_sources = [src for (d, _, _), (_, src) in zip(copier.calls, copier.pointers) if d == "h2d"]
    assert h2d_sources and all(_in(src, arena.memory) for src in h2d_sources)
    assert copier.pinned_allocs == [ARENA]


def test_concurrent_leases_get_disjoint_slices(copier):
    arena, held, n_threads = buffers.staging_arena(), [], 8
    ready = threading.Barrier(n_threads)
    lock = threading.Lock()

    def take(i: int) -> None:
        with arena.lease(ARENA // n_threads - 64) as slot:
            slot[:] = i
            with lock:
                held.append((int(slot.ctypes.data), slot.nbytes))
            ready.wait(5)  # every lease is held at once here
            assert (slot == i).all()  # nobody else wrote into it

    threads = [threading.Thread(target=take, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    spans = sorted(held)
    assert len(spans) == n_threads
    assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:]))
    assert copier.pinned_allocs == [ARENA] and arena.stats["leases"] == n_threads


def test_a_full_arena_waits_then_falls_back_without_hanging(copier):
    arena = buffers.staging_arena()
    with arena.lease(ARENA) as whole:
        assert whole is not None
        with arena.lease(64, wait_s=0.05) as none:
            assert none is None
        src, dev = np.arange(256, dtype=np.uint8), HostCudaArray(np.zeros(256, np.uint8))
        got = []
        t = threading.Thread(target=lambda: got.append(buffers.copy(dev, src)))
        t.start()
    t.join(5)  # the copy waited for the room given back above
    assert got == [256] and dev.array.tobytes() == src.tobytes()
    assert arena.stats["fallbacks"] == 1 and arena.stats["waits"] >= 1


def _store(tmp_path, **settings) -> CascadeStore:
    cfg = Config(model="tiny", file_dir=str(tmp_path / "files"), file_segment_bytes=1 << 20,
                 **{"shm_bytes": 0, "file_bytes": 0, "gpu_bytes": 0, **settings})
    return CascadeStore(cfg, block_spec=BlockSpec(SHAPE, np.float16), array_module=np)


def test_shm_slab_is_registered_once_on_first_device_copy_and_unregistered_at_close(tmp_path, copier):
    key, value = np.random.default_rng(1).standard_normal((2, *SHAPE)).astype(np.float16)
    store = _store(tmp_path, shm_bytes=1 << 20)
    slab = store.tiers[0]._bytes
    assert copier.registered == {}  # nothing pinned before a device copy
    ids = [store.put(HostCudaArray(key + i), HostCudaArray(value)) for i in range(3)]
    assert copier.registered == {int(slab.ctypes.data): slab.nbytes}
    for i, bid in enumerate(ids):
        k_out, v_out = HostCudaArray(np.zeros_like(key)), HostCudaArray(np.zeros_like(value))
        assert store.get_into(bid, k_out, v_out)
        assert k_out.array.tobytes() == (key + i).tobytes() and v_out.array.tobytes() == value.tobytes()
    # the slab's copies are DMA'd straight from and to it: no slab copy went through the arena
    slab_ends = [p for c, p in zip(copier.calls, copier.pointers)
                 if (c[0] == "h2d" and _in(p[1], slab)) or (c[0] == "d2h" and _in(p[0], slab))]
    assert len(slab_ends) == 2 * 3 * 2  # put in, read out; key and value; 3 blocks
    assert len(copier.registered) == 1
    store.close()
    assert copier.registered == {} and copier.unregistered == [int(slab.ctypes.data)]


def test_a_slab_the_driver_cannot_register_is_staged_instead(tmp_path, copier):
    copier.fail_register = RuntimeError("cudaErrorHostMemoryAlreadyRegistered (injected)")
    key = np.ones(SHAPE, np.float16)
    with _store(tmp_path, shm_bytes=1 << 20) as store:
        bid = store.put(HostCudaArray(key), HostCudaArray(key * 2))
        k_out, v_out = HostCudaArray(np.zeros_like(key)), HostCudaArray(np.zeros_like(key))
        assert store.get_into(bid, k_out, v_out) and v_out.array.tobytes() == (key * 2).tobytes()
        arena = buffers.staging_arena()
        assert all(_in(p[1], arena.memory) for c, p in zip(copier.calls, copier.pointers) if c[0] == "h2d")
    assert copier.registered == {} and copier.unregistered == []


def test_demotions_of_device_blocks_use_the_arena_not_fresh_memory(tmp_path, copier):
    """A GPU tier holding one block: a second put demotes the first to SHM through an
    arena buffer (the numpy-backed GPU tier stands for device memory). The background
    demoter is off: with it on, the first put alone starts moving its block, and a second
    put that comes while that move holds the block finds no victim and lands in SHM."""
    block = 2 * int(np.prod(SHAPE)) * 2
    key = np.random.default_rng(2).standard_normal(SHAPE).astype(np.float16)
    with _store(tmp_path, gpu_bytes=block, shm_bytes=1 << 20, demote_high=1.0) as store:
        arena = buffers.staging_arena()
        first = store.put(key, key)
        leases = arena.stats["leases"]
        store.put(key + 1, key)
        assert arena.stats["leases"] == leases + 1  # the demotion's buffer
        assert store.stats()["tiers"]["shm"]["blocks"] == 1
        assert store.get(first)[0].tobytes() == key.tobytes()


def test_staging_buffers_stay_plain_memory_in_a_process_without_device_copies(tmp_path):
    with buffers.staging_buffer(64, device=True) as buf:
        assert buf.nbytes == 64  # no copier made, no cupy needed


@pytest.mark.parametrize("to_device", [True, False])
def test_a_failed_chunked_copy_gives_its_arena_slice_back(copier, to_device):
    n = 3 * ARENA
    host, dev = np.ones(n, np.uint8), HostCudaArray(np.ones(n, np.uint8))
    copier.fail = RuntimeError("cudaErrorLaunchFailure (injected)")
    with pytest.raises(RuntimeError, match="injected"):
        buffers.copy(dev, host) if to_device else buffers.copy(host, dev)
    with buffers.staging_arena().lease(ARENA, wait_s=0) as whole:
        assert whole is not None  # nothing of the arena is still held


def test_a_failed_synchronisation_leaves_the_store_serving_and_closable(tmp_path, copier):
    key = np.ones(SHAPE, np.float16)
    store = _store(tmp_path, shm_bytes=1 << 20, file_bytes=1 << 20)
    bid = store.put(key, key)
    for fail_at in ("copy", "sync"):
        if fail_at == "copy":
            copier.fail = RuntimeError("cudaErrorIllegalAddress (injected)")
        else:
            copier.fail_sync = RuntimeError("cudaErrorIllegalAddress (injected)")
        with pytest.raises(RuntimeError, match="injected"):
            store.get_into(bid, HostCudaArray(np.empty_like(key)), HostCudaArray(np.empty_like(key)))
    k_out = HostCudaArray(np.empty_like(key))
    assert store.get_into(bid, k_out, HostCudaArray(np.empty_like(key)))
    assert k_out.array.tobytes() == key.tobytes()
    with buffers.staging_arena().lease(ARENA, wait_s=0) as whole:
        assert whole is not None
    closing = threading.Thread(target=store.close, daemon=True)
    closing.start()
    closing.join(3)
    assert not closing.is_alive(), "close() is still waiting after a failed device copy"
    assert copier.registered == {}
