"""A rank that stops answering while it holds part of the directory: the store's
documented :class:`~cascade.RankFailure` reaches another rank's caller (no hang), and
that caller's store stored nothing for the failed put.

Why a stopped rank and not a dead one: under ``mpiexec`` (MPICH's hydra, even with
``-disable-auto-cleanup``) a rank's death ends every rank of the job at once, so no
survivor is left to see an error (tests/test_rank_failure.py covers that the job then
ends promptly). A rank that is alive but stuck - SIGSTOP here; a hung node, a debugger,
a swapped-out process elsewhere - is what the survivors meet: rank 1 stops inside a put,
after taking the directory bucket lock of the block's id and before writing the entry
(fault injection on its own directory client); rank 0 then puts the same block, waits
on that lock and must get RankFailure after the stall limit (60 s; ``STALL_SECONDS``
here so the test stays short).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("mpi4py", reason="the mpi extra (mpi4py) is not installed")
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
STALL_SECONDS = 3.0
pytestmark = [pytest.mark.mpi, pytest.mark.timeout(180)]


def job(file_dir: str) -> None:
    """The 2-rank job (``python -m mpi4py tests/test_rank_failure_reaches_caller.py DIR``)."""
    import signal
    import time

    import numpy as np
    from mpi4py import MPI

    from cascade import CascadeStore, Config, RankFailure, block_id
    from cascade.distributed import rma
    from cascade.identity import id_owner

    comm = MPI.COMM_WORLD
    store = CascadeStore(Config(model="tiny", shm_bytes=16 * 4096, remote_bytes=0, file_bytes=0,
                                file_dir=file_dir, directory_slots=1 << 10), comm=comm)
    seed = 0
    while True:  # a block whose directory entry lives on rank 0, the survivor
        rng = np.random.default_rng(seed)
        pair = (rng.standard_normal(store.spec.shape).astype(store.spec.dtype),
                rng.standard_normal(store.spec.shape).astype(store.spec.dtype))
        if id_owner(block_id(*pair), comm.size) == 0:
            break
        seed += 1
    pids = comm.allgather(os.getpid())
    if comm.rank == 1:
        def stop(*args, **kwargs):  # holding the bucket lock, the entry not yet written
            os.kill(os.getpid(), signal.SIGSTOP)

        store.cluster.directory._insert_locked = stop
        comm.Barrier()
        store.put(*pair)
        raise AssertionError("rank 1 should have stopped inside put")
    comm.Barrier()
    time.sleep(1.0)  # rank 1 is stopped by now
    rma.STALL_SECONDS = STALL_SECONDS
    started = time.monotonic()
    report = {"error": None}
    try:
        store.put(*pair)
    except RankFailure as exc:
        report = {"error": "RankFailure", "message": str(exc)}
    except Exception as exc:  # noqa: BLE001 - reported to the test
        report = {"error": type(exc).__name__, "message": str(exc)}
    stats = store.stats()
    report |= {"seconds": time.monotonic() - started, "blocks": len(store), "puts": stats["puts"],
               "stored": stats["stored"], "deduped": stats["deduped"], "rejected": stats["rejected"],
               "shm_bytes": stats["tiers"]["shm"]["bytes"], "contains": store.contains(block_id(*pair))}
    with open(os.path.join(file_dir, "report.json"), "w") as f:
        json.dump(report, f)
    os.kill(pids[1], signal.SIGKILL)  # the stuck rank; the launcher then ends the job
    os._exit(0)  # close() is collective: with a stuck peer it cannot complete


def test_a_stuck_peer_holding_a_directory_lock_raises_rankfailure_in_the_caller(tmp_path):
    cmd = [MPIEXEC, "-n", "2", sys.executable, "-m", "mpi4py", __file__, str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    path = tmp_path / "report.json"
    assert path.exists(), f"no report from rank 0 (exit {done.returncode}): {done.stderr[-3000:]}"
    report = json.loads(path.read_text())
    assert report["error"] == "RankFailure", report
    assert "dead or stuck" in report["message"] and "rank 0" in report["message"]
    assert report["seconds"] >= STALL_SECONDS  # it waited the stall limit, then gave up
    # the failed put left nothing behind on the survivor, and the counters still add up
    assert report["blocks"] == 0 and report["shm_bytes"] == 0 and not report["contains"], report
    assert report["puts"] == report["stored"] + report["deduped"] + report["rejected"], report


def test_a_backoff_sleeps_at_most_1_ms_a_try_and_gives_up_only_with_rankfailure(monkeypatch):
    """The wait every blocked directory and lease operation runs (no MPI needed); its
    sleeps are recorded instead of slept."""
    from cascade import RankFailure
    from cascade.distributed import rma

    slept: list[float] = []
    monkeypatch.setattr(rma.time, "sleep", slept.append)
    monkeypatch.setattr(rma, "STALL_SECONDS", float("inf"))
    backoff = rma.Backoff("a test wait")
    for _ in range(5000):  # minutes of real waiting would be a stall, not a slow peer
        backoff.wait()
    assert min(slept) == 0 and max(slept) == 1e-3 and slept[-1] == 1e-3
    monkeypatch.setattr(rma, "STALL_SECONDS", 0.0)  # the stall limit has passed
    with pytest.raises(RankFailure, match="a test wait: still blocked"):
        backoff.wait()


if __name__ == "__main__":
    job(sys.argv[1])
