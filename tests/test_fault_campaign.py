"""The fault campaign counts what it observes: detections, acknowledged blocks, losses."""
from __future__ import annotations

import json

import pytest

from benchmark import fault_campaign
from cascade.testing import rank_failure_job

pytestmark = pytest.mark.timeout(240)


def test_campaign_counts_observations() -> None:
    rounds = 1
    rows = fault_campaign.campaign(rounds, ("byte_flips", "header", "shm_flips", "dead_rank"), seed=7)
    flips = next(r for r in rows if r["fault"].startswith("bit flip in an aggregated"))
    # campaign(): byte flips run 4x rounds, a dead rank rounds // 5 (at least once)
    assert flips["injected"] == 4 * rounds and flips["acked_blocks"] == fault_campaign.FLIP_BLOCKS
    assert flips["detected"] == flips["expected_detections"] >= 1  # every hit record caught on read
    shm = next(r for r in rows if "SHM slab" in r["fault"])
    assert shm["detected"] == shm["injected"] == rounds and shm["acked_blocks"] == fault_campaign.SHM_BLOCKS
    header = next(r for r in rows if r["fault"].startswith("broken header"))
    assert header["acked_blocks"] == rounds * fault_campaign.HEADER_BLOCKS and header["injected"] == 2 * rounds
    # a header byte may be rewritten with the value it had; a torn tail always tears a record
    assert header["detected"] >= rounds
    rank = next(r for r in rows if "rank SIGKILLed" in r["fault"])
    jobs = max(1, rounds // 5)
    # every rank of each 4-rank job acknowledged its blocks (the job's own record of them)
    acked = jobs * 4 * rank_failure_job.BLOCKS_PER_RANK
    assert rank["acked_blocks"] == acked and rank["detected"] == jobs and rank["job_returncodes"][0] != 0
    assert rank["recovered_records"] >= acked
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
