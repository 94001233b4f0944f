"""Namespace quotas (``namespace_share``): one tenant's flood or pins cannot take what
another tenant holds within its share. Pinned blocks are blocks of the namespace, so the
share bounds its pins too."""
from __future__ import annotations

import numpy as np
import pytest

from cascade import CascadeStore, Config, ConfigError, TierFull


def block(spec, seed: int):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(spec.shape).astype(spec.dtype), rng.standard_normal(spec.shape).astype(spec.dtype))


def store_for(tmp_path, share: float, **kw) -> CascadeStore:
    settings = dict(model="tiny", shm_bytes=8 * 4096, file_bytes=0, file_dir=str(tmp_path), namespace_share=share)
    settings.update(kw)
    return CascadeStore(Config(**settings))


def test_a_flood_of_one_namespace_does_not_evict_another_within_its_share(tmp_path):
    with store_for(tmp_path, 0.5) as s:
        quiet = [s.put(*block(s.spec, i), namespace="quiet") for i in range(4)]
        for i in range(40):
            s.put(*block(s.spec, 1000 + i), namespace="flood")
        assert all(s.contains(b, namespace="quiet") for b in quiet)
        assert sum(s.contains(s.put(*block(s.spec, 1000 + i), namespace="flood"), namespace="flood")
                   for i in range(36, 40)) == 4


def test_without_a_share_the_flood_evicts_the_other_namespace(tmp_path):
    """The default (no quota): eviction is shared, as the README says."""
    with store_for(tmp_path, 0.0) as s:
        quiet = [s.put(*block(s.spec, i), namespace="quiet") for i in range(4)]
        for i in range(40):
            s.put(*block(s.spec, 1000 + i), namespace="flood")
        assert not any(s.contains(b, namespace="quiet") for b in quiet)


def test_a_namespace_over_its_share_evicts_its_own_blocks_first(tmp_path):
    with store_for(tmp_path, 0.5, file_bytes=64 * 8192) as s:
        other = [s.put(*block(s.spec, i), namespace="b") for i in range(3)]
        for i in range(10):
            s.put(*block(s.spec, 100 + i), namespace="a")
        shm = s.tiers[0]
        in_shm = {k[0] for k in shm}
        assert sum(1 for k in shm if k[0] == "a") == 4  # half of 8 blocks
        assert all(("b", b) in shm for b in other) and in_shm == {"a", "b"}
        # a's older blocks went down to the file tier, not out of the cache
        assert sum(s.contains(s.put(*block(s.spec, 100 + i), namespace="a"), namespace="a") for i in range(10)) == 10


def test_one_namespace_cannot_pin_more_than_its_share(tmp_path):
    with store_for(tmp_path, 0.5) as s:
        ids = [s.put(*block(s.spec, i), namespace="greedy") for i in range(4)]
        for b in ids:
            s.pin(b, namespace="greedy")  # its whole share, pinned
        s.pin(ids[0], namespace="greedy")  # a second pin of a pinned block takes no more room
        with pytest.raises(TierFull, match="share"):
            s.put(*block(s.spec, 50), namespace="greedy")
        assert len(s) == 4 and s.stats()["rejected"] == 1
        other = [s.put(*block(s.spec, 100 + i), namespace="polite") for i in range(4)]
        for b in other:
            s.pin(b, namespace="polite")  # the other tenant still gets its share
        assert all(s.contains(b, namespace="polite") for b in other)
        assert all(s.contains(b, namespace="greedy") for b in ids)


def test_namespace_share_is_validated():
    with pytest.raises(ConfigError, match="namespace_share"):
        Config(namespace_share=1.5)


class _CountingDict(dict):
    """The store's block table, counting the entries any scan of it visits."""

    visited = 0

    def values(self):
        for value in super().values():
            _CountingDict.visited += 1
            yield value


def test_a_put_at_its_share_does_not_scan_every_block(tmp_path):
    """A tenant at its share moves its own lowest-value block out with a heap lookup: the
    put visits far fewer entries than the store holds (it used to visit all of them)."""
    others = 2000
    with store_for(tmp_path, 0.5, shm_bytes=16 * 4096, file_bytes=(others + 64) * 8192,
                   file_dir=str(tmp_path / "files")) as s:
        for i in range(others):
            s.put(*block(s.spec, i), namespace="big")
        for i in range(8):  # tenant "a" fills its share of the SHM tier (8 of 16 blocks)
            s.put(*block(s.spec, 10_000 + i), namespace="a")
        s._index.blocks = _CountingDict(s._index.blocks)  # the block index behind the store
        _CountingDict.visited = 0
        for i in range(8, 16):  # each put is at the share: one of a's blocks moves down first
            s.put(*block(s.spec, 10_000 + i), namespace="a")
        assert sum(1 for k in s.tiers[0] if k[0] == "a") == 8
        assert _CountingDict.visited < others // 10, _CountingDict.visited


def test_a_batch_stays_within_its_share_and_leaves_another_namespace_its_own(tmp_path):
    # put_many claims a chunk's room before it commits any: each claim's share check saw
    # only committed bytes, so a batch of 12 went 11 into an SHM share of 8 and pushed the
    # other namespace's in-share blocks out
    with store_for(tmp_path, 0.5, block_tokens=256, shm_bytes=16 * 256 * 256, file_bytes=1 << 22,
                   demote_high=1.0) as s:
        other = [s.put(*block(s.spec, i), namespace="B") for i in range(8)]  # B at its share: 8 of 16
        s.put_many([block(s.spec, 100 + i) for i in range(12)], block_ids=[f"{i + 1:032x}" for i in range(12)],
                   namespace="A")
        in_shm = s._index.ns_bytes[0]
        assert in_shm.get("A", 0) <= 8 * s.spec.block_bytes and in_shm.get("B", 0) == 8 * s.spec.block_bytes
        assert all(s.contains(b, namespace="B") for b in other)
        assert all(s.contains(f"{i + 1:032x}", namespace="A") for i in range(12))  # the rest went below
        assert not s._chain._claimed[0] and not s._chain._claimed[1]  # every claim ended
