"""Every lease, reader count, room claim and in-flight count is given back on every path.

Faults are injected into every copy and tier operation of real tiers (SHM, file, the GPU
tier with numpy, SHM over file): the caller's output or input raises, a tier's read,
fill, commit or discard raises (an I/O error, an unexpected error, KeyboardInterrupt).
After each, with the fault gone: the store keeps serving (a new block is stored and read
back exactly), its accounting adds up (:func:`check_quiescent`), nothing is held (no
operation in flight, no reader on a block, no lease on a slab slot or file), and
``close()`` returns instead of waiting. ``close()`` itself waits a bounded time, without
holding the store's lock, and names what is still held.
"""
from __future__ import annotations

import errno
import threading

import numpy as np
import pytest

from cascade import CascadeStore, Config, InvalidBlock
from cascade.errors import CloseTimeout, StoreClosed, TierFull
from cascade.tiers import slab_tier
from cascade.tiers.base import Memory
from test_concurrency import BLOCK, SPEC, bid, check_block, check_quiescent, config, parts, put

HANG = 120.0  # seconds: only a guard against deadlocks, never a speed limit
SETUPS = {
    "shm": dict(file_bytes=0),
    "file": dict(shm_bytes=0),
    "gpu": dict(shm_bytes=0, file_bytes=0, gpu_bytes=8 * BLOCK),
    "shm+file": {},
}


def open_setup(tmp_path, setup: str) -> CascadeStore:
    return CascadeStore(config(tmp_path, **SETUPS[setup]), block_spec=SPEC, array_module=np)


def check_nothing_held(store: CascadeStore) -> None:
    """No operation in flight, no reader counted on a block, no tier lease or claim open
    (once the background compactions asked for have ended)."""
    assert store._housekeeper.wait_idle(HANG)
    assert len(store._inflight) == 0
    assert all(meta.readers == 0 for meta in store._meta.values())
    for tier in store.tiers:
        if tier.memory in (Memory.HOST, Memory.DEVICE):  # slab tiers: no slot still leased
            assert all(slot.readers == 0 for slot in tier._index.values()), tier.name
        else:  # the file tier: no file still being read or written
            assert all(f.users == 0 for f in tier._files.values()), tier.name


def check_serves_and_closes(store: CascadeStore) -> None:
    check_nothing_held(store)
    fresh = put(store, 999)
    got = store.get(fresh)
    assert got is not None
    check_block(fresh, *got)
    check_quiescent(store)
    store.close(timeout=HANG)  # returns: CloseTimeout would name what is still held


class NoBuffer:
    """Has the shape, dtype and flags of a block half but no buffer protocol."""

    def __init__(self) -> None:
        self.shape, self.dtype = SPEC.shape, np.dtype(SPEC.dtype)
        self.flags = type("Flags", (), {"writeable": True, "__getitem__": lambda self, k: True})()


def workload(store: CascadeStore, first: int) -> None:
    """Puts that fill the fastest tier (demotions, evictions), then reads of everything:
    any of them may fail while a fault is armed, none may hang or leak."""
    for n in range(first, first + 12):
        try:
            put(store, n)
        except (Exception, KeyboardInterrupt):
            pass
    for n in range(first + 12):
        key, value = SPEC.empty()
        try:
            if store.get_into(bid(n), key, value):
                check_block(bid(n), key, value)
        except (Exception, KeyboardInterrupt) as exc:
            assert not isinstance(exc, AssertionError), exc


def fault(exc_kind: str):
    return {"io": lambda: OSError(errno.EIO, "injected I/O error"),
            "bug": lambda: RuntimeError("injected failure"),
            "interrupt": lambda: KeyboardInterrupt()}[exc_kind]


def with_each_tier_faulty(tmp_path, monkeypatch, setup: str, arm) -> None:
    """Open ``setup`` with 12 blocks; for each tier in turn, ``arm(tier)`` (monkeypatching
    it), run :func:`workload`, disarm and check that nothing is held and the accounting
    adds up; finally check that the store serves and closes."""
    store = open_setup(tmp_path, setup)
    for n in range(12):
        put(store, n)
    for t, tier in enumerate(store.tiers):
        arm(tier)
        workload(store, 100 * (t + 1))
        monkeypatch.undo()
        check_nothing_held(store)
        check_quiescent(store)
    check_serves_and_closes(store)


@pytest.mark.parametrize("setup", list(SETUPS))
@pytest.mark.parametrize("op", ["read_leased", "fill", "commit", "read_hot", "store_hot"])  # *_hot: small blocks
@pytest.mark.parametrize("exc_kind", ["io", "bug", "interrupt"])
def test_a_tier_operation_raising_leaves_nothing_held(tmp_path, monkeypatch, setup, op, exc_kind):
    make = fault(exc_kind)

    def boom(*args, **kwargs):
        raise make()

    # raised before the tier does anything
    with_each_tier_faulty(tmp_path, monkeypatch, setup, lambda tier: monkeypatch.setattr(tier, op, boom))


@pytest.mark.parametrize("setup", ["shm", "shm+file"])
@pytest.mark.parametrize("exc_kind", ["io", "bug", "interrupt"])
def test_a_slab_copy_out_raising_midway_leaves_nothing_held(tmp_path, monkeypatch, setup, exc_kind):
    """The copy of a hot get or a leased read raises after taking its buffers (under the
    lock, or with the block leased)."""
    make = fault(exc_kind)
    calls = []

    def boom(*args):
        calls.append(args)
        raise make()

    with_each_tier_faulty(tmp_path, monkeypatch, setup, lambda tier: monkeypatch.setattr(slab_tier, "copy_out", boom))
    assert calls  # the workload reached the copy


@pytest.mark.parametrize("setup", ["shm", "shm+file"])
@pytest.mark.parametrize("exc_kind", ["io", "bug", "interrupt"])
def test_a_slab_copy_in_raising_midway_leaves_nothing_held(tmp_path, monkeypatch, setup, exc_kind):
    """The copy of a hot put (a small block with room free in the SHM tier) raises after
    its room was allocated: the put fails, its room is given back, nothing is stored."""
    make = fault(exc_kind)
    calls = []

    def boom(*args):
        calls.append(args)
        raise make()

    store = open_setup(tmp_path, setup)
    for n in range(4):  # the SHM tier holds 8: room left for hot puts
        put(store, n)
    shm = store.tiers[0]
    free = shm.free
    monkeypatch.setattr(slab_tier, "copy_in", boom)
    for n in range(4, 8):
        with pytest.raises({"io": TierFull, "bug": RuntimeError, "interrupt": KeyboardInterrupt}[exc_kind]):
            put(store, n)
        assert not store.contains(bid(n))
    monkeypatch.undo()
    assert len(calls) == 4 and shm.free == free
    check_quiescent(store)
    check_serves_and_closes(store)


@pytest.mark.parametrize("setup", list(SETUPS))
def test_a_discard_raising_leaves_nothing_held(tmp_path, monkeypatch, setup):
    """Claims are discarded when a fill fails; the discard then raises (after giving its
    room back)."""
    def fill(*args, **kwargs):
        raise OSError(errno.ENOSPC, "injected full disk")

    def arm(tier):
        real = tier.discard

        def discard(handle):
            real(handle)
            raise RuntimeError("injected discard failure")

        monkeypatch.setattr(tier, "fill", fill)
        monkeypatch.setattr(tier, "discard", discard)

    with_each_tier_faulty(tmp_path, monkeypatch, setup, arm)


@pytest.mark.parametrize("setup", list(SETUPS))
def test_get_into_an_output_without_the_buffer_protocol(tmp_path, setup):
    """The defect of issue 18: InvalidBlock, and nothing left held (close returns)."""
    store = open_setup(tmp_path, setup)
    ids = [put(store, n) for n in range(12)]
    for b in ids:
        with pytest.raises(InvalidBlock):
            store.get_into(b, NoBuffer(), NoBuffer())
    check_nothing_held(store)
    check_serves_and_closes(store)


@pytest.mark.parametrize("setup", list(SETUPS))
def test_a_put_of_an_input_without_the_buffer_protocol(tmp_path, setup):
    store = open_setup(tmp_path, setup)
    for n in range(12):
        put(store, n)
    with pytest.raises(InvalidBlock):
        store.put(NoBuffer(), NoBuffer(), block_id=bid(500))
    assert not store.contains(bid(500))
    check_serves_and_closes(store)


@pytest.mark.parametrize("setup", ["shm", "file"])
def test_keyboard_interrupt_inside_a_copy_leaves_the_store_closable(tmp_path, monkeypatch, setup):
    store = open_setup(tmp_path, setup)
    ids = [put(store, n) for n in range(4)]
    tier = store.tiers[0]
    real = tier.read_leased

    def interrupted(handle, outs):
        real(handle, outs)  # the copy ran (or half of it): Ctrl-C arrives now
        raise KeyboardInterrupt

    monkeypatch.setattr(tier, "read_leased", interrupted)
    with pytest.raises(KeyboardInterrupt):
        store.get(ids[0])
    monkeypatch.undo()
    check_nothing_held(store)
    store.close(timeout=HANG)
    with pytest.raises(StoreClosed):
        store.get(ids[0])


class HeldCopy:
    """Holds the first read of tier ``tier`` inside its copy until released."""

    def __init__(self, monkeypatch, tier) -> None:
        self.inside, self.release = threading.Event(), threading.Event()
        real = tier.read_leased

        def held(handle, outs):
            self.inside.set()
            assert self.release.wait(HANG)
            real(handle, outs)

        monkeypatch.setattr(tier, "read_leased", held)


def test_close_waits_a_bounded_time_and_names_what_is_held(tmp_path, monkeypatch):
    store = open_setup(tmp_path, "shm")
    target = put(store, 1)
    hold = HeldCopy(monkeypatch, store.tiers[0])
    got: dict = {}
    reader = threading.Thread(target=lambda: got.setdefault("hit", store.get(target)), daemon=True)
    reader.start()
    assert hold.inside.wait(HANG)
    with pytest.raises(CloseTimeout, match=f"a get of {target} holding a lease in shm"):
        store.close(timeout=0.05)  # the held copy cannot end before it is released
    with pytest.raises(StoreClosed):  # closing already: no new calls
        store.get(target)
    hold.release.set()
    reader.join(HANG)
    assert not reader.is_alive() and got["hit"] is not None
    check_block(target, *got["hit"])
    store.close(timeout=HANG)  # nothing held any more: the tiers go


def test_close_gives_the_lock_up_while_it_waits(tmp_path, monkeypatch):
    """A read inside its copy needs the store's lock to end: close() waiting for it must
    not hold the lock meanwhile (it would wait for ever, or here until its bound)."""
    store = open_setup(tmp_path, "shm+file")
    target = put(store, 1)
    hold = HeldCopy(monkeypatch, store.tiers[0])
    reader = threading.Thread(target=lambda: store.get(target), daemon=True)
    reader.start()
    assert hold.inside.wait(HANG)
    errors: list = []
    closer = threading.Thread(target=lambda: _run(store.close, errors), daemon=True)
    closer.start()
    while not store._inflight.closing:  # close() has begun and is waiting for the read
        closer.join(0.01)
    hold.release.set()
    for t in (reader, closer):
        t.join(HANG)
        assert not t.is_alive()
    assert not errors, errors


def _run(fn, errors: list) -> None:
    try:
        fn(timeout=HANG)
    except BaseException as exc:
        errors.append(exc)


def test_a_block_cannot_be_its_own_parent_or_ancestor(tmp_path):
    """Issue 18: ``parent == block_id`` made a block unevictable (it counted as its own
    cached child), and with SHM alone every later put was rejected."""
    store = open_setup(tmp_path, "shm")
    with pytest.raises(InvalidBlock, match="own ancestor"):
        put(store, 1, parent=bid(1))
    put(store, 3, parent=bid(2))  # 2 is not cached yet
    with pytest.raises(InvalidBlock, match="own ancestor"):
        put(store, 2, parent=bid(3))  # 2 -> 3 -> 2
    put(store, 4, parent=bid(3))
    with pytest.raises(InvalidBlock, match="own ancestor"):
        put(store, 3, parent=bid(4), verify=False)  # already cached: still a cycle
    key, value = parts(5)
    digest = store.put(key, value)
    with pytest.raises(InvalidBlock, match="own ancestor"):  # a content id named as its own parent
        store.put(key, value, parent=digest, block_id=None)
    for n in range(100, 140):  # five times SHM's capacity: evictions keep making room
        put(store, n)
    counters = store.counters
    assert counters.stored == 2 + 1 + 40 and counters.rejected == 0
    check_serves_and_closes(store)


def test_cycle_check_accepts_long_chains(tmp_path):
    store = CascadeStore(Config(model="tiny", shm_bytes=0, file_bytes=64 * (BLOCK + 8192),
                                file_dir=str(tmp_path / "f")), block_spec=SPEC)
    parent = None
    for n in range(40):
        put(store, n, parent=parent)
        parent = bid(n)
    assert len(store) == 40
    store.close()


def test_outputs_of_another_shape_are_refused_before_anything_is_held(tmp_path):
    store = open_setup(tmp_path, "shm")
    target = put(store, 1)
    with pytest.raises(InvalidBlock):
        store.get_into(target, np.empty(3), np.empty(3))
    check_nothing_held(store)
    store.close(timeout=HANG)


def test_a_failed_demotion_copy_leaves_the_block_served(tmp_path, monkeypatch):
    """A fault in a demotion's copy (the file tier's fill) leaves the block where it was."""
    store = open_setup(tmp_path, "shm+file")
    ids = [put(store, n) for n in range(8)]  # SHM full
    monkeypatch.setattr(store.tiers[1], "fill", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.EIO, "x")))
    for n in range(8, 12):
        try:
            put(store, n)
        except Exception:
            pass
    monkeypatch.undo()
    for b in ids:  # each block is either still served exactly or was dropped as the last resort
        got = store.get(b)
        if got is not None:
            check_block(b, *got)
    check_nothing_held(store)
    check_serves_and_closes(store)
