"""A rank that dies in a multi-rank run: the job ends promptly with an error (no hang),
and a restarted job warm-starts from the file tier (runs mpiexec in a subprocess)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from cascade.testing import mpich_segments

pytest.importorskip("mpi4py", reason="the mpi extra (mpi4py) is not installed")
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]




def test_dead_rank_fails_fast_and_restart_warm_starts(tmp_path):
    file_dir = tmp_path / "agg"
    file_dir.mkdir()
    cmd = [MPIEXEC, "-n", "4", sys.executable, "-m", "mpi4py", "-m", "cascade.testing.rank_failure_job", str(file_dir)]
    before = mpich_segments.segments()
    t0 = time.monotonic()
    crashed = subprocess.run([*cmd, "write"], capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - t0
    # MPICH leaves the killed job's shared-memory segment behind; a later job that drew
    # the same name would attach to it, so remove what this dead job left
    mpich_segments.remove_orphans(before)
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
