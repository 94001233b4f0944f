"""Zero-copy reads: ``store.view(id)`` gives read-only arrays over the block's bytes in
the SHM (or GPU) tier, held in place until the ``with`` block ends."""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from cascade import CascadeStore, Config
from cascade.errors import CloseTimeout


def block(spec, i: int):
    key, value = spec.empty()
    key[...], value[...] = i, -i
    return key, value


@pytest.fixture
def store(tmp_path):
    with CascadeStore(Config(model="tiny", shm_bytes=4 * 4096, file_bytes=1 << 20, file_dir=str(tmp_path / "f"),
                             shm_dir=str(tmp_path), promote_on_hit=False)) as s:
        yield s


def test_a_view_points_into_the_slab_and_cannot_be_written(store):
    bid = store.put(*block(store.spec, 7))
    slab = np.frombuffer(store.tiers[0].mapping, dtype=np.uint8)
    start, end = slab.ctypes.data, slab.ctypes.data + slab.nbytes
    with store.view(bid) as (key, value):
        assert np.array_equal(key, block(store.spec, 7)[0]) and np.array_equal(value, block(store.spec, 7)[1])
        assert key.shape == store.spec.shape and key.dtype == np.dtype(store.spec.dtype)
        assert start <= key.ctypes.data < end and start <= value.ctypes.data < end  # no copy
        with pytest.raises(ValueError):
            key[...] = 0
    assert store.stats()["hits"] == 1


def test_bytes_stay_while_viewed_even_if_the_block_is_deleted(store):
    bid = store.put(*block(store.spec, 1))
    with store.view(bid) as (key, value):
        store.delete(bid)
        for i in range(2, 8):  # more puts than the SHM tier holds: its room is reused meanwhile
            store.put(*block(store.spec, i))
        assert np.array_equal(key, block(store.spec, 1)[0]) and np.array_equal(value, block(store.spec, 1)[1])
    assert store.get(bid) is None


def test_blocks_outside_zero_copy_tiers_come_as_private_copies_and_misses_as_none(store):
    ids = [store.put(*block(store.spec, i)) for i in range(8)]  # the first ones are demoted to the file tier
    store.flush()  # a background demotion may still be copying ids[0] out of SHM
    assert ("default", ids[0]) not in store.tiers[0] and ("default", ids[0]) in store.tiers[-1]  # in the file tier
    with store.view(ids[0]) as got:
        assert got is not None and np.array_equal(got[0], block(store.spec, 0)[0])
        got[0][...] = 0  # a private copy: writable, and the store's bytes do not change
    assert np.array_equal(store.get(ids[0])[0], block(store.spec, 0)[0])
    with store.view("f" * 32) as missing:
        assert missing is None


def test_an_error_inside_the_with_block_gives_the_lease_back(store):
    bid = store.put(*block(store.spec, 3))
    with pytest.raises(RuntimeError):
        with store.view(bid):
            raise RuntimeError("the engine failed while reading")
    store.delete(bid)  # nothing holds it any more
    assert len(store) == 0


def test_close_waits_for_an_open_view_a_bounded_time_and_names_it(store):
    bid = store.put(*block(store.spec, 4))
    opened, done = threading.Event(), threading.Event()

    def reader() -> None:
        with store.view(bid):
            opened.set()
            done.wait(30)

    thread = threading.Thread(target=reader)
    thread.start()
    opened.wait(30)
    with pytest.raises(CloseTimeout, match="a view of"):
        store.close(timeout=0.2)
    done.set()
    thread.join(30)
    store.close()  # the view ended: close completes


def test_close_succeeds_while_the_caller_still_holds_arrays_of_a_view(tmp_path):
    cfg = Config(model="tiny", shm_bytes=4 * 4096, file_bytes=0, shm_dir=str(tmp_path))
    store = CascadeStore(cfg)
    bid = store.put(*block(store.spec, 5))
    with store.view(bid) as kept:  # the caller keeps the arrays past the with block (invalid to use)
        pass
    store.close()  # the slab is unmapped once the caller drops them; close itself must not fail
    assert kept is not None and len(os.listdir(tmp_path)) == 0  # the slab file is gone


@pytest.mark.parametrize("again", ["after", "nested"])
def test_a_view_is_entered_once_and_holds_nothing_after_its_block(store, again):
    bid = store.put(*block(store.spec, 3))
    view = store.view(bid)
    with view as first:
        assert first is not None and (first[0] == 3).all()
        if again == "nested":
            with pytest.raises(RuntimeError, match="entered once"):
                with view:
                    pass
    if again == "after":
        store.delete(bid)
        others = [store.put(*block(store.spec, i)) for i in range(4, 8)]  # its room used again
        with pytest.raises(RuntimeError, match="entered once"):  # never another block's bytes
            with view:
                pass
        assert all(store.contains(b) for b in others)
    assert len(store._inflight) == 0
    store.close(timeout=1)  # nothing held: no CloseTimeout
