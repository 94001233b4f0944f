"""Replay with a visible request queue: scheduler hints (store.hint) keep queued blocks,
and the store's policy matches the lookahead oracle that sees the same queue."""
from __future__ import annotations

import numpy as np
import pytest

from benchmark.reference_policies import simulate

from cascade import CascadeStore, Config
from cascade.errors import ConfigError
from cascade.models import BlockSpec
from cascade.replay import replay
from cascade.trace import Request
from cascade.workload import WorkloadParams, generate


def _store(tmp_path, blocks: int, fraction: float = 0.5, policy: str = "semantic") -> CascadeStore:
    return CascadeStore(Config(shm_bytes=blocks * 4096, file_bytes=0, file_dir=str(tmp_path / "f"),
                               hint_fraction=fraction, policy=policy), block_spec=BlockSpec.flat(4096))


def test_a_queued_request_keeps_its_block(tmp_path):
    # A, B, C, A through a two-block cache: without the queue A's block is the victim
    requests = [Request(0, 512, 1, (h,)) for h in (1, 2, 3, 1)]
    with _store(tmp_path, 2) as store:
        assert replay(store, requests, queue_depth=0).hits == 0
    with _store(tmp_path, 2) as store:
        r = replay(store, requests, queue_depth=3)
        assert r.hits == 1 and r.store_stats["hints"] >= 1
        assert r.store_stats["hinted_bytes"] == 0  # every hint was used up by its read
    with _store(tmp_path, 2, fraction=0.0) as store:  # no room for hints: as depth 0
        assert replay(store, requests, queue_depth=3).hits == 0


def test_hints_stay_within_the_cap_on_a_generated_workload(tmp_path):
    params = WorkloadParams(n_conversations=60, n_document_queries=40, n_documents=8)
    requests = generate(params, seed=3)
    ratios = {}
    for depth in (0, 16):
        with _store(tmp_path, 200, fraction=0.25) as store:
            original = store.hint

            def checked(ids, **kw):
                taken = original(ids, **kw)
                assert store.stats()["hinted_bytes"] <= 0.25 * 200 * 4096
                return taken

            store.hint = checked
            r = replay(store, requests, queue_depth=depth)
            ratios[depth] = r.block_hit_ratio
            assert (r.store_stats["hints"] > 0) == (depth > 0)
    assert ratios[16] >= ratios[0] - 0.02  # hints must not cost hits on this workload


@pytest.mark.parametrize("seed", range(4))
def test_lru_with_hints_is_the_lookahead_oracle(tmp_path, seed):
    # One block per request: pins and in-request order play no part, so LRU plus hints
    # ranked by next use makes exactly the oracle's choices at every depth.
    rng = np.random.default_rng(seed)
    requests = [Request(i, 512, 1, (int(h),)) for i, h in enumerate(rng.zipf(1.3, 300) % 40)]
    for depth in (0, 1, 4, 16, 64):
        with _store(tmp_path, 8, fraction=1.0, policy="lru") as store:
            got = replay(store, requests, queue_depth=depth).hits
        assert got == simulate(requests, "lookahead", 8, depth=depth).hits, depth


def test_a_deeper_queue_never_hits_less_and_keeps_up_with_the_oracle(tmp_path):
    # Multi-block requests sharing prefixes, a cache far smaller than the working set; the
    # default policy and hint cap (the whole tier).
    params = WorkloadParams(n_conversations=60, n_document_queries=40, n_documents=8)
    requests = generate(params, seed=3)
    capacity = 150
    ratios = []
    for depth in (0, 4, 16, 64, 256):
        with CascadeStore(Config(shm_bytes=capacity * 4096, file_bytes=0, file_dir=str(tmp_path / "f")),
                          block_spec=BlockSpec.flat(4096)) as store:
            r = replay(store, requests, tokens_per_block=params.tokens_per_block, queue_depth=depth)
        oracle = simulate(requests, "lookahead", capacity, params.tokens_per_block, depth=depth)
        assert r.block_hit_ratio >= 0.95 * oracle.block_hit_ratio, (depth, r.block_hit_ratio, oracle.block_hit_ratio)
        ratios.append(r.block_hit_ratio)
    assert ratios == sorted(ratios) and ratios[-1] > ratios[0]


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_bad_queue_depth(tmp_path, bad):
    with _store(tmp_path, 2) as store, pytest.raises(ConfigError):
        replay(store, [], queue_depth=bad)
