"""A short run of the multi-rank stress (benchmark/workloads/stress_mpi.py): every byte of
every cross-rank hit equals what was put, at every world size and node split."""
from __future__ import annotations

import pytest

from benchmark.workloads import stress_mpi


@pytest.mark.timeout(300, method="thread")
def test_stress_serves_no_wrong_bytes(comm, everywhere):
    result = stress_mpi.run(comm, hits=600 * comm.size, seconds=30)
    total = result["total"]
    assert total["wrong_bytes"] == 0 and total["wrong_blocks"] == 0
    assert total["invariant_broken"] == 0  # puts == stored + deduped + rejected on every rank
    if comm.size > 1:
        assert total["cross_hits"] >= 600 * comm.size  # the cross-rank paths were exercised
        for name, phase in result["phases"].items():
            assert phase["cross_hits"] > 0, name
