"""The main job's own parts (cascade.app), checked in one process: its config, its
arguments and its results files. Runs on ranks: tests/test_cli.py and tests/test_suite.py."""
from __future__ import annotations

import json
import time

import pytest

from cascade.app.main_job import _config, _parser
from cascade.app.results import check_results_dir, write_results
from cascade.errors import CascadeError


def _args(*argv: str):
    return _parser().parse_args(["run", *argv])


def test_a_run_lends_half_its_shm_unless_a_source_sets_remote_bytes(tmp_path, monkeypatch):
    monkeypatch.delenv("CASCADE_REMOTE_BYTES", raising=False)
    monkeypatch.delenv("CASCADE_CONFIG", raising=False)
    assert _config(_args("--set", "shm_bytes=64M")).remote_bytes == 32 << 20
    toml = tmp_path / "c.toml"
    toml.write_text("[cascade]\nshm_bytes = 67108864\nremote_bytes = 1048576\n")
    assert _config(_args("--config", str(toml))).remote_bytes == 1 << 20  # the file's, not half the SHM
    monkeypatch.setenv("CASCADE_CONFIG", str(toml))
    assert _config(_args()).remote_bytes == 1 << 20
    assert _config(_args("--set", "remote_bytes=2M")).remote_bytes == 2 << 20
    monkeypatch.delenv("CASCADE_CONFIG")
    monkeypatch.setenv("CASCADE_REMOTE_BYTES", "0")
    assert _config(_args("--set", "shm_bytes=64M")).remote_bytes == 0


def test_run_arguments_are_checked_and_a_run_replays_every_request_by_default(capsys):
    assert _args().requests is None
    for bad in (["--blocks", "-1"], ["--seed", "-2"], ["--requests", "-3"], ["--trace", "/nonexistent.jsonl"],
                ["--bl", "4"]):
        with pytest.raises(SystemExit) as exit_:
            _args(*bad)
        assert exit_.value.code == 2
        assert bad[0] in capsys.readouterr().err


def test_results_of_the_same_second_do_not_overwrite_each_other(tmp_path, monkeypatch):
    now = time.gmtime()
    monkeypatch.setattr(time, "gmtime", lambda *_: now)
    paths = [write_results(tmp_path, 2, {"run": i}) for i in range(3)]
    stem = f"cascade_run_2n_{time.strftime('%Y%m%dT%H%M%S', now)}"
    assert [p.name for p in paths] == [f"{stem}.json", f"{stem}-1.json", f"{stem}-2.json"]
    assert [json.loads(p.read_text())["run"] for p in paths] == [0, 1, 2]


def test_a_results_directory_that_cannot_take_a_file_is_refused(tmp_path):
    check_results_dir(tmp_path / "new" / "dir")  # made
    assert (tmp_path / "new" / "dir").is_dir() and not list((tmp_path / "new" / "dir").iterdir())
    (tmp_path / "a-file").write_text("")
    for bad in (tmp_path / "a-file", "/proc"):
        with pytest.raises(CascadeError, match="not a directory this run can write into"):
            check_results_dir(bad)


FAILING_RANK = """\
import sys
from mpi4py import MPI
from cascade.app import main_job
from cascade.store import CascadeStore

put = CascadeStore.put


def failing_put(self, *args, **kwargs):
    if MPI.COMM_WORLD.rank == 1:
        raise RuntimeError("injected: rank 1 fails in the exchange")
    return put(self, *args, **kwargs)


CascadeStore.put = failing_put
sys.exit(main_job.run(["run", "--blocks", "4", "--requests", "10", "--quiet", "--set", "model=tiny",
                       "--set", "shm_bytes=1M", "--set", "file_dir=" + sys.argv[1]]))
"""


@pytest.mark.timeout(300)
def test_one_ranks_failure_ends_the_job_at_once(tmp_path):
    # the other rank waits in the exchange's barrier: a collective close on the failing
    # rank waited 10 minutes for it (its agreement's time limit) before the job ended
    import os
    import subprocess
    import sys

    from cascade.app.launcher import mpiexec_path
    from cascade.testing import mpich_segments

    pytest.importorskip("mpi4py")
    script = tmp_path / "failing_rank.py"
    script.write_text(FAILING_RANK)
    before = mpich_segments.segments()
    started = time.monotonic()
    done = subprocess.run([mpiexec_path(), "-n", "2", sys.executable, "-m", "mpi4py", str(script), str(tmp_path / "f")],
                          capture_output=True, text=True, timeout=240, env=dict(os.environ, PYTHONPATH=os.getcwd()))
    mpich_segments.remove_orphans(before)  # an aborted job leaves its MPICH segment behind
    assert done.returncode != 0 and "injected: rank 1 fails" in done.stderr + done.stdout
    assert time.monotonic() - started < 60, "the job waited for a rank that had failed"
