"""Token-prefix ids (cascade.prefix) and the store's token-id paths."""
from __future__ import annotations

import blake3
import numpy as np
import pytest

import cascade.core.writes
from cascade import CascadeStore, InvalidBlock, ModelFingerprint, model_fingerprint, prefix_ids

FP = model_fingerprint("tiny", "rev-a", "float16", layout="kv", tp_size=2, tp_rank=1)


def test_ids_are_chained_blake3_of_parent_tokens_and_fingerprint():
    tokens = np.arange(40)
    ids = prefix_ids(tokens, block_tokens=16, model_fingerprint=FP)
    assert len(ids) == 2  # the 8-token tail is not a full block
    first = blake3.blake3(b"cascade-prefix/1" + FP.digest + bytes(16)
                          + np.arange(16, dtype="<u4").tobytes()).hexdigest()[:32]
    second = blake3.blake3(b"cascade-prefix/1" + FP.digest + bytes.fromhex(first)
                           + np.arange(16, 32, dtype="<u4").tobytes()).hexdigest()[:32]
    assert ids == [first, second]


def test_equal_prefix_equal_ids_and_extension_from_parent():
    a = list(range(100, 164))
    b = a[:32] + [7] * 32
    ia = prefix_ids(a, block_tokens=16, model_fingerprint=FP)
    ib = prefix_ids(np.array(b, dtype=np.int64), block_tokens=16, model_fingerprint=FP)
    assert ia[:2] == ib[:2] and ia[2] != ib[2] and ia[3] != ib[3]
    assert prefix_ids(a[32:], block_tokens=16, model_fingerprint=FP, parent=ia[1]) == ia[2:]
    # a change in the first block changes every later id (the chain names the whole prefix)
    c = [0] + a[1:]
    assert not set(prefix_ids(c, block_tokens=16, model_fingerprint=FP)) & set(ia)


def test_any_fingerprint_field_changes_every_id():
    tokens = list(range(32))
    base = prefix_ids(tokens, block_tokens=16, model_fingerprint=FP)
    for changed in (model_fingerprint("tiny", "rev-b", "float16", layout="kv", tp_size=2, tp_rank=1),
                    model_fingerprint("tiny", "rev-a", "bfloat16", layout="kv", tp_size=2, tp_rank=1),
                    model_fingerprint("tiny", "rev-a", "float16", layout="kv", tp_size=2, tp_rank=0),
                    model_fingerprint("tiny", "rev-a", "float16", layout="other", tp_size=2, tp_rank=1),
                    model_fingerprint("other", "rev-a", "float16", layout="kv", tp_size=2, tp_rank=1)):
        assert not set(prefix_ids(tokens, block_tokens=16, model_fingerprint=changed)) & set(base)
    assert prefix_ids(tokens, block_tokens=16, model_fingerprint=ModelFingerprint(
        "tiny", "rev-a", "float16", "kv", 2, 1)) == base


@pytest.mark.parametrize("bad", [[-1, 2], [1 << 32], [1.5, 2.0], [[1, 2]], ["a"]])
def test_bad_tokens_are_rejected(bad):
    with pytest.raises(InvalidBlock):
        prefix_ids(bad, block_tokens=1, model_fingerprint=FP)


def test_bad_arguments_are_rejected():
    with pytest.raises(InvalidBlock):
        prefix_ids([1], block_tokens=0, model_fingerprint=FP)
    with pytest.raises(InvalidBlock):
        prefix_ids([1], block_tokens=1, model_fingerprint="tiny")
    with pytest.raises(InvalidBlock):
        prefix_ids([1], block_tokens=1, model_fingerprint=FP, parent="not-an-id")
    with pytest.raises(InvalidBlock):
        model_fingerprint("tiny", "", "float16")
    with pytest.raises(InvalidBlock):
        model_fingerprint("tiny", "r", "float16", tp_size=2, tp_rank=2)
    assert prefix_ids([], block_tokens=4, model_fingerprint=FP) == []


def test_store_put_with_prefix_ids_does_no_kv_hashing(tiny_config, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("put hashed the KV")

    monkeypatch.setattr(cascade.core.writes, "compute_block_id", boom)
    with CascadeStore(tiny_config) as store:
        bt = store.config.block_tokens
        tokens = np.arange(5 * bt + 3)
        ids = prefix_ids(tokens, block_tokens=bt, model_fingerprint=FP)
        rng = np.random.default_rng(0)
        blocks = []
        parent = None
        for bid in ids[:3]:
            k, v = (rng.standard_normal(store.spec.shape).astype(store.spec.dtype) for _ in range(2))
            assert store.put(k, v, block_id=bid, parent=parent) == bid
            blocks.append((k, v))
            parent = bid
        assert store.longest_prefix(tokens=tokens, model_fingerprint=FP) == 3
        assert store.longest_prefix(ids) == 3
        other = model_fingerprint("tiny", "rev-new-weights", "float16")
        assert store.longest_prefix(tokens=tokens, model_fingerprint=other) == 0
        for bid, (k, v) in zip(ids, blocks):
            got_k, got_v = store.get(bid)
            assert np.array_equal(got_k, k) and np.array_equal(got_v, v)
        with pytest.raises(InvalidBlock):
            store.longest_prefix()
        with pytest.raises(InvalidBlock):
            store.longest_prefix(ids, tokens=tokens, model_fingerprint=FP)


def test_trace_requests_as_tokens_share_prefix_ids_as_their_hash_ids_do():
    from cascade.trace import Request, request_tokens
    from cascade.workload import WorkloadParams, generate

    requests = generate(WorkloadParams(n_conversations=30, n_document_queries=20, n_documents=4), seed=1)
    by_hash: dict[int, str] = {}
    for r in requests:
        tokens = request_tokens(r, 512)
        assert len(tokens) == r.input_length
        ids = prefix_ids(tokens, block_tokens=512, model_fingerprint=FP)
        assert len(ids) == r.input_length // 512
        for h, bid in zip(r.hash_ids, ids):
            assert by_hash.setdefault(h, bid) == bid  # equal hash id <=> equal prefix id
    assert len(set(by_hash.values())) == len(by_hash)
    assert len(request_tokens(Request(0, 0, 1, ()), 512)) == 0
