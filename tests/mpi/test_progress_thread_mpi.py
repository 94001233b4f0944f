"""A rank computing in pure Python serves other nodes' atomics on its window while a
ProgressThread runs. Across emulated nodes (MPIR_CVAR_NUM_CLIQUES=2) MPICH serves those
atomics only when the target enters MPI, so without the thread the busy rank would never
see the other rank's Fetch_and_op land; on one node atomics run in shared memory and
the test holds either way."""
from __future__ import annotations

import time

import numpy as np
import pytest
from collective import raises

from cascade.distributed.progress_thread import ProgressThread
from cascade.distributed.rma import allocate_window, free_window

MPI = pytest.importorskip("mpi4py.MPI", reason="the mpi extra (mpi4py) is not installed")
GIVE_UP_SECONDS = 20.0


def test_a_busy_rank_with_a_progress_thread_sees_another_ranks_atomic_land(comm, everywhere):
    if comm.size < 2:
        pytest.skip("needs a second rank")
    target, origin = 0, comm.size - 1  # on different emulated nodes at 4 ranks, 2 cliques
    win = allocate_window(comm, 8, 8, label="progress_test")
    try:
        with ProgressThread(comm, interval=2e-4, switch_interval=2e-4) as thread:
            comm.Barrier()
            landed = True
            if comm.rank == target:
                mine = np.frombuffer(win.tomemory(), dtype=np.uint64)
                end = time.monotonic() + GIVE_UP_SECONDS
                while mine[0] == 0 and time.monotonic() < end:  # pure Python, no MPI call
                    pass
                landed = mine[0] == 5
            elif comm.rank == origin:
                got = np.zeros(1, dtype=np.uint64)
                win.Fetch_and_op(np.array([5], dtype=np.uint64), got, target, 0, MPI.SUM)
                win.Flush(target)
            visits = thread.visits
        comm.Barrier()
        assert everywhere(landed, f"the atomic did not land in {GIVE_UP_SECONDS} s (thread visits: {visits})")
    finally:
        free_window(win)


def test_a_progress_thread_refuses_a_bad_interval(comm, everywhere):
    assert everywhere(raises(ValueError, ProgressThread, comm, 0.0))


@pytest.mark.parametrize("setting", ["on", "auto"])
def test_the_store_runs_a_progress_thread_as_configured_until_close(comm, everywhere, shared_dir, setting):
    from cascade import CascadeStore, Config

    if comm.size < 2:
        pytest.skip("the cluster (and its thread) exists only with several ranks")
    store = CascadeStore(Config(model="tiny", shm_bytes=1 << 20, remote_bytes=0, file_bytes=0, file_dir=shared_dir,
                                directory_slots=1 << 10, mpi_progress=setting), comm=comm)
    cluster = store.cluster
    thread = cluster.progress_thread
    wanted = setting == "on" or cluster.atomics_progress is False  # auto: when atomics wait for the target
    running = thread is not None and thread._thread is not None and thread._thread.is_alive()
    store.close()
    stopped = thread is None or thread._thread is None
    assert everywhere(running == wanted and stopped and cluster.progress_thread is None,
                      f"{setting}: running {running}, wanted {wanted}, stopped {stopped}")


def test_threads_setting_a_switch_interval_leave_the_process_as_they_found_it(comm, everywhere):
    import sys

    before = sys.getswitchinterval()
    a = ProgressThread(comm, 1e-3, switch_interval=2e-4).start()
    b = ProgressThread(comm, 1e-3, switch_interval=1e-4).start()
    both = sys.getswitchinterval()
    a.stop()  # stopped in the order started: the one left still gets its interval
    one_left = sys.getswitchinterval()
    b.stop()
    after = sys.getswitchinterval()
    close = [abs(got - want) < 1e-7 for got, want in ((both, 1e-4), (one_left, 1e-4), (after, before))]
    assert everywhere(all(close), (both, one_left, after, before))
