"""The prefix tree of a store's blocks: no cycle however the puts arrive, depths right in
long chains, after a restart and whatever order the puts arrive in, a promotion or a put
that keeps its block's parent, and a pinned copy found at a restart kept against a put of
other bytes."""
from __future__ import annotations

import numpy as np
import pytest

from cascade import CascadeStore, Config
from cascade.errors import InvalidBlock, TierFull
from cascade.tiers.shm import ShmTier


def ident(n: int) -> str:
    return f"{n:032x}"


def test_a_batch_whose_blocks_close_a_cycle_is_refused_at_the_block_that_closes_it(tmp_path):
    # 128 KiB blocks, above the hot-put size: put_many claims room for all before it
    # commits any, and each parent was checked only at the claim (a cycle through the
    # batch's own blocks passed, and its blocks could never be evicted: TierFull later)
    cfg = Config(model="tiny", block_tokens=512, shm_bytes=8 * 256 * 512, file_bytes=0, remote_bytes=0,
                 file_dir=str(tmp_path))
    with CascadeStore(cfg) as store:
        a = np.zeros(store.spec.shape, store.spec.np_dtype)
        store.put(a, a, block_id=ident(1), parent=ident(3))  # a parent not cached yet: allowed
        with pytest.raises(InvalidBlock, match="its own ancestor"):
            store.put_many([(a, a), (a, a)], block_ids=[ident(2), ident(3)], chain=True, parent=ident(1))
        assert store.contains(ident(2)) and not store.contains(ident(3))  # 3 <- 2 <- 1 <- 3 refused at 3
        for n in range(100, 107):  # the tier's other blocks, pinned: only the chain may make room
            store.put(a, a, block_id=ident(n))
            store.pin(ident(n))
        store.put(a, a, block_id=ident(200))  # room made by evicting the chain's leaf


def test_depths_of_a_long_chain_are_right_when_put_and_after_a_restart(tmp_path):
    cfg = Config(model="tiny", block_tokens=1, shm_bytes=256 * 3000, file_bytes=32 << 20, remote_bytes=0,
                 file_dir=str(tmp_path / "f"), shm_dir=str(tmp_path))
    ids = [ident(i + 1) for i in range(2000)]
    with CascadeStore(cfg) as store:
        a = np.zeros(store.spec.shape, store.spec.np_dtype)
        for i, bid in enumerate(ids):
            store.put(a, a, block_id=bid, parent=ids[i - 1] if i else None)
        assert [store._index.get(("default", b)).depth for b in ids] == list(range(2000))
        store.delete(ids[1000])  # the chain is cut: a block put below the cut starts again at 0
        store.put(a, a, block_id=ident(9999), parent=ids[1000])
        assert store._index.get(("default", ident(9999))).depth == 0
    with CascadeStore(cfg) as store:  # found on disk: each chain walked once
        depths = [store._index.get(("default", b)).depth for b in ids if b != ids[1000]]
        assert depths == list(range(1000)) + list(range(999))
        assert store._index.get(("default", ident(9999))).depth == 0


def test_a_promotion_does_not_drop_its_own_parent_for_room(tmp_path):
    # parent P in tier 0 was eligible (its child C sat in tier 1); room for C's promotion
    # was made by dropping P (tier 1 could not take it): the head went, the tail moved up
    block = 256
    cfg = Config(model="tiny", block_tokens=1, shm_bytes=block, file_bytes=0, remote_bytes=0, demote_high=1.0)
    with CascadeStore(cfg, tiers=[ShmTier(2 * block, str(tmp_path)), ShmTier(block, str(tmp_path))]) as store:
        a = np.zeros(store.spec.shape, store.spec.np_dtype)
        parent, child, other = ident(1), ident(2), ident(3)
        store.put(a, a, block_id=parent)
        store.put(a, a, block_id=child, parent=parent)
        store.put(a, a, block_id=other)  # tier 0 full: the leaf, the child, goes down
        for _ in range(3):
            store.get(other)  # worth more than the parent
        assert store._index.get(("default", child)).tier == 1
        assert store.get(child) is not None
        assert store.contains(parent) and store.longest_prefix([parent, child]) == 2


@pytest.mark.parametrize("lower", [0, 1], ids=["one tier", "parent in the tier below"])
def test_a_put_does_not_drop_its_own_parent_for_room(tmp_path, lower):
    # the parent, worth least and with no cached child yet, was the victim: dropped in
    # the only tier, or in the last one when a demotion into it made room there
    block = 256
    cfg = Config(model="tiny", block_tokens=1, shm_bytes=block, file_bytes=0, remote_bytes=0, demote_high=1.0)
    tiers = [ShmTier(2 * block, str(tmp_path))] + [ShmTier(block, str(tmp_path))] * lower
    with CascadeStore(cfg, tiers=tiers) as store:
        a = np.zeros(store.spec.shape, store.spec.np_dtype)
        parent, child, others = ident(1), ident(2), [ident(3), ident(4)][: 1 + lower]
        for i, other in enumerate(others):
            store.put(a, a, block_id=other)
            for _ in range(3):
                store.get(other)  # worth more than the parent
            if i == 0:
                store.put(a, a, block_id=parent)  # (then, with two tiers, down to the last one)
        assert store._index.get(("default", parent)).tier == lower
        store.put(a, a, block_id=child, parent=parent)
        assert store.longest_prefix([parent, child]) == 2
        assert store._index.get(("default", child)).tier == 0


def test_a_put_refused_rather_than_dropping_its_own_parent(tmp_path):
    cfg = Config(model="tiny", block_tokens=1, shm_bytes=256, file_bytes=0, remote_bytes=0)
    with CascadeStore(cfg, tiers=[ShmTier(256, str(tmp_path))]) as store:
        a = np.zeros(store.spec.shape, store.spec.np_dtype)
        store.put(a, a, block_id=ident(1))
        with pytest.raises(TierFull):  # the tier's only block is the put's parent
            store.put(a, a, block_id=ident(2), parent=ident(1))
        assert store.contains(ident(1)) and not store.contains(ident(2))
        store.put(a, a, block_id=ident(3))  # not its parent: evicted for room as before
        assert store.contains(ident(3)) and not store.contains(ident(1))


def test_a_block_put_before_its_ancestors_gets_its_depth_when_they_come(tmp_path):
    cfg = Config(model="tiny", block_tokens=1, shm_bytes=256 * 6, file_bytes=0, remote_bytes=0)
    with CascadeStore(cfg, tiers=[ShmTier(256 * 6, str(tmp_path))]) as store:
        a = np.zeros(store.spec.shape, store.spec.np_dtype)
        head, mid, tail, leaf, other_head, other_tail = (ident(n) for n in range(1, 7))
        depth = lambda b: store._index.get(("default", b)).depth
        store.put(a, a, block_id=tail, parent=mid)  # tail first (e.g. puts of one chain on several threads)
        store.put(a, a, block_id=leaf, parent=tail)
        assert (depth(tail), depth(leaf)) == (0, 1)
        store.put(a, a, block_id=mid, parent=head)  # its parent missing too: raised as far as it is known
        assert (depth(mid), depth(tail), depth(leaf)) == (0, 1, 2)
        store.put(a, a, block_id=head)  # head -> mid -> tail -> leaf
        assert [depth(b) for b in (head, mid, tail, leaf)] == [0, 1, 2, 3]
        assert not store._index._waiting  # a whole chain waits on nothing
        store.put(a, a, block_id=other_head)
        store.put(a, a, block_id=other_tail, parent=other_head)  # depth 1
        store.hint([head, mid, tail, leaf, other_head, other_tail], position=7)  # one request reads both chains
        store.put(a, a, block_id=ident(9))  # full: a hinted leaf must go, the deeper one
        assert not store.contains(leaf) and store.contains(other_tail)


def test_a_partial_depth_stops_waiting_when_its_block_goes(tmp_path):
    cfg = Config(model="tiny", block_tokens=1, shm_bytes=256 * 4, file_bytes=0, remote_bytes=0)
    with CascadeStore(cfg, tiers=[ShmTier(256 * 4, str(tmp_path))]) as store:
        a = np.zeros(store.spec.shape, store.spec.np_dtype)
        store.put(a, a, block_id=ident(2), parent=ident(1))
        store.put(a, a, block_id=ident(3), parent=ident(2))
        assert len(store._index._waiting) == 2
        store.delete(ident(3))
        store.delete(ident(2))
        assert not store._index._waiting
        store.put(a, a, block_id=ident(1))  # nothing below it any more
        assert store._index.get(("default", ident(1))).depth == 0


def test_a_chain_found_without_its_head_at_a_restart_gets_its_depths_when_the_head_comes(tmp_path):
    cfg = Config(model="tiny", block_tokens=1, shm_bytes=256 * 8, file_bytes=1 << 20, remote_bytes=0,
                 file_dir=str(tmp_path / "f"), shm_dir=str(tmp_path))
    ids = [ident(n) for n in range(1, 6)]
    with CascadeStore(cfg) as store:
        a = np.zeros(store.spec.shape, store.spec.np_dtype)
        for i, bid in enumerate(ids):
            store.put(a, a, block_id=bid, parent=ids[i - 1] if i else None)
        store.delete(ids[0])
    with CascadeStore(cfg) as store:
        depth = lambda b: store._index.get(("default", b)).depth
        assert [depth(b) for b in ids[1:]] == [0, 1, 2, 3]  # found: as far as cached ancestors tell
        store.put(a, a, block_id=ids[0])
        assert [depth(b) for b in ids] == [0, 1, 2, 3, 4] and not store._index._waiting


def test_a_pinned_block_found_at_a_restart_is_kept_against_a_put_of_other_bytes(tmp_path):
    cfg = Config(model="tiny", block_tokens=16, shm_bytes=1 << 16, file_bytes=1 << 20, remote_bytes=0,
                 file_dir=str(tmp_path / "f"), shm_dir=str(tmp_path))
    bid = "ab" * 16
    with CascadeStore(cfg) as store:
        zeros = np.zeros(store.spec.shape, store.spec.np_dtype)
        store.put(zeros, zeros, block_id=bid)
    with CascadeStore(cfg) as store:
        ones = np.ones(store.spec.shape, store.spec.np_dtype)
        store.pin(bid)
        store.put(ones, ones, block_id=bid)  # settles on the pinned copy (its reader keeps its bytes)
        got = store.get(bid)
        assert got is not None and not got[0].any()
        store.unpin(bid)  # the pin was not lost
        store.put(ones, ones, block_id=bid)  # unpinned: compared, and replaced
        got = store.get(bid)
        assert got is not None and got[0].all()
