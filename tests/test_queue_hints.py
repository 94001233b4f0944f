"""Replay with a visible request queue: scheduler hints (store.hint) keep queued blocks."""
from __future__ import annotations

import pytest

from cascade import CascadeStore, Config
from cascade.errors import ConfigError
from cascade.models import BlockSpec
from cascade.replay import replay
from cascade.trace import Request
from cascade.workload import WorkloadParams, generate


def _store(tmp_path, blocks: int, fraction: float = 0.5) -> CascadeStore:
    return CascadeStore(Config(shm_bytes=blocks * 4096, file_bytes=0, file_dir=str(tmp_path / "f"),
                               hint_fraction=fraction), block_spec=BlockSpec.flat(4096))


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


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_bad_queue_depth(tmp_path, bad):
    with _store(tmp_path, 2) as store, pytest.raises(ConfigError):
        replay(store, [], queue_depth=bad)
