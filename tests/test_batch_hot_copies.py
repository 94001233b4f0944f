"""A batch's hot copies made in one go (cascade.buffers.hostcopy.copy_out_many, shared
with the copy helper thread from splitcopy.BATCH_SPLIT_MIN on; ReadPath.read_hot_many's
gathered copies): each job is checked before any byte moves and a refused one writes
nothing, a shared batch comes out as one thread's, and a store's batch gets return the
same bytes and counts with the copies gathered, refused or failing."""
from __future__ import annotations

import numpy as np
import pytest

from cascade import CascadeStore, Config
from cascade.buffers import hostcopy, splitcopy
from cascade.models import BlockSpec
from cascade.tiers import shm

MANY = {"compiled": hostcopy.copy_out_many, "python": hostcopy.copy_out_many_python}


@pytest.fixture(params=list(MANY))
def copy_many(request):
    if request.param == "compiled" and not hostcopy.COMPILED:
        pytest.skip("not built here (test_hostcopy.test_the_compiled_copies_were_built says why)")
    return MANY[request.param]


def filled_slab(nbytes: int) -> memoryview:
    return memoryview(bytearray(np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8).tobytes()))


def _read_only(n: int) -> np.ndarray:
    out = np.zeros(n, np.uint8)
    out.flags.writeable = False
    return out


@pytest.mark.parametrize("job_bytes", [4096, 256 << 10])  # under and over the compiled copy's lock release
def test_copy_out_many_copies_every_job_and_refuses_each_bad_one_alone(copy_many, job_bytes):
    slab = filled_slab(16 * job_bytes)
    half = job_bytes // 2
    outs = [[np.full(half, 9, np.uint8), np.full(half, 9, np.uint8)] for _ in range(6)]
    outs[1] = [np.full(half, 9, np.uint8), np.full(half - 1, 9, np.uint8)]  # short
    outs[3] = [np.full(half, 9, np.uint8), _read_only(half)]  # not writable
    outs[4] = [np.full(half, 9, np.uint8), object()]  # no buffer
    jobs = [(i * job_bytes, (i + 1) * job_bytes, o) for i, o in enumerate(outs)]
    assert copy_many(slab, jobs) == [True, False, True, False, False, True]
    for i, o in enumerate(outs):
        if i in (0, 2, 5):
            assert o[0].tobytes() + o[1].tobytes() == bytes(slab[i * job_bytes:(i + 1) * job_bytes])
        else:
            assert o[0].tobytes() == bytes([9]) * half  # nothing written for a refused job


def test_copy_out_many_checks_every_range_before_it_copies(copy_many):
    slab = filled_slab(1 << 16)
    good = np.zeros(4096, np.uint8)
    with pytest.raises(ValueError, match="outside a slab"):
        copy_many(slab, [(0, 4096, [good]), ((1 << 16) - 2048, (1 << 16) + 2048, [np.zeros(4096, np.uint8)])])
    assert not good.any()
    assert copy_many(slab, []) == []


@pytest.mark.parametrize("jobs, job_bytes", [(64, 64 << 10), (3, 1 << 20), (33, 96 << 10)])
def test_a_shared_batch_copies_the_same_as_one_thread(copy_many, jobs, job_bytes):
    slab = filled_slab(jobs * job_bytes)
    outs = [[np.zeros(job_bytes, np.uint8)] for _ in range(jobs)]
    outs[jobs // 2] = [np.zeros(job_bytes - 1, np.uint8)]  # refused: its verdict stays in its place
    verdicts = copy_many(slab, [(i * job_bytes, (i + 1) * job_bytes, o) for i, o in enumerate(outs)], True)
    assert verdicts == [i != jobs // 2 for i in range(jobs)]
    for i, (out,) in enumerate(outs):
        if i != jobs // 2:
            assert out.tobytes() == bytes(slab[i * job_bytes:(i + 1) * job_bytes])
    assert not outs[jobs // 2][0].any()


# -- a store's batch gets ------------------------------------------------------------------
SPEC = BlockSpec.flat(64 << 10)
COUNT = 2 * splitcopy.BATCH_SPLIT_MIN // SPEC.block_bytes  # a batch big enough to gather its copies


def block(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(n)
    return tuple(rng.integers(0, 256, SPEC.shape, dtype=np.uint8) for _ in range(2))


def ids(count: int = COUNT) -> list[str]:
    return [f"{n + 1:032x}" for n in range(count)]


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setattr(splitcopy, "ENABLED", True)
    monkeypatch.setattr(shm, "SPLITS", True)  # defers_hot_copies, set when the tier opens
    cfg = Config(shm_bytes=2 * COUNT * SPEC.block_bytes + (1 << 20), file_bytes=0, remote_bytes=0,
                 shm_dir=str(tmp_path))
    with CascadeStore(cfg, block_spec=SPEC) as opened:
        assert opened.tiers[0].defers_hot_copies
        opened.put_many([block(n) for n in range(COUNT)], block_ids=ids())
        yield opened


def exact(outs: list) -> bool:
    return all(np.array_equal(k, block(n)[0]) and np.array_equal(v, block(n)[1]) for n, (k, v) in enumerate(outs))


def test_a_big_hot_batch_gathers_its_copies_and_reads_exactly(store, monkeypatch):
    gathered: list[int] = []
    real = store.tiers[0].copy_hot_jobs
    monkeypatch.setattr(store.tiers[0], "copy_hot_jobs", lambda jobs: (gathered.append(len(jobs)), real(jobs))[1])
    outs = [SPEC.empty() for _ in range(COUNT)]
    assert store.get_many_into(ids(), outs) == [True] * COUNT
    assert gathered == [COUNT] and exact(outs)
    small = ids(2)  # under BATCH_SPLIT_MIN: copied one by one as before
    assert store.get_many_into(small, outs[:2]) == [True, True] and gathered == [COUNT]
    stats = store.stats()
    assert stats["hits"] == COUNT + 2 and stats["gets"] == COUNT + 2 and stats["misses"] == 0


def test_blocks_whose_gathered_copy_was_refused_are_read_another_way(store, monkeypatch):
    real = store.tiers[0].copy_hot_jobs

    def refuse_every_third(jobs):
        took = real([job for i, job in enumerate(jobs) if i % 3])
        verdicts = iter(took)
        return [bool(i % 3) and next(verdicts) for i in range(len(jobs))]

    monkeypatch.setattr(store.tiers[0], "copy_hot_jobs", refuse_every_third)
    outs = [SPEC.empty() for _ in range(COUNT)]
    assert store.get_many_into(ids(), outs) == [True] * COUNT
    assert exact(outs)
    stats = store.stats()
    assert stats["hits"] == COUNT and stats["gets"] == COUNT and stats["misses"] == 0


@pytest.mark.parametrize("exc", [OSError, RuntimeError, KeyboardInterrupt])
def test_a_failing_gathered_copy_leaves_nothing_held_and_counts_every_block_missed(store, monkeypatch, exc):
    shares = []

    def faulty(slab, jobs, share, stream):
        shares.append(share)
        raise exc("injected")

    monkeypatch.setattr("cascade.tiers.slab_tier.copy_out_many", faulty)
    before = store.stats()
    with pytest.raises(exc, match="injected"):
        store.get_many_into(ids(), [SPEC.empty() for _ in range(COUNT)])
    monkeypatch.undo()
    assert shares == [True]  # the batch's copies, shared with the helper, failed as one call
    stats = store.stats()
    assert stats["gets"] - before["gets"] == COUNT and stats["misses"] - before["misses"] == COUNT
    assert stats["hits"] == before["hits"]
    assert len(store._inflight) == 0 and not store._lock._is_owned()
    outs = [SPEC.empty() for _ in range(COUNT)]
    assert store.get_many_into(ids(), outs) == [True] * COUNT and exact(outs)
