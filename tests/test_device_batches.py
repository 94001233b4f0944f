"""Batches on one stream (issue 24 item 3): ``get_many_into`` with device outputs, and
``put_many`` of device inputs into the GPU tier (committed only after the synchronisation),
enqueue every copy on the buffers' streams and synchronise each stream once, not once per copy;
and what keeps that safe (a copy that may rewrite memory a batch still reads settles the
batch first). Runs without a GPU: HostMemoryCopier records every synchronisation."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from cascade import CascadeStore, Config, buffers
from cascade.models import BlockSpec
from cascade.testing.device_buffers import HostCudaArray, HostDeviceModule, HostMemoryCopier

SHAPE = (2, 2, 16, 16)
N = 8


@pytest.fixture
def copier():
    with buffers.use_device_copier(HostMemoryCopier()) as c:
        yield c


@pytest.fixture
def store(tmp_path):
    cfg = Config(model="tiny", shm_bytes=1 << 20, file_bytes=0, gpu_bytes=0, file_dir=str(tmp_path / "f"))
    with CascadeStore(cfg, block_spec=BlockSpec(SHAPE, np.float16)) as s:
        yield s


def _out(stream: int) -> HostCudaArray:
    return HostCudaArray(np.zeros(SHAPE, np.float16), stream=stream)


def _blocks(store: CascadeStore) -> tuple[list[str], list[np.ndarray]]:
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(SHAPE).astype(np.float16) for _ in range(2 * N)]
    ids = [store.put(HostCudaArray(arrays[2 * i]), HostCudaArray(arrays[2 * i + 1])) for i in range(N)]
    return ids, arrays


@pytest.mark.parametrize("workers", [1, 4])
def test_a_batch_of_device_outputs_synchronises_its_stream_once(store, copier, workers):
    ids, arrays = _blocks(store)
    outs = [(_out(0x5A), _out(0x5A)) for _ in range(N)]
    synced, calls = len(copier.synced), len(copier.calls)
    assert store.get_many_into(ids, outs, max_workers=workers) == [True] * N
    assert copier.synced[synced:] == [0x5A]  # one synchronisation, not 2 x N
    assert [c[2] for c in copier.calls[calls:]] == [0x5A] * 2 * N  # every copy on the caller's stream
    for i, (k, v) in enumerate(outs):
        assert k.array.tobytes() == arrays[2 * i].tobytes() and v.array.tobytes() == arrays[2 * i + 1].tobytes()


def test_each_distinct_stream_is_synchronised_once(store, copier):
    ids, _ = _blocks(store)
    outs = [(_out(0x10 + i % 2), _out(0x10 + i % 2)) for i in range(N)]
    synced = len(copier.synced)
    store.get_many_into(ids, outs, max_workers=3)
    assert sorted(copier.synced[synced:]) == [0x10, 0x11]


def test_single_get_into_still_returns_with_its_bytes_in_place(store, copier):
    ids, arrays = _blocks(store)
    k, v = _out(7), _out(7)
    synced = len(copier.synced)
    assert store.get_into(ids[0], k, v)
    assert copier.synced[synced:] == [7]  # both halves enqueued, their stream synchronised once
    assert v.array.tobytes() == arrays[1].tobytes()


def test_a_batch_of_one_device_output_pair_is_read_as_one_get_into(store, copier):
    """A one-block batch takes get_into's path with the caller's arrays (it once got the
    checked views instead, which get_into refuses: found on an H200 by device_io)."""
    ids, arrays = _blocks(store)
    k, v = _out(9), _out(9)
    synced = len(copier.synced)
    assert store.get_many_into(ids[:1], [(k, v)]) == [True]
    assert copier.synced[synced:] == [9]
    assert k.array.tobytes() == arrays[0].tobytes() and v.array.tobytes() == arrays[1].tobytes()


def test_a_copy_that_may_rewrite_batch_sources_settles_the_batch_first(copier):
    """Another thread's put into a slab range a batch read from must wait for that read."""
    out = HostCudaArray(np.zeros(64, np.uint8), stream=0x33)
    src = np.arange(64, dtype=np.uint8)
    token = buffers.register_pinnable(src)  # stands for a registered SHM slab
    try:
        with buffers.one_sync([out]) as batch:
            batch.bind(buffers.copy)(out, src)
            assert copier.synced == [] and batch.pending
            seen = []

            def rewrite() -> None:  # e.g. a put into the freed range
                buffers.copy(src, np.zeros(64, np.uint8))
                seen.append(list(copier.synced))

            t = threading.Thread(target=rewrite)
            t.start()
            t.join(5)
            assert seen == [[0x33]]  # settled before the rewrite ran
        assert copier.synced == [0x33]  # and not again at the end
    finally:
        buffers.forget_pinnable(token)


def test_failed_batch_synchronisation_is_raised_and_the_store_keeps_serving(store, copier):
    ids, arrays = _blocks(store)
    outs = [(_out(9), _out(9)) for _ in range(N)]
    copier.fail_sync = RuntimeError("cudaErrorLaunchFailure (injected)")
    with pytest.raises(RuntimeError, match="injected"):
        store.get_many_into(ids, outs, max_workers=2)
    assert store.get_many_into(ids, outs, max_workers=2) == [True] * N
    assert outs[-1][1].array.tobytes() == arrays[-1].tobytes()
    copier.fail = RuntimeError("cudaErrorIllegalAddress (injected)")
    with pytest.raises(RuntimeError, match="injected"):
        store.get_many_into(ids, outs)
    closing = threading.Thread(target=store.close, daemon=True)
    closing.start()
    closing.join(3)
    assert not closing.is_alive(), "close() is still waiting after a failed batch"


def test_a_copy_into_settled_memory_runs_on_the_inputs_stream_alone(copier):
    """A tier slab names no stream (buffers.settled): a put from the caller's stream is
    one copy and one synchronisation there, not a wait on the caller's stream first."""
    src = HostCudaArray(np.arange(64, dtype=np.uint8), stream=0x55)
    dst = HostCudaArray(np.zeros(64, np.uint8), stream=0x44)
    buffers.copy(buffers.settled(dst), src)
    assert copier.calls == [("d2d", 64, 0x55)] and copier.synced == [0x55]
    buffers.copy(dst, src)  # an output with a stream of its own: the input's stream is waited for first
    assert copier.calls[-1] == ("d2d", 64, 0x44) and copier.synced[1:] == [0x55, 0x44]
    assert dst.array.tobytes() == src.array.tobytes()


@pytest.fixture
def gpu_store(tmp_path, copier):
    cfg = Config(model="tiny", shm_bytes=1 << 20, file_bytes=0, gpu_bytes=1 << 20, file_dir=str(tmp_path / "f"))
    with CascadeStore(cfg, block_spec=BlockSpec(SHAPE, np.float16), array_module=HostDeviceModule()) as s:
        assert s.tiers[0].name == "gpu"
        yield s


def _device_pairs(stream: int) -> tuple[list[tuple[HostCudaArray, HostCudaArray]], list[np.ndarray]]:
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal(SHAPE).astype(np.float16) for _ in range(2 * N)]
    return [(HostCudaArray(arrays[2 * i], stream=stream), HostCudaArray(arrays[2 * i + 1], stream=stream))
            for i in range(N)], arrays


def test_a_put_many_of_device_blocks_synchronises_each_stream_once(gpu_store, copier):
    pairs, arrays = _device_pairs(0x61)
    pairs[N // 2:] = [(HostCudaArray(k.array, stream=0x62), HostCudaArray(v.array, stream=0x62))
                      for k, v in pairs[N // 2:]]
    ids = [f"{i:032x}" for i in range(N)]
    synced, calls = len(copier.synced), len(copier.calls)
    assert gpu_store.put_many(pairs, block_ids=ids) == ids
    assert sorted(copier.synced[synced:]) == [0x61, 0x62]  # one per stream, not one per copy
    assert [c[0] for c in copier.calls[calls:]] == ["d2d"] * 2 * N  # straight into the device slab
    for i, bid in enumerate(ids):
        k, v = gpu_store.get(bid)
        assert k.tobytes() == arrays[2 * i].tobytes() and v.tobytes() == arrays[2 * i + 1].tobytes()


def test_a_failed_put_many_synchronisation_stores_none_of_the_batch(gpu_store, copier):
    pairs, arrays = _device_pairs(0x71)
    ids = [f"{i:032x}" for i in range(N)]
    copier.fail_sync = RuntimeError("cudaErrorLaunchFailure (injected)")
    with pytest.raises(RuntimeError, match="injected"):
        gpu_store.put_many(pairs, block_ids=ids)
    assert gpu_store.contains_many(ids) == [False] * N  # no block with unfinished bytes is visible
    assert gpu_store.tiers[0].used == 0  # and every reservation was given back
    copier.fail = RuntimeError("cudaErrorIllegalAddress (injected)")
    with pytest.raises(RuntimeError, match="injected"):
        gpu_store.put_many(pairs, block_ids=ids)
    assert gpu_store.contains_many(ids) == [False] * N
    assert gpu_store.put_many(pairs, block_ids=ids) == ids  # the store keeps serving
    k, v = gpu_store.get(ids[-1])
    assert v.tobytes() == arrays[-1].tobytes()
    closing = threading.Thread(target=gpu_store.close, daemon=True)
    closing.start()
    closing.join(3)
    assert not closing.is_alive(), "close() is still waiting after a failed put batch"


def test_a_batch_whose_streams_another_thread_failed_to_synchronise_fails_too(copier):
    """The failure of a settle run by another thread's copy still fails the batch: a put
    batch must not commit after it."""
    src = HostCudaArray(np.arange(64, dtype=np.uint8), stream=0x81)
    room = buffers.settled(HostCudaArray(np.zeros(64, np.uint8)))
    with pytest.raises(RuntimeError, match="injected"):
        with buffers.one_sync([src], sources=True) as batch:
            batch.bind(buffers.copy)(room, src)
            assert copier.synced == [] and batch.pending  # only enqueued
            copier.fail_sync = RuntimeError("cudaErrorLaunchFailure (injected)")
            errors = []
            t = threading.Thread(target=lambda: _copy_catching(errors))
            t.start()
            t.join(5)
            assert errors and not batch.pending  # the other thread met the failure
    assert copier.synced == []


def _copy_catching(errors: list) -> None:
    try:
        buffers.copy(np.zeros(8, np.uint8), np.ones(8, np.uint8))  # any copy settles open batches first
    except RuntimeError as exc:
        errors.append(exc)


class _FailsAt(HostMemoryCopier):
    """Fails the copy number ``at`` (counted from 0) once."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.tried = at, 0

    def memcpy_async(self, *args) -> None:
        self.tried += 1
        if self.tried - 1 == self.at:
            raise RuntimeError("cudaErrorIllegalAddress (injected)")
        super().memcpy_async(*args)


@pytest.mark.parametrize("tier", ["gpu", "shm"])
def test_a_copy_failing_inside_a_device_batch_ends_every_lease_and_count(tier, tmp_path):
    """A device batch reads its SHM and GPU blocks through leases taken in one locked
    step: a copy failing midway raises, leaves no lease, reader or in-flight count held
    (deletes pass, close() returns), counts every get, and the store keeps serving."""
    failing = _FailsAt(-1)
    with buffers.use_device_copier(failing):
        cfg = Config(model="tiny", shm_bytes=1 << 20, file_bytes=0, gpu_bytes=(1 << 20) if tier == "gpu" else 0,
                     file_dir=str(tmp_path / "f"))
        store = CascadeStore(cfg, block_spec=BlockSpec(SHAPE, np.float16),
                             array_module=HostDeviceModule() if tier == "gpu" else None)
        rng = np.random.default_rng(11)
        arrays = [rng.standard_normal(SHAPE).astype(np.float16) for _ in range(2 * N)]
        ids = [store.put(arrays[2 * i], arrays[2 * i + 1]) for i in range(N)]  # host inputs: no device copy
        assert {t: s["blocks"] for t, s in store.stats()["tiers"].items() if s["blocks"]} == {tier: N}
        outs = [(_out(0x21), _out(0x21)) for _ in range(N)]
        failing.at = failing.tried + 5  # the third block's value
        with pytest.raises(RuntimeError, match="injected"):
            store.get_many_into(ids, outs)
        c = store.counters
        assert c.gets == c.misses == N and c.hits == 0, c  # the call raised: no get of it counts as a hit
        assert store.get_many_into(ids, outs) == [True] * N
        assert [o[1].array.tobytes() for o in outs] == [arrays[2 * i + 1].tobytes() for i in range(N)]
        for b in ids:
            store.delete(b)
        assert len(store) == 0 and store.tiers[0].stats()["allocated"] == 0  # a lease left held keeps its room
        closing = threading.Thread(target=store.close, daemon=True)
        closing.start()
        closing.join(3)
        assert not closing.is_alive(), "close() is still waiting after a failed device batch"
