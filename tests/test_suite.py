"""The benchmark suite: interleaved repetitions, one manifest, spread per figure."""
from __future__ import annotations

import json

import pytest

from benchmark import suite

pytestmark = pytest.mark.timeout(300)


def test_rotation() -> None:
    w = ["a", "b", "c"]
    assert [suite.rotated(w, r) for r in range(4)] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], w]


def test_refuses_dirty_tree(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(suite, "git_commit", lambda: ("f" * 40, ["cascade/store.py"]))
    assert suite.main(["--size", "tiny", "--reps", "1", "--out", str(tmp_path)]) == 2
    assert "cascade/store.py" in capsys.readouterr().err and not list(tmp_path.iterdir())
    with pytest.raises(SystemExit):
        suite.main(["--reps", "2", "--allow-dirty", "--out", str(tmp_path)])  # spread needs >= 3
    assert "--reps must be >= 3 at --size default, got 2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        suite.main(["--size", "tiny", "--reps", "0", "--allow-dirty", "--out", str(tmp_path)])
    assert "--reps must be >= 1 at --size tiny, got 0" in capsys.readouterr().err  # what tiny allows
    with pytest.raises(SystemExit):
        suite.main(["--workloads", "nope", "--allow-dirty", "--out", str(tmp_path)])


def _load(tmp_path):
    (d,) = tmp_path.glob("suite_*")
    return d, json.loads((d / "manifest.json").read_text()), json.loads((d / "summary.json").read_text())


#: The 4-rank MPI workloads have their own tests (tests/mpi); here only how they are launched.
OWN_TESTS = ("cross_node", "stress_mpi")


def test_mpi_workloads_launch_under_mpiexec(tmp_path) -> None:
    cmd = suite.command("cross_node", "default", tmp_path)
    assert cmd[1:3] == ["-n", "4"] and cmd[-3:] == ["benchmark.workloads.cross_node", "--out", str(tmp_path)]
    assert suite.MPI_WORKLOADS["cross_node"][1] == {"MPIR_CVAR_NUM_CLIQUES": "2"}
    assert suite.command("stress_mpi", "quick", tmp_path)[-4:] == ["--hits", "2000", "--seconds", "10"]
    doc = {"total": {"wrong_bytes": 0, "hits": 10}, "phases": {"shm0": {"wrong_bytes": 0}}, "machine": {"cpus": 2}}
    names = {m for _, m, _ in suite.figures("stress_mpi", doc)}
    assert names == {"total.wrong_bytes", "total.hits", "phases.shm0.wrong_bytes"}


def test_every_workload_runs_once(tmp_path) -> None:
    workloads = [w for w in suite.WORKLOADS if w not in OWN_TESTS]
    assert suite.main(["--size", "tiny", "--reps", "1", "--allow-dirty", "--workloads", ",".join(workloads),
                       "--out", str(tmp_path)]) == 0
    d, manifest, summary = _load(tmp_path)
    assert manifest["format"] == "cascade-bench-suite/1" and len(manifest["commit"]) == 40
    assert [r["workload"] for r in manifest["runs"]] == workloads and "queue_hints" in workloads
    for run in manifest["runs"]:
        assert run["status"] == "ok" and (d / run["file"]).exists(), run
    seen = {f["workload"] for f in summary["figures"]}
    from benchmark.workloads import device_io

    gpu_less = device_io.gpu_or_reason()[0] is None  # device_io then measures nothing and says why
    assert seen == set(workloads) - ({"device_io"} if gpu_less else set())
    fig = {(f["workload"], f.get("system"), f.get("mode"), f["metric"]): f for f in summary["figures"]}
    assert fig[("read_throughput", "cascade", "hot", "get_gbps")]["median"] > 0
    assert fig[("read_throughput", "cascade", "hot", "vs_systems.hdf5")]["median"] > 0
    assert 0 <= fig[("trace_replay", "cascade", None, "block_hit_ratio")]["median"] <= 1
    assert fig[("faults", None, None, "wrong_served")]["max"] == 0
    assert [p["workload"] for p in summary["not_run"]] == (["device_io"] if gpu_less else [])
    _check_main_job(d, manifest, summary)


def _check_main_job(d, manifest, summary) -> None:
    """The ``run`` workload: the real 4-rank main job wrote per-rank, per-tier histograms;
    the summary has per-tier figures and the paper's get breakdown is drawn from that file."""
    from paper import figures as paper_figures

    [run] = [r for r in manifest["runs"] if r["workload"] == "run"]
    assert run["command"][2:4] == ["cascade.cli", "run"] and "--ranks" in run["command"]
    doc = json.loads((d / run["file"]).read_text())
    assert doc["workload"] == "run" and doc["ranks"] == 4 and doc["wrong_bytes_blocks"] == 0
    assert len(doc["per_rank_stats"]) == 4 and doc["replay"]["references"] > 0
    tiers = {(f["tier"], f["metric"]): f["median"] for f in summary["figures"]
             if f["workload"] == "run" and "tier" in f}
    assert tiers[("shm", "gets")] > 0 and tiers[("cluster", "gets")] > 0 and tiers[("file", "bytes_written")] > 0
    assert tiers[("shm", "get_p50_s")] > 0 and 0 < tiers[("cluster", "gets_share")] < 1
    report = paper_figures.generate(d, d / "paper", only=["get_breakdown"])
    assert not report.errors and not report.skipped and not report.layout, report
    assert run["file"].split("/")[-1] in (d / "paper" / "Generated" / "figure_get_breakdown.tex").read_text()
    assert (d / "paper" / "Figures" / "get_breakdown.png").stat().st_size > 1000
    assert d.name in report.source and manifest["commit"][:12] in report.source


def test_repetitions_interleaved_with_spread(tmp_path) -> None:
    args = ["--size", "tiny", "--reps", "3", "--workloads", "tier_bandwidth,faults", "--allow-dirty",
            "--out", str(tmp_path)]
    assert suite.main(args) == 0
    d, manifest, summary = _load(tmp_path)
    assert manifest["order"] == [["tier_bandwidth", "faults"], ["faults", "tier_bandwidth"],
                                 ["tier_bandwidth", "faults"]]
    assert [r["workload"] for r in manifest["runs"]] == [w for rep in manifest["order"] for w in rep]
    assert all(r["cpu_seconds"] > 0 and r["seconds"] > 0 for r in manifest["runs"])
    put = next(f for f in summary["figures"] if f["workload"] == "tier_bandwidth"
               and f.get("tier") == "shm" and f["metric"] == "put_gbps")
    assert put["n"] == 3 and len(put["values"]) == 3
    assert put["min"] <= put["median"] <= put["max"] and put["min"] > 0
    detected = next(f for f in summary["figures"] if f["workload"] == "faults" and f["metric"] == "detected"
                    and "SHM" in f["fault"])
    assert detected["values"] == [1.0, 1.0, 1.0]
    for f in summary["figures"]:
        if (f["metric"].startswith("vs_limit.") or f.get("tier") == "ratios") and f["max"] > 1:
            assert f["above_noisy_limit"] is True


def test_a_run_past_its_limit_ends_with_every_process_it_started(tmp_path, monkeypatch) -> None:
    import sys

    from cascade.testing.pids import SLEEPING_GRANDCHILD, gone, written_pid

    pid_file = tmp_path / "pid"
    monkeypatch.setattr(suite, "RUN_TIMEOUT_S", 3)
    monkeypatch.setattr(suite, "command", lambda *_: [sys.executable, "-c", SLEEPING_GRANDCHILD, str(pid_file)])
    entry = suite.run_one("small_blocks", "tiny", 0, tmp_path)
    assert entry["status"] == "failed" and entry["returncode"] is None
    assert gone(written_pid(pid_file))  # the job's own children too, not only the process started


def test_an_out_that_cannot_be_written_is_a_usage_error(tmp_path, capsys) -> None:
    blocked = tmp_path / "a_file"
    blocked.write_text("")
    with pytest.raises(SystemExit) as exc:
        suite.main(["--size", "tiny", "--reps", "1", "--allow-dirty", "--workloads", "tier_bandwidth",
                    "--out", str(blocked / "sub")])
    assert exc.value.code == 2 and "cannot write results there" in capsys.readouterr().err.splitlines()[-1]
