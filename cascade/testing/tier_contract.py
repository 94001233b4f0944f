"""The contract every tier must meet, as a pytest base class: the mapping, its
capacity, the two-phase reads and writes the store uses, and the capabilities a tier
declares (the store reads only those, never a tier's name or type).

A tier's test is a small subclass that implements ``make_tier(capacity)``::

    class TestShmTier(TierContract):
        def make_tier(self, capacity):
            return ShmTier(capacity)

Every test closes the tiers it makes.
"""
from __future__ import annotations

import numpy as np
import pytest

from ..errors import BlockNotFound, TierFull
from ..tiers.base import Memory, Tier, TierKind

NS = "contract"


def _key(i: int, ns: str = NS) -> tuple[str, str]:
    return (ns, f"{i:032x}")


def _payload(i: int, nbytes: int) -> bytes:
    return np.random.default_rng(i).integers(0, 256, nbytes, dtype=np.uint8).tobytes()


class TierContract:
    """Behaviour shared by all tiers: a mapping of (namespace, id) -> bytes with capacity."""

    capacity = 1 << 20

    def make_tier(self, capacity: int) -> Tier:
        raise NotImplementedError

    @pytest.fixture
    def tier(self):
        t = self.make_tier(self.capacity)
        yield t
        t.close()

    def test_put_get_roundtrip(self, tier):
        data = _payload(1, 10_000)
        tier.put(_key(1), [data[:4000], data[4000:]])
        assert tier[_key(1)] == data
        assert tier.length(_key(1)) == len(data)
        assert _key(1) in tier and len(tier) == 1

    def test_read_parts_into_scatters(self, tier):
        data = _payload(2, 8192)
        tier.put(_key(2), [data])
        a, b = np.empty(4096, np.uint8), np.empty(4096, np.uint8)
        tier.read_parts_into(_key(2), [a, b])
        assert a.tobytes() + b.tobytes() == data

    def test_read_into_offset(self, tier):
        data = _payload(3, 5000)
        tier.put(_key(3), [data])
        out = bytearray(100)
        tier.read_into(_key(3), out, offset=1234)
        assert bytes(out) == data[1234:1334]

    def test_missing_key_raises_block_not_found(self, tier):
        with pytest.raises(BlockNotFound):
            tier[_key(99)]
        with pytest.raises(KeyError):  # BlockNotFound is also a KeyError
            del tier[_key(99)]
        assert _key(99) not in tier

    def test_delete_frees_space(self, tier):
        tier.put(_key(4), [_payload(4, 50_000)])
        used = tier.used
        assert used >= 50_000
        del tier[_key(4)]
        assert tier.used == used - 50_000 and _key(4) not in tier and len(tier) == 0

    def test_namespaces_are_distinct_keys(self, tier):
        tier.put(_key(5, "a"), [b"x" * 100])
        tier.put(_key(5, "b"), [b"y" * 100])
        assert tier[_key(5, "a")] == b"x" * 100 and tier[_key(5, "b")] == b"y" * 100
        assert set(tier) == {_key(5, "a"), _key(5, "b")}

    def test_overfull_put_raises_tier_full_and_keeps_data(self, tier):
        small = _payload(6, 1000)
        tier.put(_key(6), [small])
        with pytest.raises(TierFull):
            tier.put(_key(7), [bytes(self.capacity + 1)])
        assert tier[_key(6)] == small and _key(7) not in tier

    def test_fill_to_capacity_then_full(self, tier):
        block = 64 * 1024
        stored = 0
        while tier.fits(block):
            tier.put(_key(100 + stored), [_payload(stored, block)])
            stored += 1
        assert stored >= 1
        with pytest.raises(TierFull):
            tier.put(_key(99_999), [bytes(block)])
        for i in range(stored):
            assert tier[_key(100 + i)] == _payload(i, block)

    def test_replace_existing_key(self, tier):
        tier.put(_key(8), [b"old" * 10])
        tier.put(_key(8), [b"new" * 20])
        assert tier[_key(8)] == b"new" * 20 and len(tier) == 1

    def test_matches_a_dict_model(self, tier):
        model: dict = {}
        rng = np.random.default_rng(7)
        for step in range(200):
            i = int(rng.integers(0, 20))
            if rng.random() < 0.3 and _key(i) in model:
                del tier[_key(i)]
                del model[_key(i)]
            else:
                data = _payload(step, int(rng.integers(1, 20_000)))
                if tier.fits(len(data)) or _key(i) in model:
                    try:
                        tier.put(_key(i), [data])
                    except TierFull:
                        continue
                    model[_key(i)] = data
        assert set(tier) == set(model)
        for k, v in model.items():
            assert tier[k] == v

    # -- capabilities ----------------------------------------------------------------------
    def test_declares_what_it_is(self, tier):
        assert isinstance(tier.kind, TierKind) and tier.kind is not TierKind.NONE
        assert isinstance(tier.memory, Memory)
        assert all(isinstance(flag, bool)
                   for flag in (tier.concurrent, tier.persistent, tier.records_ttl, tier.collective))

    def test_records_parents_when_persistent(self, tier):
        tier.put(_key(10), [b"p" * 100], parent=_key(11)[1])
        assert tier.parent_of(_key(10)) == (_key(11)[1] if tier.persistent else None)

    def test_records_expiry_when_it_says_so(self, tier):
        tier.put(_key(12), [b"t" * 100])
        assert tier.expires_of(_key(12)) == 0.0
        if tier.records_ttl:
            tier.set_expiry(_key(12), 4.0e9)
            assert tier.expires_of(_key(12)) == 4.0e9 and tier[_key(12)] == b"t" * 100
        else:
            with pytest.raises(NotImplementedError):
                tier.set_expiry(_key(12), 4.0e9)

    # -- two-phase data movement --------------------------------------------------------------
    def test_reserve_fill_commit_and_discard(self, tier):
        data = _payload(13, 5000)
        used = tier.used
        tier.discard(tier.reserve(_key(13), len(data)))  # given back: nothing changed
        assert tier.used == used and _key(13) not in tier
        handle = tier.reserve(_key(13), len(data))
        tier.fill(handle, [data[:1000], data[1000:]])
        tier.commit(_key(13), handle)
        assert tier[_key(13)] == data and tier.used == used + len(data)

    def test_leased_read_is_exact(self, tier):
        data = _payload(14, 8192)
        tier.put(_key(14), [data])
        lease = tier.lease(_key(14))
        assert tier.current(_key(14), lease)
        a, b = np.empty(4096, np.uint8), np.empty(4096, np.uint8)
        tier.read_leased(lease, [a, b])
        tier.release(lease)
        assert a.tobytes() + b.tobytes() == data

    def test_a_leased_read_takes_any_host_buffers_and_refuses_other_sizes(self, tier):
        data = _payload(17, 8192)
        tier.put(_key(17), [data])
        lease = tier.lease(_key(17))
        try:
            a, b = bytearray(4096), np.empty(4096, np.uint8)
            tier.read_leased(lease, [a, b])
            assert bytes(a) + b.tobytes() == data
            for outs in ([np.empty(4096, np.uint8)], [np.empty(4096, np.uint8), np.empty(8192, np.uint8)]):
                with pytest.raises(ValueError):
                    tier.read_leased(lease, outs)
        finally:
            tier.release(lease)

    def test_a_leased_block_deleted_keeps_its_bytes_until_released(self, tier):
        if not tier.concurrent:
            pytest.skip("a non-concurrent tier is read under the store's lock: nothing is deleted meanwhile")
        data = _payload(15, 8192)
        tier.put(_key(15), [data])
        lease = tier.lease(_key(15))
        del tier[_key(15)]
        tier.put(_key(16), [_payload(16, 8192)])  # may not reuse the leased bytes
        assert not tier.current(_key(15), lease)
        out = np.empty(8192, np.uint8)
        tier.read_leased(lease, [out])
        tier.release(lease)
        assert out.tobytes() == data and tier[_key(16)] == _payload(16, 8192)
