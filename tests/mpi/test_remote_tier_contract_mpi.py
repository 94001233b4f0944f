"""The shipped tier contract (cascade.testing.tier_contract) run against the REMOTE tier.

The ranks are paired (0-1, 2-3, ...): in each pair the odd rank exposes a window and the
even rank writes into it through its REMOTE tier, alone, so the contract's capacity
arithmetic holds; the odd rank takes part in each tier's collective creation and freeing
and skips the body. At one rank (no pair) every test is skipped: the REMOTE tier holds
bytes only in other ranks' windows.
"""
from __future__ import annotations

import pytest

from cascade.testing.tier_contract import TierContract
from cascade.distributed.remote_tier import RemoteTier

MPI = pytest.importorskip("mpi4py.MPI", reason="the mpi extra (mpi4py) is not installed")
CHUNK = 4096


class TestRemoteTier(TierContract):
    @pytest.fixture
    def tier(self, comm):
        pair = comm.Split(comm.rank // 2, comm.rank)
        try:
            writer = pair.rank == 0
            exposed = 0 if writer else self.capacity
            t = RemoteTier(pair, exposed, chunk_bytes=CHUNK)
            if pair.size < 2 or not writer:
                t.close()  # collective: waits for the writer's close at its test's end
                pytest.skip("needs a pair of ranks: only the writer of each pair runs the contract")
            yield t
            t.close()
        finally:
            pair.Free()
