"""Real SLURM: a one-node cluster from slurm/local/start.sh runs the project's sbatch scripts.

Needs root (the daemons run as root; missing Debian packages are installed). Each job is
waited for by polling ``scontrol show job`` with an overall deadline, never a fixed sleep.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cascade.testing.children import CleanupIfKilled

ROOT = Path(__file__).resolve().parents[1]
START, STOP = ROOT / "slurm/local/start.sh", ROOT / "slurm/local/stop.sh"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "PREEMPTED", "BOOT_FAIL", "DEADLINE"}

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(900)]


@dataclass(frozen=True)
class Cluster:
    dir: Path
    env: dict[str, str]
    """Environment for sbatch/scontrol: SLURM_CONF set, this venv's python first on PATH."""
    startup_s: float


@dataclass(frozen=True)
class Job:
    id: str
    state: str
    exit_code: str
    seconds: float
    """From submission until the job was seen in a terminal state."""
    output: str


def _port_pair() -> int:
    """A free TCP port whose successor is free too (slurmctld, slurmd)."""
    for _ in range(100):
        with socket.socket() as a:
            a.bind(("", 0))
            port = a.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket() as b:
                try:
                    b.bind(("", port + 1))
                except OSError:
                    continue
            return port
    raise RuntimeError("no free pair of TCP ports")


def _job_env(base: dict[str, str]) -> dict[str, str]:
    """``base`` less anything that would make srun/MPI think it runs inside another job,
    and less ``CASCADE_*``: the jobs' settings come from the scripts and the test, not from
    the caller's shell (where a non-config ``CASCADE_`` variable is a ConfigError)."""
    drop = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "PMI_", "PMIX_", "MPI_LOCAL", "CASCADE_")
    env = {k: v for k, v in base.items() if not k.startswith(drop)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _daemon_pids(run_dir: Path) -> dict[int, str]:
    pids = {}
    for f in run_dir.glob("*.pid"):
        try:
            pids[int(f.read_text().split()[0])] = f.stem
        except (OSError, ValueError, IndexError):
            pass
    return pids


def _kill_survivors(pids: dict[int, str]) -> None:
    """SIGKILL each recorded daemon pid still running under its own name."""
    for pid, name in pids.items():
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                os.kill(pid, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if os.geteuid() != 0:
        pytest.skip("the local SLURM cluster runs its daemons as root and installs packages")
    if "PMI_RANK" in os.environ:
        pytest.skip("run the SLURM tests outside mpiexec: every rank would start a cluster")
    pytest.importorskip("mpi4py")
    state = tmp_path_factory.mktemp("slurm")
    env = _job_env(dict(os.environ)) | {"LOCAL_SLURM_DIR": str(state),
                                        "LOCAL_SLURM_PORT": str(_port_pair())}
    env["SLURM_CONF"] = str(state / "slurm.conf")
    pids: dict[int, str] = {}
    t0 = time.monotonic()
    guard = CleanupIfKilled([str(STOP)], env)  # the daemons detach: a killed test run stops them through this
    try:
        start = subprocess.run([str(START)], env=env, capture_output=True, text=True, timeout=600)
        startup = time.monotonic() - t0
        pids = _daemon_pids(state / "run")
        if start.returncode in (2, 3):
            pytest.skip(f"cannot have SLURM here (start.sh exit {start.returncode}): "
                        f"{start.stderr.strip()[-500:]}")
        assert start.returncode == 0, f"start.sh failed:\n{start.stderr}"
        print(f"\nlocal SLURM cluster up in {startup:.1f} s: {start.stderr.strip()}")
        yield Cluster(state, env, startup)
    finally:
        stop = subprocess.run([str(STOP)], env=env, capture_output=True, text=True, timeout=120)
        print(f"\nstop.sh exit {stop.returncode}: {stop.stderr.strip()}")
        _kill_survivors(pids)  # in case stop.sh could not stop them
        guard.disarm()


def _sbatch(cluster: Cluster, args: list[str], out: Path, **env: str) -> tuple[str, float]:
    cmd = ["sbatch", "--parsable", f"--output={out}", *args]
    t0 = time.monotonic()
    res = subprocess.run(cmd, cwd=ROOT, env=cluster.env | env, capture_output=True, text=True,
                         timeout=60, check=True)
    return res.stdout.strip().split(";")[0], t0


def _wait(cluster: Cluster, job_id: str, submitted: float, out: Path, timeout: float) -> Job:
    """Poll ``scontrol show job`` until the job is terminal; cancel it past ``timeout``."""
    deadline = submitted + timeout
    while True:
        show = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=cluster.env,
                              capture_output=True, text=True, timeout=30)
        fields = dict(re.findall(r"(\w+)=(\S*)", show.stdout))
        state = fields.get("JobState", "")
        if state in TERMINAL:
            return Job(job_id, state, fields.get("ExitCode", ""), time.monotonic() - submitted,
                       out.read_text() if out.exists() else "")
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id], env=cluster.env, timeout=30)
            output = out.read_text() if out.exists() else ""
            pytest.fail(f"job {job_id} still {state or show.stderr} after {timeout} s:\n{output}")
        time.sleep(0.25)


def test_single_node_script_runs_the_distributed_workload(
    cluster: Cluster, tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    record_property("slurm_startup_s", round(cluster.startup_s, 2))
    results, out = tmp_path / "results", tmp_path / "job.out"
    job_id, submitted = _sbatch(
        cluster, ["--ntasks=4", str(ROOT / "slurm/single_node.sbatch")], out,
        JOB_ROOT=str(ROOT), JOB_RESULTS=str(results), JOB_BLOCKS="64", JOB_ARGS="--requests 100",
    )
    job = _wait(cluster, job_id, submitted, out, timeout=600)
    print(f"job {job.id}: {job.state} {job.exit_code} in {job.seconds:.1f} s\n{job.output}")
    assert (job.state, job.exit_code) == ("COMPLETED", "0:0"), job.output
    files = sorted(results.glob("*.json"))
    assert len(files) == 1, f"expected one results JSON in {results}:\n{job.output}"
    doc = json.loads(files[0].read_text())
    # one world of 4 ranks that knows it runs in this SLURM job: srun's pmi2 reached MPI
    assert doc["ranks"] == 4, doc.get("launch")
    assert doc["launch"]["under_slurm"] and doc["launch"]["job_id"] == job.id, doc["launch"]


FAILING_RANK = """\
import os
from mpi4py import MPI
comm = MPI.COMM_WORLD
if comm.rank == 1:
    print("rank 1 fails on purpose", flush=True)
    {failure}
comm.Barrier()  # unless the step is ended the other ranks wait here forever
print(f"rank {{comm.rank}} passed the barrier", flush=True)
"""


@pytest.mark.parametrize("failure", [
    "raise RuntimeError('boom')",  # python -m mpi4py turns this into MPI_Abort
    "os._exit(3)",  # no MPI_Abort: the cluster's KillOnBadExit must end the step
])
def test_a_failing_rank_ends_the_step_promptly(
    cluster: Cluster, tmp_path: Path, failure: str
) -> None:
    script, out = tmp_path / "fail.py", tmp_path / "job.out"
    script.write_text(FAILING_RANK.format(failure=failure))
    job_id, submitted = _sbatch(
        cluster, ["--ntasks=4", f"--wrap=srun --mpi=pmi2 python -m mpi4py {script}"], out
    )
    job = _wait(cluster, job_id, submitted, out, timeout=120)
    print(f"job {job.id}: {job.state} {job.exit_code} in {job.seconds:.1f} s\n{job.output}")
    assert job.state == "FAILED" and job.exit_code != "0:0", job.output
    assert "rank 1 fails on purpose" in job.output
    assert "passed the barrier" not in job.output
    assert job.seconds < 30, f"the step took {job.seconds:.1f} s to end"
