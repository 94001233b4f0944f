"""Pure tests of the directory's table layout and the window slab's lease arithmetic (no MPI)."""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cascade.distributed import layout as L
from cascade.distributed.window_chunks import WORD_BITS, chunks_needed, find_run, run_mask
from cascade.errors import InvalidBlock
from cascade.identity import id_owner

ids = st.binary(min_size=16, max_size=16).map(bytes.hex)
counts = st.integers(0, L.COUNT_MAX)
versions = st.integers(0, (1 << L.VERSION_BITS) - 1)


def _entry(**kw) -> L.DirectoryEntry:
    return L.DirectoryEntry(**{"tier": 2, "rank": 3, "location": 1 << 40, "length": 5 << 20,
                               "checksum": 0xDEADBEEF, **kw})


def _bucket_with(slots: dict[int, bytes]) -> bytearray:
    buf = bytearray(L.BUCKET_BYTES)
    for i, raw in slots.items():
        buf[L.slot_offset(i):L.slot_offset(i) + len(raw)] = raw
    return buf


# -- owners, buckets, probing ----------------------------------------------------------
@given(st.lists(ids, min_size=1, max_size=50), st.integers(1, 1000), st.integers(1, 5000))
def test_vectorised_owner_and_home_match_scalar(block_ids, size, nbuckets):
    words = L.ids_to_words(block_ids)
    ns = L.namespace_hash("tenant/model")
    nsw = np.full(len(block_ids), int.from_bytes(ns, "little"), dtype=np.uint64)
    assert L.owners_of(words, size).tolist() == [id_owner(b, size) for b in block_ids]
    homes = L.homes_of(nsw, words, nbuckets).tolist()
    assert homes == [L.home_bucket(ns + bytes.fromhex(b), nbuckets) for b in block_ids]
    assert all(0 <= h < nbuckets for h in homes)


def test_ids_to_words_is_the_raw_id_bytes():
    block_ids = [os.urandom(16).hex() for _ in range(5)]
    assert L.ids_to_words(block_ids).tobytes() == bytes.fromhex("".join(block_ids))
    assert L.ids_to_words([]).shape == (0, 2)


@pytest.mark.parametrize("bad", ["A" * 32, "0" * 31, "0" * 33, "g" * 32, " " + "0" * 31, 17, "é" * 32])
def test_ids_to_words_rejects_malformed_ids(bad):
    with pytest.raises(InvalidBlock):
        L.ids_to_words(["0" * 32, bad])


def test_home_bucket_is_independent_of_the_owner():
    # Ids owned by one rank of 4 must still spread over all buckets of its shard.
    owned = [b for b in (os.urandom(16).hex() for _ in range(4000)) if id_owner(b, 4) == 0]
    homes = {L.home_bucket(L.key_bytes("ns", b), 8) for b in owned}
    assert homes == set(range(8))


def test_probe_wraps_and_is_bounded():
    assert [L.probe_bucket(6, d, 8) for d in range(4)] == [6, 7, 0, 1]
    assert L.max_probe(1) == 0
    assert L.max_probe(10) == 9
    assert L.max_probe(10_000) == L.MAX_PROBE - 1


def test_addresses_are_consistent():
    assert L.BUCKET_BYTES == 8 * (L.HEADER_WORDS + L.BUCKET_SLOTS * L.ENTRY_WORDS)
    for b, i in [(0, 0), (3, 5), (100, L.BUCKET_SLOTS - 1)]:
        assert 8 * L.slot_disp(b, i) == 8 * L.bucket_disp(b) + L.slot_offset(i)
    assert L.buckets_for(0) == 1
    assert L.buckets_for(L.BUCKET_SLOTS + 1) == 2


def test_namespace_hash_is_8_stable_distinct_bytes():
    assert len(L.namespace_hash("a")) == 8
    assert L.namespace_hash("a") == L.namespace_hash("a") != L.namespace_hash("b")
    assert L.key_bytes("a", "00" * 16) == L.namespace_hash("a") + bytes(16)


# -- CTL word --------------------------------------------------------------------------
@given(st.sampled_from([L.EMPTY, L.WRITING, L.VALID, L.DELETED]), counts, counts, versions)
def test_ctl_round_trip(state, refs, children, version):
    ctl = L.make_ctl(state, refs, children, version)
    assert ctl < 1 << 64
    assert (L.ctl_state(ctl), L.ctl_refs(ctl), L.ctl_children(ctl), L.ctl_version(ctl)) == \
        (state, refs, children, version)


@given(counts, counts, versions, st.integers(-L.COUNT_MAX, L.COUNT_MAX))
def test_count_arithmetic_touches_only_its_field(refs, children, version, delta):
    # What _adjust sends as a compare-and-swap: ctl + (delta << shift), when in range.
    ctl = L.make_ctl(L.VALID, refs, children, version)
    if 0 <= refs + delta <= L.COUNT_MAX:
        assert ctl + (delta << L.REFS_SHIFT) == L.make_ctl(L.VALID, refs + delta, children, version)
    if 0 <= children + delta <= L.COUNT_MAX:
        assert ctl + (delta << L.CHILDREN_SHIFT) == L.make_ctl(L.VALID, refs, children + delta, version)


def test_next_ctl_bumps_and_wraps_the_version():
    top = (1 << L.VERSION_BITS) - 1
    ctl = L.make_ctl(L.VALID, 3, 4, top)
    moved = L.next_ctl(ctl, L.WRITING)
    assert (L.ctl_state(moved), L.ctl_refs(moved), L.ctl_children(moved), L.ctl_version(moved)) == \
        (L.WRITING, 3, 4, 0)
    assert L.next_ctl(ctl, L.DELETED, keep_counts=False) == L.make_ctl(L.DELETED, 0, 0, 0)


def test_make_ctl_rejects_counts_out_of_range():
    with pytest.raises(ValueError):
        L.make_ctl(L.VALID, refs=L.COUNT_MAX + 1)
    with pytest.raises(ValueError):
        L.make_ctl(L.VALID, children=-1)


# -- slots and seals -------------------------------------------------------------------
@given(st.integers(0, 255), st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1),
       st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), counts, counts, versions,
       st.integers(0, 2**64 - 1))
def test_slot_round_trip(tier, rank, location, length, checksum, refs, children, version, shares):
    entry = L.DirectoryEntry(tier, rank, location, length, checksum, refs, shares, children, version)
    raw = L.pack_slot(b"k" * L.KEY_BYTES, L.make_ctl(L.VALID, refs, children, version), entry)
    assert len(raw) == 8 * L.ENTRY_WORDS
    ctl, back = L.read_slot(raw, 0)
    assert back == entry
    assert ctl == L.make_ctl(L.VALID, refs, children, version)


def test_placement_is_what_expect_compares():
    assert _entry().placement() == (2, 3, 1 << 40)


@pytest.mark.parametrize("bad", [{"tier": 256}, {"rank": -1}, {"location": 1 << 64}, {"length": -1},
                                 {"checksum": 1 << 64}, {"refs": L.COUNT_MAX + 1}, {"children": -1}])
def test_check_entry_refuses_what_does_not_fit(bad):
    assert L.check_entry(_entry()) == _entry()
    with pytest.raises(ValueError):
        L.check_entry(_entry(**bad))


def test_pack_place_rejects_out_of_range():
    with pytest.raises(ValueError):
        L.pack_place(256, 0)
    with pytest.raises(ValueError):
        L.pack_place(0, 1 << 32)


@pytest.mark.parametrize("word", range(L.NS, L.CHECKSUM + 1))
def test_a_changed_sealed_word_fails_the_seal(word):
    raw = L.pack_slot(b"k" * L.KEY_BYTES, L.make_ctl(L.VALID, version=9), _entry())
    raw[8 * word] ^= 1
    assert L.read_slot(raw, 0) is None


def test_a_torn_read_of_two_versions_fails_the_seal():
    key = b"k" * L.KEY_BYTES
    old = L.pack_slot(key, L.make_ctl(L.VALID, version=4), _entry(location=100, length=10))
    new = L.pack_slot(key, L.make_ctl(L.VALID, version=6), _entry(location=200, length=20))
    for cut in range(8, len(old), 8):  # a Get that saw the first `cut` bytes new, the rest old
        torn = new[:cut] + old[cut:]
        assert L.read_slot(torn, 0) in (None, L.read_slot(new, 0), L.read_slot(old, 0))
        torn = old[:cut] + new[cut:]
        assert L.read_slot(torn, 0) in (None, L.read_slot(new, 0), L.read_slot(old, 0))
    # the same words under another version (a reused slot read stale) fail too
    stale = bytearray(old)
    stale[8 * L.CTL:8 * L.CTL + 8] = new[8 * L.CTL:8 * L.CTL + 8]
    assert L.read_slot(stale, 0) is None


def test_counts_and_shares_change_without_resealing():
    raw = L.pack_slot(b"k" * L.KEY_BYTES, L.make_ctl(L.VALID, version=1), _entry())
    raw[8 * L.CTL:8 * L.CTL + 8] = L.make_ctl(L.VALID, 5, 6, 1).to_bytes(8, "little")
    raw[8 * L.SHARES:8 * L.SHARES + 8] = (42).to_bytes(8, "little")
    _, entry = L.read_slot(raw, 0)
    assert (entry.refs, entry.children, entry.shares) == (5, 6, 42)


@pytest.mark.parametrize("state", [L.EMPTY, L.WRITING, L.DELETED])
def test_only_valid_slots_read(state):
    raw = L.pack_slot(b"k" * L.KEY_BYTES, L.make_ctl(state, version=2), _entry())
    assert L.read_slot(raw, 0) is None


def test_find_in_bucket_matches_aligned_live_copies_only():
    key = L.key_bytes("ns", os.urandom(16).hex())
    decoy = _entry(location=int.from_bytes(key[:8], "little"), length=int.from_bytes(key[8:16], "little"),
                   checksum=int.from_bytes(key[16:], "little"))  # the key's bytes at a wrong offset
    live = _entry(location=77)
    buf = _bucket_with({1: L.pack_slot(key, L.make_ctl(L.DELETED, version=3), _entry()),
                        2: L.pack_slot(b"x" * L.KEY_BYTES, L.make_ctl(L.VALID), decoy),
                        6: L.pack_slot(key, L.make_ctl(L.VALID, version=8), live)})
    hit, busy = L.find_in_bucket(buf, key)
    assert hit == (6, L.make_ctl(L.VALID, version=8), dataclasses.replace(live, version=8)) and not busy
    assert L.read_live(buf, key) is None  # the fast path takes only a live first copy
    only_live = _bucket_with({6: L.pack_slot(key, L.make_ctl(L.VALID, version=8), live)})
    assert L.read_live(only_live, key) == hit[2]
    twice = bytearray(L.BUCKET_BYTES) + buf
    assert L.find_in_bucket(twice, key, L.BUCKET_BYTES)[0][0] == 6
    assert L.find_in_bucket(twice, key, 0) == (None, False)
    assert L.find_in_bucket(buf, L.key_bytes("other", "00" * 16)) == (None, False)


@pytest.mark.parametrize("state", [L.WRITING, L.VALID])
def test_find_in_bucket_reports_a_slot_in_flight_as_busy(state):
    key = L.key_bytes("ns", "ab" * 16)
    raw = L.pack_slot(key, L.make_ctl(state, version=2), _entry())
    raw[8 * L.LOCATION] ^= 1  # for VALID: a torn read
    assert L.find_in_bucket(_bucket_with({4: raw}), key) == (None, True)
    assert L.read_live(_bucket_with({4: raw}), key) is None


def test_entries_of_equals_read_slot_and_catches_tears():
    rows = [L.pack_slot(L.key_bytes("ns", os.urandom(16).hex()),
                        L.make_ctl(L.VALID, refs=i, children=2 * i, version=100 + i),
                        _entry(location=i, length=3 * i, checksum=i * i, shares=i + 1)) for i in range(20)]
    rows[7][8 * L.LENGTH] ^= 4  # torn
    words = np.frombuffer(b"".join(rows), dtype=np.uint64).reshape(len(rows), L.ENTRY_WORDS)
    expected = [(r := L.read_slot(row, 0)) and r[1] for row in rows]
    assert expected[7] is None
    assert L.entries_of(words) == expected
    assert L.entries_of(words[:0]) == []


def test_slot_ctls_and_reach_read_the_right_words():
    buf = _bucket_with({i: L.pack_slot(b"k" * L.KEY_BYTES, L.make_ctl(L.VALID, version=i), _entry())
                        for i in range(0, L.BUCKET_SLOTS, 2)})
    buf[8 * L.MAXDIST:8 * L.MAXDIST + 8] = (7).to_bytes(8, "little")
    assert [L.ctl_version(c) if c else None for c in L.slot_ctls(buf)] == \
        [i if i % 2 == 0 else None for i in range(L.BUCKET_SLOTS)]
    assert L.bucket_reach(buf) == 7


# -- window slab lease arithmetic -------------------------------------------------------
def _brute_run(word: int, nbits: int, run: int) -> int | None:
    for start in range(nbits - run + 1):
        if all(not word >> b & 1 for b in range(start, start + run)):
            return start
    return None


@given(st.integers(0, 2**64 - 1), st.integers(0, 64), st.integers(1, 64))
def test_find_run_matches_brute_force(word, nbits, run):
    assert find_run(word, nbits, run) == _brute_run(word, nbits, run)


def test_run_mask_and_chunks_needed():
    assert run_mask(0, 1) == 1
    assert run_mask(3, 2) == 0b11000
    assert run_mask(0, WORD_BITS) == (1 << 64) - 1
    assert chunks_needed(0, 16) == 1
    assert chunks_needed(16, 16) == 1
    assert chunks_needed(17, 16) == 2


def test_a_placeholder_keeps_only_its_counts():
    """A block removed while its children are cached leaves a placeholder: tier
    NO_TIER (no tier kind uses it), no place, no checksum, the child count intact."""
    from cascade.distributed.cluster import TierKind

    assert all(kind < L.NO_TIER for kind in TierKind if kind is not TierKind.NONE)
    assert TierKind.NONE == L.NO_TIER
    ctl = L.make_ctl(L.VALID, refs=0, children=3, version=7)
    raw = L.pack_slot(b"k" * L.KEY_BYTES, ctl, L.DirectoryEntry(L.NO_TIER, 0, 0, 0, 0, children=3))
    got = L.read_slot(raw, 0)[1]
    assert (got.tier, got.location, got.length, got.checksum, got.children) == (L.NO_TIER, 0, 0, 0, 3)


@given(st.integers(0, (1 << 64) - 1))
def test_the_block_checksum_round_trips_and_is_sealed(checksum):
    raw = L.pack_slot(b"k" * L.KEY_BYTES, L.make_ctl(L.VALID, version=1), _entry(checksum=checksum))
    assert L.read_slot(raw, 0)[1].checksum == checksum
    raw[8 * L.CHECKSUM] ^= 0x80
    assert L.read_slot(raw, 0) is None
