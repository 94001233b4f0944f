"""A rank that dies in a multi-rank run: the job ends promptly with an error (no hang),
and a restarted job warm-starts from the file tier (runs mpiexec in a subprocess)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("mpi4py", reason="the mpi extra (mpi4py) is not installed")
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]

JOB = textwrap.dedent("""
    import json, os, signal, sys, time
    import numpy as np
    from mpi4py import MPI
    from cascade import CascadeStore, Config
    comm = MPI.COMM_WORLD
    file_dir, phase = sys.argv[1], sys.argv[2]
    cfg = Config(model="tiny", shm_bytes=0, remote_bytes=0, file_bytes=64 << 20, file_dir=file_dir,
                 directory_slots=4096)
    store = CascadeStore(cfg, comm=comm)
    def content(rank, i):
        rng = np.random.default_rng([rank, i])
        return rng.standard_normal(store.spec.shape).astype(store.spec.dtype), rng.standard_normal(store.spec.shape).astype(store.spec.dtype)
    if phase == "write":
        ids = [store.put(*content(comm.rank, i)) for i in range(20)]
        comm.Barrier()
        if comm.rank == 0:
            with open(os.path.join(file_dir, "ids.json"), "w") as f:
                json.dump(comm.gather(ids), f)
        else:
            comm.gather(ids)
        comm.Barrier()
        if comm.rank == 2:
            os.kill(os.getpid(), signal.SIGKILL)  # dies without a word to MPI
        while True:  # the others keep working against rank 2's directory shard
            for bid in ids:
                store.contains(bid)
            comm.Barrier()
    else:
        with open(os.path.join(file_dir, "ids.json")) as f:
            everyone = json.load(f)
        wrong = missing = 0
        for rank, ids in enumerate(everyone):
            for i, bid in enumerate(ids):
                got = store.get(bid)
                if got is None:
                    missing += 1
                elif not (np.array_equal(got[0], content(rank, i)[0]) and np.array_equal(got[1], content(rank, i)[1])):
                    wrong += 1
        recovered = comm.allreduce(store.stats()["tiers"]["lustre"]["recovered"])
        totals = (comm.allreduce(wrong), comm.allreduce(missing))
        if comm.rank == 0:
            print(json.dumps({"recovered": recovered, "wrong": totals[0], "missing": totals[1]}), flush=True)
        store.close()
""")


def test_dead_rank_fails_fast_and_restart_warm_starts(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    file_dir = tmp_path / "agg"
    file_dir.mkdir()
    cmd = [MPIEXEC, "-n", "4", sys.executable, "-m", "mpi4py", str(script), str(file_dir)]
    t0 = time.monotonic()
    crashed = subprocess.run([*cmd, "write"], capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - t0
    print(f"job with a killed rank ended in {elapsed:.1f} s with exit code {crashed.returncode}")
    assert crashed.returncode != 0
    assert elapsed < 60
    assert (file_dir / "ids.json").exists()
    t0 = time.monotonic()
    restarted = subprocess.run([*cmd, "read"], capture_output=True, text=True, timeout=120)
    assert restarted.returncode == 0, restarted.stderr[-2000:]
    report = json.loads(restarted.stdout.strip().splitlines()[-1])
    print(f"restart took {time.monotonic() - t0:.1f} s: {report}")
    assert report == {"recovered": 80, "wrong": 0, "missing": 0}
