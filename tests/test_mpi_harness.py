"""The multi-rank test harness keeps its promise (tests/mpi/conftest.py): a check that
fails on one rank fails on every rank with a message naming that rank, and a rank that
fails alone while the others wait in a collective ends the job with its report instead
of a hang. Runs a small test file under ``mpiexec -n 2`` with a copy of the harness."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mpi4py", reason="the mpi extra (mpi4py) is not installed")
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
HARNESS = Path(__file__).parent / "mpi"
pytestmark = [pytest.mark.mpi, pytest.mark.timeout(200)]

TOGETHER = '''
def test_a_collective_assertion_names_the_failing_rank(comm, everywhere):
    assert everywhere(comm.rank != 1, f"rank {comm.rank} saw 41")

def test_a_lone_failure_fails_every_rank(comm):
    assert comm.rank != 1, "only rank 1 fails this"

def test_the_next_test_still_runs_together(comm, everywhere):
    assert everywhere(comm.allreduce(1) == comm.size)
'''

ALONE = '''
def test_a_lone_failure_among_waiting_ranks_ends_the_job(comm):
    assert comm.rank != 1, "rank 1 leaves the others in a barrier"
    comm.Barrier()

def test_never_reached(comm):
    pass
'''


def run_probes(tmp_path: Path, probes: str) -> str:
    """Output of ``probes`` run at 2 ranks under a copy of the harness (3 s straggler wait)."""
    probe_dir = tmp_path / "mpi"
    probe_dir.mkdir()
    shutil.copy(HARNESS / "collective.py", probe_dir)
    conftest = (HARNESS / "conftest.py").read_text()
    assert "STRAGGLER_SECONDS = 30.0" in conftest
    (probe_dir / "conftest.py").write_text(conftest.replace("STRAGGLER_SECONDS = 30.0", "STRAGGLER_SECONDS = 3.0"))
    (probe_dir / "test_probes_mpi.py").write_text(probes)
    # plain ``python -m pytest``, not ``-m mpi4py``: the first rank to exit with failures
    # would abort the others before they print their reports
    cmd = [MPIEXEC, "-n", "2", sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
           "-W", "ignore::pytest.PytestUnknownMarkWarning", "-rA", "--rootdir", str(tmp_path), str(probe_dir)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode != 0
    return done.stdout + done.stderr


def test_a_failure_on_one_rank_is_a_failure_on_every_rank(tmp_path):
    out = run_probes(tmp_path, TOGETHER)
    probe = "FAILED mpi/test_probes_mpi.py::"
    # both ranks report the collective failure, with the failing rank's own detail
    assert out.count(probe + "test_a_collective_assertion_names_the_failing_rank") == 2, out
    assert out.count("rank 1: rank 1 saw 41") >= 2, out
    # a plain assertion failing on rank 1 alone fails rank 0 too, which names rank 1
    assert out.count(probe + "test_a_lone_failure_fails_every_rank") == 2, out
    assert "test_a_lone_failure_fails_every_rank failed on rank(s) [1]" in out, out
    assert out.count("PASSED mpi/test_probes_mpi.py::test_the_next_test_still_runs_together") == 2, out


def test_a_lone_failure_among_waiting_ranks_ends_the_job_with_its_report(tmp_path):
    out = run_probes(tmp_path, ALONE)
    assert "rank 1 failed mpi/test_probes_mpi.py::test_a_lone_failure_among_waiting_ranks_ends_the_job" in out, out
    assert "rank 1 leaves the others in a barrier" in out and "MPI_Abort" in out, out
    assert "test_never_reached" not in out.split("aborting the job")[-1], out
