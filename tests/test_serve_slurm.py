"""slurm/serve.sbatch on the local one-node SLURM cluster (tests/test_slurm.py starts it):
the Cascade ranks as one job step, an engine stand-in as the other (a real LMCache
StorageManager with the Cascade plugin at ``cascade.endpoint: auto``; vLLM cannot run
here), and the ranks stopped cleanly when the engine step ends."""
from __future__ import annotations

from pathlib import Path

import pytest

from test_slurm import ROOT, Cluster, _sbatch, _wait, cluster  # noqa: F401  (the module's fixture)

pytest.importorskip("lmcache", reason="LMCache is not installed (third_party/install.sh)")
pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(900)]

ENGINE = ("python -m cascade.testing.serve_client lmcache-store auto 4 && "
          "python -m cascade.testing.serve_client lmcache-fetch auto 4")


def test_serve_script_runs_ranks_and_an_attached_engine(cluster: Cluster, tmp_path: Path) -> None:  # noqa: F811
    results, out = tmp_path / "results", tmp_path / "job.out"
    job_id, submitted = _sbatch(
        cluster, ["--ntasks=2", str(ROOT / "slurm/serve.sbatch")], out,
        JOB_ROOT=str(ROOT), JOB_RESULTS=str(results), JOB_RANKS_PER_NODE="2", JOB_BLOCK_BYTES="8192",
        JOB_SERVE_CMD=ENGINE, CASCADE_SHM_BYTES="16M", CASCADE_FILE_BYTES="0", LMCACHE_TRACK_USAGE="false")
    job = _wait(cluster, job_id, submitted, out, timeout=600)
    log = (results / "cascade-serve.log").read_text() if (results / "cascade-serve.log").exists() else ""
    print(f"job {job.id}: {job.state} {job.exit_code} in {job.seconds:.1f} s\n{job.output}\n{log}")
    assert (job.state, job.exit_code) == ("COMPLETED", "0:0"), job.output + log
    assert log.count("cascade serve: rank ") == 2  # one world of 2 ranks under srun
    assert '"stored": 4' in job.output and '"hits": 4' in job.output and '"exact": 4' in job.output
    assert "Cascade step ended with exit code" not in job.output  # the ranks closed cleanly on SIGTERM
