"""Big slab copies on two cores (cascade.buffers.splitcopy) and batches of memory copies
on every core (Pools.parallel's in_memory): the halves cover the range exactly, the
bytes are the same as one copy's, a failing half never returns before the other ended,
and a store's leases, counts and close() come out of either half failing as from any
other copy."""
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

BIG = max(splitcopy.SPLIT_MIN, BYTES_PER_WORKER)  # a block's bytes: split, and a batch of two gets two workers
SPEC = BlockSpec.flat(BIG)
COPIES = {"compiled": (hostcopy.copy_out, hostcopy.copy_in),
          "python": (hostcopy.copy_out_python, hostcopy.copy_in_python)}


@pytest.fixture(params=list(COPIES))
def copies(request, monkeypatch):
    """Both implementations, splitting whatever the machine (the fallbacks split the same
    way, only without gaining a core)."""
    if request.param == "compiled" and not hostcopy.COMPILED:
        pytest.skip("not built here (test_hostcopy.test_the_compiled_copies_were_built says why)")
    monkeypatch.setattr(splitcopy, "ENABLED", True)
    return COPIES[request.param]


def pattern(nbytes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


@pytest.mark.parametrize("sizes", [[BIG // 2, BIG // 2], [BIG], [BIG // 8, 5 * BIG // 8, BIG - 6 * BIG // 8],
                                   [BIG - 4096, 4096], [3, BIG - 3]])
def test_halves_cover_the_range_and_buffers_exactly(monkeypatch, sizes):
    monkeypatch.setattr(splitcopy, "ENABLED", True)
    buffers = [np.zeros(n, np.uint8) for n in sizes]
    split = splitcopy.halves(4096, 4096 + BIG, buffers, writable=True)
    assert split is not None
    (p0, m0, first), (p1, m1, second) = split
    assert (p0, m1) == (4096, 4096 + BIG) and m0 == p1 and (m0 - p0) % 4096 == 0
    assert abs((m0 - p0) - (m1 - p1)) <= 4096
    assert sum(b.nbytes for b in first) == m0 - p0 and sum(b.nbytes for b in second) == m1 - p1
    # the pieces are the buffers' own memory, in order, each byte once
    marks = np.concatenate([np.arange(n, dtype=np.uint64) + sum(sizes[:i]) for i, n in enumerate(sizes)])
    for b, mark in zip(buffers, np.split(marks, np.cumsum(sizes)[:-1])):
        b.view(np.uint8)[:] = (mark % 251).astype(np.uint8)
    joined = np.concatenate([np.asarray(p) for p in first + second])
    assert np.array_equal(joined, (marks % 251).astype(np.uint8))
    assert all(any(np.shares_memory(p, b) for b in buffers) for p in first + second)


@pytest.mark.parametrize("case", ["small", "disabled", "strided", "read-only", "not numpy", "short", "too many",
                                  "unsplit"])
def test_copies_it_cannot_or_need_not_split_are_not(monkeypatch, case):
    monkeypatch.setattr(splitcopy, "ENABLED", case != "disabled")
    size = BIG if case != "small" else splitcopy.SPLIT_MIN - 4096
    buffers = [np.zeros(size // 2, np.uint8), np.zeros(size // 2, np.uint8)]
    if case == "strided":
        buffers[1] = np.zeros(size, np.uint8)[::2]
    elif case == "read-only":
        buffers[0].flags.writeable = False
    elif case == "not numpy":
        buffers[0] = bytearray(size // 2)
    elif case == "short":
        buffers[1] = buffers[1][:-1]
    elif case == "too many":
        buffers = [np.zeros(size // hostcopy.MAX_BUFFERS, np.uint8) for _ in range(hostcopy.MAX_BUFFERS)]
    if case == "unsplit":
        with splitcopy.unsplit():
            with splitcopy.unsplit():
                assert splitcopy.halves(0, size, buffers, writable=True) is None
            assert splitcopy.halves(0, size, buffers, writable=True) is None  # nested: still inside
        assert splitcopy.halves(0, size, buffers, writable=True) is not None  # and out again
        return
    assert splitcopy.halves(0, size, buffers, writable=True) is None


@pytest.mark.parametrize("sizes", [[BIG // 2, BIG // 2], [BIG], [BIG // 8, 5 * BIG // 8, BIG - 6 * BIG // 8]])
def test_a_split_copy_moves_the_same_bytes_as_one_copy(copies, sizes):
    copy_out, copy_in = copies
    slab = memoryview(bytearray(BIG + 2 * 4096))
    parts = [pattern(n, i) for i, n in enumerate(sizes)]
    assert splitcopy.split_copy(copy_in, slab, 4096, 4096 + BIG, parts, writable=False)
    assert bytes(slab[4096:4096 + BIG]) == b"".join(p.tobytes() for p in parts)
    assert bytes(slab[:4096]) == bytes(4096) and bytes(slab[4096 + BIG:]) == bytes(4096)  # nothing outside
    outs = [np.zeros(n, np.uint8) for n in sizes]
    assert splitcopy.split_copy(copy_out, slab, 4096, 4096 + BIG, outs, writable=True)
    for out, part in zip(outs, parts):
        assert np.array_equal(out, part)


def test_a_split_copy_that_is_refused_writes_nothing(copies):
    copy_out, _ = copies
    slab = memoryview(bytearray(BIG))
    slab[:] = b"\x07" * BIG
    outs = [np.zeros(BIG // 2, np.uint8), np.zeros(BIG // 2, np.uint8)]
    outs[1].flags.writeable = False  # not split (halves() says None); the one copy refuses it whole
    assert not splitcopy.split_copy(copy_out, slab, 0, BIG, outs, writable=True)
    assert not outs[0].any()


@pytest.mark.parametrize("failing", ["helper", "caller", "both"])
def test_a_failing_half_raises_only_once_the_other_half_ended(monkeypatch, failing):
    """The caller's error wins; the helper's is raised when the caller's half went well;
    either way nothing is left copying into the buffers when the error leaves."""
    monkeypatch.setattr(splitcopy, "ENABLED", True)
    ended = []

    def copy(slab, pos, last, buffers):
        helper = threading.current_thread().name.startswith("cascade-copy")
        if failing in ("both", "helper" if helper else "caller"):
            if not helper:
                time.sleep(0.05)  # the helper is still at work if anything is left waiting on it
            raise RuntimeError("helper" if helper else "caller")
        time.sleep(0.2)
        ended.append("helper" if helper else "caller")
        return True

    with pytest.raises(RuntimeError) as raised:
        splitcopy.split_copy(copy, memoryview(bytearray(BIG)), 0, BIG, [np.zeros(BIG, np.uint8)], writable=True)
    assert str(raised.value) == ("helper" if failing == "helper" else "caller")
    assert ended == {"helper": ["caller"], "caller": ["helper"], "both": []}[failing]


def _split_in_a_child(queue) -> None:
    slab = memoryview(bytearray(BIG))
    splitcopy.ENABLED = True
    part = pattern(BIG, 3)
    splitcopy.split_copy(hostcopy.copy_in, slab, 0, BIG, [part], writable=False)
    queue.put(bytes(slab) == part.tobytes())


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # the point here
def test_a_forked_child_splits_with_a_helper_of_its_own(copies):
    copy_out, _ = copies
    slab = memoryview(bytearray(BIG))
    assert splitcopy.split_copy(copy_out, slab, 0, BIG, [np.zeros(BIG, np.uint8)], writable=True)  # helper made here
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_split_in_a_child, args=(queue,))
    child.start()
    assert queue.get(timeout=60) is True  # a copy of the parent's dead helper would hang it
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


def test_a_store_moves_big_blocks_exactly_split_or_not(tmp_path, copies, monkeypatch):
    with open_store(tmp_path, "shm") as store:
        for n in range(3):
            store.put(*block(n), block_id=bid(n))
        for split in (True, False):
            monkeypatch.setattr(splitcopy, "ENABLED", split)
            for n in range(3):
                key, value = SPEC.empty()
                assert store.get_into(bid(n), key, value)
                assert np.array_equal(key, block(n)[0]) and np.array_equal(value, block(n)[1])


@pytest.mark.parametrize("half", ["helper", "caller"])
@pytest.mark.parametrize("op", ["get", "put"])
@pytest.mark.parametrize("exc", [OSError, RuntimeError, KeyboardInterrupt])
def test_a_half_of_a_store_copy_failing_leaves_nothing_held(tmp_path, monkeypatch, half, op, exc):
    monkeypatch.setattr(splitcopy, "ENABLED", True)
    store = open_store(tmp_path, "shm")
    store.put(*block(0), block_id=bid(0))
    name = "copy_out" if op == "get" else "copy_in"
    real = getattr(slab_tier, name)
    calls = []

    def faulty(slab, pos, last, buffers):
        calls.append(threading.current_thread().name)
        if threading.current_thread().name.startswith("cascade-copy") == (half == "helper"):
            raise exc("injected")
        return real(slab, pos, last, buffers)

    monkeypatch.setattr(slab_tier, name, faulty)
    free = store.tiers[0].free
    with pytest.raises(exc):
        if op == "get":
            store.get_into(bid(0), *SPEC.empty())
        else:
            store.put(*block(1), block_id=bid(1))
    monkeypatch.undo()
    assert len(calls) == 2  # split: one half each
    assert len(store._inflight) == 0
    assert all(slot.readers == 0 for slot in store.tiers[0]._index.values())
    assert store.tiers[0].free == free and not store.contains(bid(1))
    key, value = SPEC.empty()
    assert store.get_into(bid(0), key, value) and np.array_equal(value, block(0)[1])
    store.close(timeout=120)


def copying_threads(monkeypatch) -> set[str]:
    """Names of the threads that run slab copies out from now on."""
    names: set[str] = set()
    real = slab_tier.copy_out

    def spy(*args):
        names.add(threading.current_thread().name)
        time.sleep(0.05)  # long enough that every worker of a batch takes a block
        return real(*args)

    monkeypatch.setattr(slab_tier, "copy_out", spy)
    return names


def test_a_batch_of_memory_copies_runs_on_every_core_and_file_reads_do_not(tmp_path, monkeypatch):
    """SHM blocks of a batch (copies without the interpreter lock) go to the I/O workers
    up to every core; file-tier blocks keep the spare-core cap (1 on two cores: inline)."""
    if not hostcopy.COMPILED:
        pytest.skip("the SHM tier's copies hold the interpreter lock without the compiled module")
    with open_store(tmp_path, "shm+file") as store:
        assert store.tiers[0].copies_without_gil and not store.tiers[1].copies_without_gil
        store._pools._memory_cores, store._pools._cores = 2, 1  # this machine kind: 2 cores
        ids = [bid(n) for n in range(6)]
        store.put_many([block(n) for n in range(6)], block_ids=ids)  # the first 2 are demoted to files
        in_files = [b for b in ids if store._meta[("default", b)].tier == 1]
        in_shm = [b for b in ids if store._meta[("default", b)].tier == 0]
        assert in_files and len(in_shm) >= 2
        names = copying_threads(monkeypatch)
        outs = [SPEC.empty() for _ in in_shm]
        assert all(store.get_many_into(in_shm, outs))
        assert len(names) == 2 and names - {threading.current_thread().name} <= {"cascade-io_0"}
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
    threads: dict[str, list[str]] = {"copy_in": [], "copy_out": []}
    for name, seen in threads.items():
        real = getattr(slab_tier, name)
        monkeypatch.setattr(slab_tier, name, lambda *a, real=real, seen=seen: (
            seen.append(threading.current_thread().name), real(*a))[1])
    config = Config(shm_bytes=4 * (BIG + 4096), file_bytes=0, remote_bytes=0, promote_on_hit=False,
                    split_copies=split_copies)
    with CascadeStore(config, block_spec=SPEC) as store:
        store.put(*block(0), block_id=bid(0))
        key, value = SPEC.empty()
        assert store.get_into(bid(0), key, value)
        assert np.array_equal(key, block(0)[0]) and np.array_equal(value, block(0)[1])
    caller = threading.current_thread().name
    for seen in threads.values():
        if split_copies:
            assert sorted(seen) == sorted([caller, next(n for n in seen if n.startswith("cascade-copy"))])
        else:
            assert seen == [caller]


def test_split_copies_is_a_config_key_with_an_environment_form():
    assert Config().split_copies is True
    assert Config.load(env={"CASCADE_SPLIT_COPIES": "false"}).split_copies is False
