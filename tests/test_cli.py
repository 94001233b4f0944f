"""The cascade command: info, run (the main job) and stats."""
from __future__ import annotations

import json

from cascade.cli import main


def test_info_lists_tiers_and_versions(capsys, tmp_path):
    assert main(["info", "--set", f"file_dir={tmp_path}"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert set(info["tiers"]) == {"gpu", "shm", "remote", "lustre"}
    assert info["tiers"]["gpu"]["available"] in (True, False)
    assert info["versions"]["cascade"]


def test_run_replays_and_writes_results_and_stats(capsys, tmp_path):
    args = ["run", "--requests", "40", "--quiet", "--results", str(tmp_path / "res"),
            "--set", "model=tiny", "--set", "shm_bytes=64K", "--set", f"file_dir={tmp_path / 'f'}",
            "--set", f"stats_dir={tmp_path / 'stats'}"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "block hit ratio" in out and "lustre" in out
    result = json.loads(next((tmp_path / "res").glob("cascade_run_1n_*.json")).read_text())
    assert result["references"] > 0 and 0 <= result["block_hit_ratio"] <= 1
    assert main(["stats", str(tmp_path / "stats")]) == 0
    assert "1 rank(s)" in capsys.readouterr().out
    assert main(["stats", str(tmp_path / "stats"), "--prometheus"]) == 0
    text = capsys.readouterr().out
    assert 'cascade_operations_total{op="puts",rank="0"}' in text
    assert "cascade_get_latency_seconds_bucket" in text


def test_bad_config_is_a_clear_error(capsys):
    assert main(["info", "--set", "shm_bites=1"]) == 2
    assert "unknown key" in capsys.readouterr().err
