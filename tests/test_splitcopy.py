"""Big slab copies on two cores (cascade.buffers.splitcopy: copies shared with the
compiled copy helper thread) and batches of memory copies on every core (Pools.parallel's
in_memory): which copies are shared, a shared copy moves the same bytes as one thread's
and refuses as one does, the helper takes pieces and serves several threads and a forked
child, and a store's leases, counts and close() come out of a failing shared copy as
from any other copy."""
from __future__ import annotations

import multiprocessing
import threading
import time

import numpy as np
import pytest

from cascade import CascadeStore, Config
from cascade.buffers import hostcopy, splitcopy
from cascade.core.pools import BYTES_PER_WORKER
from cascade.models import BlockSpec
from cascade.tiers import slab_tier

BIG = max(splitcopy.SPLIT_MIN, BYTES_PER_WORKER)  # a block's bytes: shared, and a batch of two gets two workers
SPEC = BlockSpec.flat(BIG)
def pattern(nbytes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


@pytest.mark.parametrize("case", ["shared", "small", "disabled", "not allowed", "unsplit"])
def test_only_big_copies_allowed_outside_a_batchs_workers_are_shared(monkeypatch, case):
    monkeypatch.setattr(splitcopy, "ENABLED", case != "disabled")
    size = splitcopy.SPLIT_MIN - 1 if case == "small" else splitcopy.SPLIT_MIN
    allowed = case != "not allowed"
    if case == "unsplit":
        with splitcopy.unsplit():
            with splitcopy.unsplit():
                assert not splitcopy.shared(size, allowed)
            assert not splitcopy.shared(size, allowed)  # nested: still inside
    assert splitcopy.shared(size, allowed) == (case in ("shared", "unsplit"))  # and out again
    assert splitcopy.shared(2 << 20, allowed, least=4 << 20) is False  # a batch's own threshold


@pytest.mark.parametrize("sizes", [[BIG // 2, BIG // 2], [BIG], [BIG // 8, 5 * BIG // 8, BIG - 6 * BIG // 8],
                                   [3, BIG - 3], [BIG + 12345, 7 * BIG + 3]])
def test_a_shared_copy_moves_the_same_bytes_as_one_thread(hostcopy_impl, sizes):
    copy_out, copy_in = hostcopy_impl.copy_out, hostcopy_impl.copy_in
    total = sum(sizes)
    slab = memoryview(bytearray(total + 2 * 4096))
    parts = [pattern(n, i) for i, n in enumerate(sizes)]
    assert copy_in(slab, 4096, 4096 + total, parts, True)
    assert bytes(slab[4096:4096 + total]) == b"".join(p.tobytes() for p in parts)
    assert bytes(slab[:4096]) == bytes(4096) and bytes(slab[4096 + total:]) == bytes(4096)  # nothing outside
    outs = [np.zeros(n, np.uint8) for n in sizes]
    assert copy_out(slab, 4096, 4096 + total, outs, True)
    for out, part in zip(outs, parts):
        assert np.array_equal(out, part)


@pytest.mark.parametrize("case", ["strided", "read-only", "no buffer", "short", "too many"])
def test_a_shared_copy_that_is_refused_writes_nothing(hostcopy_impl, case):
    copy_out = hostcopy_impl.copy_out
    slab = memoryview(bytearray(b"\x07" * BIG))
    outs = [np.zeros(BIG // 2, np.uint8), np.zeros(BIG // 2, np.uint8)]
    if case == "strided":
        outs[1] = np.zeros(BIG, np.uint8)[::2]
    elif case == "read-only":
        outs[1].flags.writeable = False
    elif case == "no buffer":
        outs[1] = object()
    elif case == "short":
        outs[1] = outs[1][:-1]
    else:
        outs = [np.zeros(BIG // 16, np.uint8) for _ in range(16)]
    assert not copy_out(slab, 0, BIG, outs, True)
    assert not any(o.any() for o in outs if isinstance(o, np.ndarray))


def test_the_helper_thread_takes_pieces_of_shared_copies(compiled_hostcopy):
    slab = memoryview(bytearray(16 << 20))
    out = np.zeros(16 << 20, np.uint8)
    before = hostcopy.helper_pieces()
    deadline = time.monotonic() + 30
    while hostcopy.helper_pieces() == before and time.monotonic() < deadline:  # it joins once awake
        assert hostcopy.copy_out(slab, 0, 16 << 20, [out], True)
    assert hostcopy.helper_pieces() > before
    quiet = hostcopy.helper_pieces()
    for _ in range(20):
        assert hostcopy.copy_out(slab, 0, 16 << 20, [out], False)
    assert hostcopy.helper_pieces() == quiet  # copies not shared never reach it


def test_threads_sharing_copies_at_once_each_get_their_own_bytes(compiled_hostcopy):
    """One copy at a time is offered to the helper: the others copy alone, none waits
    on another's pieces or takes them."""
    nbytes = 3 << 20
    slabs = [memoryview(bytearray(pattern(nbytes, t).tobytes())) for t in range(4)]
    wrong: list[int] = []

    def run(t: int) -> None:
        out = [np.zeros(nbytes // 2, np.uint8), np.zeros(nbytes - nbytes // 2, np.uint8)]
        for _ in range(25):
            out[0].fill(0)
            out[1].fill(0)
            if not hostcopy.copy_out(slabs[t], 0, nbytes, out, True) or \
                    out[0].tobytes() + out[1].tobytes() != bytes(slabs[t]):
                wrong.append(t)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads) and wrong == []


def _share_in_a_child(queue) -> None:
    slab = memoryview(bytearray(BIG))
    part = pattern(BIG, 3)
    before = hostcopy.helper_pieces()
    deadline = time.monotonic() + 30
    while hostcopy.helper_pieces() == before and time.monotonic() < deadline:
        hostcopy.copy_in(slab, 0, BIG, [part], True)
    queue.put((bytes(slab) == part.tobytes(), hostcopy.helper_pieces() > before))


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # the point here
def test_a_forked_child_shares_copies_with_a_helper_of_its_own(compiled_hostcopy):
    slab = memoryview(bytearray(BIG))
    assert hostcopy.copy_out(slab, 0, BIG, [np.zeros(BIG, np.uint8)], True)  # the parent's helper runs
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_share_in_a_child, args=(queue,))
    child.start()
    assert queue.get(timeout=60) == (True, True)  # a copy offered to the parent's helper would hang it
    child.join(60)
    assert child.exitcode == 0


def open_store(tmp_path, tiers: str) -> CascadeStore:
    shm = 4 * (BIG + 4096) if "shm" in tiers else 0
    file = 16 * (BIG + 8192) if "file" in tiers else 0
    return CascadeStore(Config(shm_bytes=shm, file_bytes=file, remote_bytes=0, file_dir=str(tmp_path / "files"),
                               promote_on_hit=False), block_spec=SPEC)


def block(n: int) -> tuple[np.ndarray, np.ndarray]:
    return pattern(SPEC.block_bytes // 2, 2 * n).view(SPEC.dtype).reshape(SPEC.shape), \
        pattern(SPEC.block_bytes // 2, 2 * n + 1).view(SPEC.dtype).reshape(SPEC.shape)


def bid(n: int) -> str:
    return f"{n + 1:032x}"


def test_a_store_moves_big_blocks_exactly_split_or_not(tmp_path, hostcopy_impl, monkeypatch):
    with open_store(tmp_path, "shm") as store:
        for n in range(3):
            store.put(*block(n), block_id=bid(n))
        for split in (True, False):
            monkeypatch.setattr(splitcopy, "ENABLED", split)
            for n in range(3):
                key, value = SPEC.empty()
                assert store.get_into(bid(n), key, value)
                assert np.array_equal(key, block(n)[0]) and np.array_equal(value, block(n)[1])


@pytest.mark.parametrize("op", ["get", "put"])
@pytest.mark.parametrize("exc", [OSError, RuntimeError, KeyboardInterrupt])
def test_a_failing_shared_store_copy_leaves_nothing_held(tmp_path, monkeypatch, op, exc):
    monkeypatch.setattr(splitcopy, "ENABLED", True)
    store = open_store(tmp_path, "shm")
    store.put(*block(0), block_id=bid(0))
    shares = []

    def faulty(slab, pos, last, buffers, share, stream):
        shares.append(share)
        raise exc("injected")

    monkeypatch.setattr(slab_tier, "copy_out" if op == "get" else "copy_in", faulty)
    free = store.tiers[0].free
    with pytest.raises(exc):
        if op == "get":
            store.get_into(bid(0), *SPEC.empty())
        else:
            store.put(*block(1), block_id=bid(1))
    monkeypatch.undo()
    assert shares == [True]
    assert len(store._inflight) == 0
    assert all(slot.readers == 0 for slot in store.tiers[0]._index.values())
    assert store.tiers[0].free == free and not store.contains(bid(1))
    key, value = SPEC.empty()
    assert store.get_into(bid(0), key, value) and np.array_equal(value, block(0)[1])
    store.close(timeout=120)


def test_a_batch_of_shm_blocks_is_one_shared_copy_and_file_reads_stay_inline(tmp_path, monkeypatch):
    """The SHM blocks of a batch get (copies without the interpreter lock) are one run,
    copied in one compiled call on the calling thread and shared with the copy helper;
    file-tier blocks keep the spare-core cap (1 on two cores: inline)."""
    if not hostcopy.COMPILED:
        pytest.skip("the SHM tier's copies hold the interpreter lock without the compiled module")
    monkeypatch.setattr(splitcopy, "ENABLED", True)
    with open_store(tmp_path, "shm+file") as store:
        assert store.tiers[0].copies_without_gil and not store.tiers[1].copies_without_gil
        store._pools._memory_cores, store._pools._cores = 2, 1  # this machine kind: 2 cores
        ids = [bid(n) for n in range(6)]
        store.put_many([block(n) for n in range(6)], block_ids=ids)  # the first 2 are demoted to files
        in_files = [b for b in ids if store._meta[("default", b)].tier == 1]
        in_shm = [b for b in ids if store._meta[("default", b)].tier == 0]
        assert in_files and len(in_shm) >= 2
        calls = []
        real = slab_tier.copy_out_many
        monkeypatch.setattr(slab_tier, "copy_out_many", lambda slab, jobs, share, stream: (
            calls.append((threading.current_thread().name, len(jobs), share)), real(slab, jobs, share, stream))[1])
        outs = [SPEC.empty() for _ in in_shm]
        assert all(store.get_many_into(in_shm, outs))
        assert calls == [(threading.current_thread().name, len(in_shm), True)]
        for b, (key, value) in zip(in_shm, outs):
            assert np.array_equal(value, block(ids.index(b))[1])
        reads = []
        real = store.tiers[1].read_leased
        monkeypatch.setattr(store.tiers[1], "read_leased",
                            lambda *a: (reads.append(threading.current_thread().name), real(*a))[1])
        outs = [SPEC.empty() for _ in in_files]
        assert all(store.get_many_into(in_files, outs))
        assert set(reads) == {threading.current_thread().name}
        for b, (key, value) in zip(in_files, outs):
            assert np.array_equal(key, block(ids.index(b))[0])


@pytest.mark.parametrize("split_copies", [True, False])
def test_split_copies_false_keeps_a_stores_big_copies_on_the_calling_thread(tmp_path, monkeypatch, split_copies):
    monkeypatch.setattr(splitcopy, "ENABLED", True)
    shares: dict[str, list[bool]] = {"copy_in": [], "copy_out": []}
    for name, seen in shares.items():
        real = getattr(slab_tier, name)
        monkeypatch.setattr(slab_tier, name, lambda *a, real=real, seen=seen: (seen.append(a[4]), real(*a))[1])
    config = Config(shm_bytes=4 * (BIG + 4096), file_bytes=0, remote_bytes=0, promote_on_hit=False,
                    split_copies=split_copies)
    before = hostcopy.helper_pieces()
    with CascadeStore(config, block_spec=SPEC) as store:
        store.put(*block(0), block_id=bid(0))
        key, value = SPEC.empty()
        assert store.get_into(bid(0), key, value)
        assert np.array_equal(key, block(0)[0]) and np.array_equal(value, block(0)[1])
    assert shares == {"copy_in": [split_copies], "copy_out": [split_copies]}
    if not split_copies:
        assert hostcopy.helper_pieces() == before


def test_split_copies_is_a_config_key_with_an_environment_form():
    assert Config().split_copies is True
    assert Config.load(env={"CASCADE_SPLIT_COPIES": "false"}).split_copies is False
