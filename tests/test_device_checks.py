"""benchmark/device_checks.sh, the one call a lent GPU machine runs, run here for real on a
copy of the tracked files: everything it can do without a GPU works (the host-copy
module builds and imports, its tests pass, the device_io suite runs and records why it
measured nothing), and a machine without a GPU is a failure it names, never a quiet pass."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from benchmark.workloads.device_io import gpu_or_reason

ROOT = Path(__file__).resolve().parents[1]
NO_GPU_TESTS_STATUS = 4  # the script's step 3: `pytest -m gpu` ran no test


def _tracked_copy(dest: Path) -> None:
    """The tracked files of this checkout (as they are now) under ``dest``; the script
    builds the host-copy module into its tree, which must not be this checkout's (the
    running tests have that module loaded)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    for name in filter(None, files.decode().split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="the script builds the compiled modules with gcc")
def test_device_checks_runs_every_step_without_a_gpu_and_fails_naming_the_missing_gpu(tmp_path):
    _, why_no_gpu = gpu_or_reason()
    if why_no_gpu is None:
        pytest.skip("this machine has a GPU: run the script itself (benchmark/device_checks.sh)")
    tree, out = tmp_path / "tree", tmp_path / "out"
    _tracked_copy(tree)
    env = {**os.environ, "PYTHON": sys.executable, "ALLOW_DIRTY": "1"}
    env.pop("WHEELS", None)
    done = subprocess.run(["bash", "benchmark/device_checks.sh", str(out)], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=900)
    log = (out / "build.log").read_text()
    assert done.returncode == NO_GPU_TESTS_STATUS, f"status {done.returncode}\n{log}\n{done.stderr[-2000:]}"
    assert "build rc=0" in log and "COMPILED True" in log, log
    assert "no gpu test ran: is there a GPU, cupy and CUDA torch?" in log, log
    assert (out / "gpu_junit.xml").is_file()
    for module in ("cascade/_ids", "cascade/buffers/_hostcopy", "cascade/tiers/_recordread", "cascade/tiers/_firstfit"):
        assert list(tree.glob(f"{module}*.so")), f"{module} was not built into the copied tree"

    hostcopy_summary = (out / "hostcopy_tests.log").read_text().strip().splitlines()[-1]
    assert " passed" in hostcopy_summary and "failed" not in hostcopy_summary and "error" not in hostcopy_summary

    (suite,) = (out / "suites").iterdir()
    manifest = json.loads((suite / "manifest.json").read_text())
    assert manifest["workloads"] == ["device_io"] and manifest["reps"] == 3
    assert [run["status"] for run in manifest["runs"]] == ["ok"] * 3
    for run in manifest["runs"]:
        result = json.loads((suite / run["file"]).read_text())
        assert result["workload"] == "device_io"
        assert "GPU" in result["skipped"] or "cupy" in result["skipped"], result["skipped"]
        assert result["not_run"] and all(entry["reason"] == result["skipped"] for entry in result["not_run"])

    with tarfile.open(out / "device_checks.tgz") as bundle:
        names = {Path(n).as_posix().removeprefix("./") for n in bundle.getnames()}
    assert {"build.log", "gpu_junit.xml", "gpu_tests.log", "hostcopy_tests.log", "suite.log",
            f"suites/{suite.name}/manifest.json", f"suites/{suite.name}/summary.json"} <= names
