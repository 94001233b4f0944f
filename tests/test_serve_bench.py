"""The cluster_serving benchmark workload at a tiny size: both parts run for real (the
serving part through real LMCache StorageManagers) and what they read is what they wrote (the figures themselves belong to benchmark/results)."""
from __future__ import annotations

import pytest

pytest.importorskip("mpi4py", reason="the mpi extra (mpi4py) is not installed")
pytestmark = [pytest.mark.mpi, pytest.mark.timeout(180)]


def test_cluster_serving_measures_both_paths_and_replays_shared_and_private(tmp_path):
    from benchmark.workloads import cluster_serving

    result = cluster_serving.run({"sizes": [8192], "blocks": 8, "requests": 12, "file_dir": str(tmp_path)})
    (attach,) = result["attach"]
    for side in ("in_process", "attached"):
        assert attach[side]["hits"] == 8 and attach[side]["exact"], attach[side]
        assert attach[side]["put"]["n"] == attach[side]["get"]["n"] == 8
    # the attached put's parts add up to its p50, each measured (the staging copy on its own)
    assert attach["attached"]["staging_copy"]["n"] == 8
    parts = attach["put_breakdown_us_p50"]
    assert sum(parts.values()) == pytest.approx(1e6 * attach["attached"]["put"]["p50"])
    assert all(parts[k] > 0 for k in ("staging_copy", "round_trip", "store_put"))
    serving = result["serving"]
    assert serving["ranks"] == 2 and len(serving["shared"]["per_client"]) == 2
    # every way replayed the same references through a real LMCache StorageManager, and
    # every chunk read back was the one asked for
    ways = ("shared", "private", "lmcache_cpu_disk")
    assert len({serving[w]["references"] for w in ways}) == 1 and all(serving[w]["wrong_chunks"] == 0 for w in ways)
    assert serving["shared"]["backends"] == ["LocalCPUBackend", "cascade"]
    assert serving["lmcache_cpu_disk"]["backends"] == ["LocalCPUBackend", "LocalDiskBackend"]
    # the engines' references met chunks the other engine stored: some came from the other rank
    assert serving["shared"]["bytes_from_other_ranks"] > 0
    assert 0 < serving["private"]["global"] <= serving["shared"]["global"] <= 1
    # private stores of either kind, same capacity, nothing evicted: the same hits
    assert serving["lmcache_cpu_disk"]["global"] == serving["private"]["global"]
    assert "attached" in cluster_serving.table(result)
