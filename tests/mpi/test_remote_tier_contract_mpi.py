"""The shipped tier contract (cascade.testing.tier_contract) run against the REMOTE tier.

The ranks are paired (0-1, 2-3, ...) and each pair has its own REMOTE tier: each rank
of a pair exposes a window and writes only into its partner's, so both run the contract
at once, each alone in the room it writes to (the contract's capacity arithmetic holds).
At one rank, or an odd number of them, every rank skips: the REMOTE tier holds bytes
only in other ranks' windows, and the skip must be the same on every rank.
"""
from __future__ import annotations

import pytest

from cascade.distributed.remote_tier import RemoteTier
from cascade.testing.tier_contract import TierContract

MPI = pytest.importorskip("mpi4py.MPI", reason="the mpi extra (mpi4py) is not installed")
CHUNK = 4096


class TestRemoteTier(TierContract):
    @pytest.fixture
    def tier(self, comm):
        if comm.size % 2:
            pytest.skip("needs an even number of ranks (2, 4, ...): each rank writes into its partner's window")
        pair = comm.Split(comm.rank // 2, comm.rank)
        try:
            with RemoteTier(pair, self.capacity, chunk_bytes=CHUNK) as t:
                yield t
        finally:
            pair.Free()
