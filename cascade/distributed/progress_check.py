"""Start-up self-test: do atomics to another node complete while its rank computes?

MPICH (the PyPI wheel at least, ch4 ucx and ofi) runs inter-node ``Compare_and_swap``
and ``Fetch_and_op`` as active messages that wait until the target enters MPI; plain
``Get`` completes regardless. Cascade's read path therefore uses Gets only (see
:meth:`.cluster.Cluster.read`), but puts, pins and evictions still take atomics. This
check measures one: rank 0 computes in pure Python for :data:`BUSY_SECONDS` while the
first rank of another node times a ``Fetch_and_op`` on rank 0's memory. Slow means
atomics need the target's progress: it logs a warning naming the remedy
(``MPIR_CVAR_ASYNC_PROGRESS=1`` with spare cores, or a network with hardware atomics).
Collective; costs about :data:`BUSY_SECONDS` plus a tiny window, only on multi-node jobs.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import numpy as np

from .rma import allocate_window, free_window, load_mpi

if TYPE_CHECKING:
    from mpi4py import MPI

log = logging.getLogger(__name__)
BUSY_SECONDS = 0.1
SLOW_SECONDS = 0.02


def atomic_wait_seconds(comm: MPI.Comm, node_of: list[int]) -> float | None:
    """Collective. Seconds one inter-node ``Fetch_and_op`` took while rank 0 computed, or
    None when all ranks share one node (on-node atomics run in shared memory)."""
    others = [r for r, node in enumerate(node_of) if node != node_of[0]]
    if not others:
        return None
    MPI = load_mpi()
    win = allocate_window(comm, 8, 8, label="self_test")
    try:
        origin, result = np.ones(1, dtype=np.uint64), np.zeros(1, dtype=np.uint64)
        win.Fetch_and_op(origin, result, 0, 0, MPI.SUM)  # connect first: time the op, not set-up
        win.Flush(0)
        comm.Barrier()
        waited = 0.0
        if comm.Get_rank() == 0:
            end = time.perf_counter() + BUSY_SECONDS
            while time.perf_counter() < end:  # pure Python: no MPI progress here
                pass
        elif comm.Get_rank() == others[0]:
            time.sleep(BUSY_SECONDS / 10)
            t0 = time.perf_counter()
            win.Fetch_and_op(origin, result, 0, 0, MPI.SUM)
            win.Flush(0)
            waited = time.perf_counter() - t0
        waited = comm.bcast(waited, root=others[0])
    finally:
        free_window(win)
    return waited


def check_progress(comm: MPI.Comm, node_of: list[int]) -> bool | None:
    """Collective. Runs :func:`atomic_wait_seconds`; True when inter-node atomics
    progress without the target, False (and a warning on rank 0) when they wait for it,
    None on one node."""
    waited = atomic_wait_seconds(comm, node_of)
    if waited is None:
        return None
    if waited < SLOW_SECONDS:
        return True
    if comm.Get_rank() == 0:
        log.warning(
            "MPI atomics between nodes waited %.0f ms for a busy target (of %.0f ms busy): "
            "directory updates, pins and leases stall while a rank computes. Reads do not "
            "(Get only). Remedy: config mpi_progress='auto' (a progress thread per rank), "
            "MPIR_CVAR_ASYNC_PROGRESS=1 when cores are spare, or an MPI whose network does "
            "hardware atomics.", waited * 1e3, BUSY_SECONDS * 1e3)
    return False
