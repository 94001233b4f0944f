"""benchmark.workloads.mpi_micro at 1 and N ranks, tiny sizes (see conftest.py)."""
from __future__ import annotations

import pytest

pytest.importorskip("mpi4py.MPI", reason="the mpi extra (mpi4py) is not installed")

from benchmark.workloads import mpi_micro  # noqa: E402


def test_mpi_micro_measures_remote_reads_and_directory(comm, everywhere):
    result = mpi_micro.run({"sizes": [64 << 10, 1 << 20], "ids_per_rank": 300, "lookups": 250}, comm)
    figures = {k: v for k, v in result.items() if k != "loadavg_before_after"}  # the load is per rank
    # every rank returns the same figures: the checks below are then one global fact
    assert everywhere(figures == comm.bcast(figures, root=0), "figures differ from rank 0's")
    assert result["ranks"] == comm.size and result["nodes"] >= 1
    bw = result["remote_bandwidth"]
    if comm.size == 1:
        assert "needs 2 ranks" in bw["skipped"]
    else:
        assert [r["bytes"] for r in bw["rows"]] == [64 << 10, 1 << 20]
        for row in bw["rows"]:
            assert row["tier_gbps"] > 0 and row["raw_get_gbps"] > 0 and row["target_rank"] != 0
            assert row["ratio"] == pytest.approx(row["tier_gbps"] / row["raw_get_gbps"])
            assert row["tier_s"]["n"] == row["repeats"] >= 10
        assert "MPI RMA Get" in bw["path"]
    lat = result["directory_latency"]
    assert 0 < lat["lookup_us"]["p50"] <= lat["lookup_us"]["max"] and lat["raw_fetch_and_op_us"]["p50"] > 0
    assert lat["lookup_us"]["n"] > 0 and lat["insert_us"]["n"] == 200
    assert lat["batched"]["ranks_at_once"] == comm.size and lat["batched"]["min_ids_per_s"] > 0
