"""The cascade command: info, run (the main job) and stats."""
from __future__ import annotations

import json

import pytest

from cascade.cli import main


def test_info_lists_tiers_and_versions(capsys, tmp_path):
    assert main(["info", "--set", f"file_dir={tmp_path}"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert set(info["tiers"]) == {"gpu", "shm", "remote", "file"}
    assert info["tiers"]["gpu"]["available"] in (True, False)
    assert info["versions"]["cascade"]


def test_run_replays_and_writes_results_and_stats(capsys, tmp_path):
    args = ["run", "--requests", "40", "--quiet", "--results", str(tmp_path / "res"),
            "--set", "model=tiny", "--set", "shm_bytes=64K", "--set", f"file_dir={tmp_path / 'f'}",
            "--set", f"stats_dir={tmp_path / 'stats'}"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "block hit ratio" in out and "file" in out
    result = json.loads(next((tmp_path / "res").glob("cascade_run_1n_*.json")).read_text())
    assert result["references"] > 0 and 0 <= result["block_hit_ratio"] <= 1
    assert main(["stats", str(tmp_path / "stats")]) == 0
    assert "1 rank(s)" in capsys.readouterr().out
    assert main(["stats", str(tmp_path / "stats"), "--prometheus"]) == 0
    text = capsys.readouterr().out
    assert 'cascade_operations_total{op="puts",rank="0"}' in text
    assert "cascade_get_latency_seconds_bucket" in text


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"rank": 0}', b"\xff\xfe"])
def test_stats_of_a_file_that_is_no_rank_stats_is_a_clear_error(capsys, tmp_path, content):
    path = tmp_path / "stats_rank000.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    for extra in ([], ["--prometheus"]):
        assert main(["stats", str(tmp_path), *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith("cascade: error:") and "stats_rank000.json" in err and "Traceback" not in err


def test_a_results_path_that_cannot_be_a_directory_fails_before_the_run(capsys, tmp_path):
    taken = tmp_path / "a-file"
    taken.write_text("")
    args = ["run", "--requests", "40", "--quiet", "--results", str(taken), "--set", "model=tiny",
            "--set", f"file_dir={tmp_path / 'f'}"]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert "--results" in captured.err and "cascade run:" not in captured.out  # refused before replaying


def test_bad_config_is_a_clear_error(capsys):
    assert main(["info", "--set", "shm_bites=1"]) == 2
    assert "unknown key" in capsys.readouterr().err


def _cli(tmp_path, *args, timeout=300):
    import os
    import subprocess
    import sys

    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=os.getcwd())
    return subprocess.run([sys.executable, "-m", "cascade.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=os.getcwd())


@pytest.mark.parametrize("args,message", [
    (["run", "--requests", "-5"], "--requests: must be >= 0"),
    (["run", "--ranks", "0"], "--ranks: must be >= 1"),
    (["run", "--trace", "/nonexistent/trace.jsonl"], "no such trace file"),
    (["run", "--requests", "many"], "expected an integer"),
    (["run", "--set", "shm_bytes=1iB"], "shm_bytes"),
    (["run", "--rank", "2"], "unrecognized arguments: --rank"),  # no abbreviations: cascade.app takes none
    (["run", "--results", "/proc"], "--results /proc: not a directory this run can write into"),
])
def test_bad_run_arguments_are_one_line_usage_errors(tmp_path, args, message):
    files = tmp_path / "files"
    done = _cli(tmp_path, *args, "--set", f"file_dir={files}", "--set", "model=tiny")
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not files.exists() or not any(files.rglob("*.bin"))  # nothing stored


def _run_args(tmp_path, *extra):
    return ["run", "--requests", "30", "--quiet", "--set", "model=tiny", "--set", "shm_bytes=16K",
            "--set", f"file_dir={tmp_path / 'files'}", *extra]


def test_run_is_cold_in_a_fresh_directory_unless_warm(capsys, tmp_path):
    assert main(_run_args(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "fresh directory" in out and "--warm" in out
    assert not list((tmp_path / "files").iterdir())  # the fresh directory is gone
    ratios = []
    for _ in range(2):
        assert main(_run_args(tmp_path, "--warm")) == 0
        out = capsys.readouterr().out
        assert "warm, reusing" in out
        ratios.append(float(out.split("block hit ratio ")[1].split("%")[0]))
    assert list((tmp_path / "files").glob("agg_rank000_*.bin"))
    assert ratios[1] > ratios[0]  # the second warm run found the first one's blocks
    assert main(_run_args(tmp_path)) == 0  # cold again: not the warm runs' ratio
    cold = float(capsys.readouterr().out.split("block hit ratio ")[1].split("%")[0])
    assert cold < ratios[1]


def test_verbose_multi_rank_run(tmp_path):
    done = _cli(tmp_path, "-v", "run", "--ranks", "2", "--requests", "20", "--blocks", "4",
                "--set", "model=tiny", "--set", "shm_bytes=256K", "--set", f"file_dir={tmp_path / 'files'}",
                timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "fresh directory" in done.stdout and "2 ranks" in done.stdout
    assert "exchange: 8 cross-rank reads, 0 wrong, 0 missing" in done.stdout  # 4 blocks of the other rank, each
    assert "INFO rank 0 " in done.stderr and "INFO rank 1 " in done.stderr  # -v reaches the ranks
    assert not list((tmp_path / "files").iterdir())


def test_run_says_when_the_file_tier_is_off(capsys, tmp_path):
    assert main(_run_args(tmp_path, "--set", "file_bytes=0")) == 0
    assert "file tier: off" in capsys.readouterr().out


def _processes_naming(text: str) -> list[int]:
    """Pids of the processes whose command line contains ``text``."""
    import os

    pids = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and text.encode() in open(f"/proc/{entry}/cmdline", "rb").read():
                pids.append(int(entry))
        except OSError:
            pass
    return pids


def test_a_terminated_multi_rank_run_ends_its_ranks_and_removes_its_directory(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    files = tmp_path / "files"
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=os.getcwd())
    run = subprocess.Popen([sys.executable, "-m", "cascade.cli", "run", "--ranks", "2", "--blocks", "1000000",
                            "--set", "model=tiny", "--set", "shm_bytes=8M", "--set", f"file_dir={files}"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        for line in run.stdout:  # the ranks are up once rank 0 said so
            if "2 ranks on" in line:
                break
        assert _processes_naming(str(files)), "no rank runs"
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=120) != 0
        deadline = time.monotonic() + 30
        while _processes_naming(str(files)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _processes_naming(str(files)), "ranks outlived the run"
        assert not list(files.iterdir()), "the fresh directory was left behind"
    finally:
        if run.poll() is None:
            run.kill()
        for pid in _processes_naming(str(files)):
            os.kill(pid, signal.SIGKILL)
