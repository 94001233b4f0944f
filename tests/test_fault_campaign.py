"""The fault campaign counts what it observes: detections, acknowledged blocks, losses."""
from __future__ import annotations

import json

import pytest

from benchmark import fault_campaign

pytestmark = pytest.mark.timeout(240)


def test_campaign_counts_observations() -> None:
    rows = fault_campaign.campaign(1, ("byte_flips", "header", "shm_flips", "dead_rank"), seed=7)
    flips = next(r for r in rows if r["fault"].startswith("bit flip in an aggregated"))
    assert flips["injected"] == 4 and flips["acked_blocks"] == 400
    assert flips["detected"] == flips["expected_detections"] >= 1  # every hit record caught on read
    shm = next(r for r in rows if "SHM slab" in r["fault"])
    assert shm["detected"] == shm["injected"] == 1
    header = next(r for r in rows if r["fault"].startswith("broken header"))
    assert header["acked_blocks"] == 150 and header["detected"] >= 1
    rank = next(r for r in rows if "rank SIGKILLed" in r["fault"])
    # 4 ranks x 20 blocks acknowledged, read from the job's own record of acknowledged ids
    assert rank["acked_blocks"] == 80 and rank["detected"] == 1 and rank["job_returncodes"][0] != 0
    assert rank["recovered_records"] >= 80
    for r in rows:
        assert r["wrong_served"] == 0 and not r.get("acked_lost")


def test_cli_writes_results_and_rejects_bad_input(tmp_path, capsys) -> None:
    assert fault_campaign.main(["--rounds", "1", "--faults", "shm_flips", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("cascade_faults_1n_*.json")
    doc = json.loads(path.read_text())
    assert doc["rows"][0]["detected"] == 1 and doc["git"]["commit"]
    with pytest.raises(SystemExit):
        fault_campaign.main(["--faults", "nope"])
    with pytest.raises(SystemExit):
        fault_campaign.main(["--rounds", "0"])


def test_campaign_covers_full_disks_foreign_slabs_and_collective_steps() -> None:
    """The issue-21 faults: each injection is detected, and none loses an acknowledged
    block, serves wrong bytes, hangs, raises from a get or delete, or brings a deleted
    block back after a restart."""
    from cascade.testing.rank_failure_job import BLOCKS_PER_RANK

    faults = ("full_disk_churn", "foreign_slab", "rank_open_failure", "rank_close_death")
    rows = {r["fault"]: r for r in fault_campaign.campaign(1, faults, seed=11)}
    churn = next(r for name, r in rows.items() if name.startswith("full disk"))
    if "skipped" not in churn:  # mounting a tmpfs needs root
        assert churn["detected"] == churn["injected"] == 1 and churn["operations"] == 600
        assert churn["raised"] == churn["resurrected"] == 0
    slab = next(r for name, r in rows.items() if "slab owner" in name)
    assert slab["detected"] == slab["injected"] == slab["acked_blocks"] == 1 and slab["raised"] == 0
    opened = next(r for name, r in rows.items() if "at the collective open" in name)
    assert opened["detected"] == opened["injected"] == 1
    closed = next(r for name, r in rows.items() if "before the collective close" in name)
    assert closed["detected"] == closed["injected"] == 1 and closed["acked_blocks"] == 4 * BLOCKS_PER_RANK
    for r in rows.values():
        if "skipped" not in r:
            assert r["wrong_served"] == 0 and not r["acked_lost"] and r["hangs"] == 0, r
