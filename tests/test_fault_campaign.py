"""The fault campaign counts what it observes: detections, acknowledged blocks, losses."""
from __future__ import annotations

import json
import os
import random

import pytest

from benchmark import fault_campaign
from cascade.testing import mpich_segments, rank_failure_job

pytestmark = pytest.mark.timeout(240)


def test_campaign_counts_observations() -> None:
    rounds = 1
    segments = mpich_segments.segments()
    rows = fault_campaign.campaign(rounds, ("byte_flips", "header", "shm_flips", "dead_rank"), seed=7)
    assert mpich_segments.segments() <= segments  # the killed rank's job left nothing in /dev/shm
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
    capsys.readouterr()
    with pytest.raises(SystemExit):
        fault_campaign.main(["--faults", ","])  # names no fault: refused, not an empty campaign
    assert "--faults names no fault" in capsys.readouterr().err
    blocked = tmp_path / "a_file"
    blocked.write_text("")
    with pytest.raises(SystemExit):  # known before the campaign, not after it
        fault_campaign.main(["--faults", "shm_flips", "--out", str(blocked / "sub")])
    err = capsys.readouterr().err
    assert "cannot write results there" in err and "shm_flips" not in err  # the campaign did not run


def test_campaign_shows_progress_per_fault(capsys) -> None:
    fault_campaign.campaign(1, ("shm_flips",))
    assert "shm_flips" in capsys.readouterr().err  # the progress bar names the fault that runs


def test_sigkill_counts_each_torn_record_once(tmp_path) -> None:
    """A torn record stays in its file and every reopen finds it again: the campaign counts
    the ones its kills tore, never one from before it or from an earlier round again."""
    d = str(tmp_path)
    with fault_campaign.CascadeStore(fault_campaign._file_cfg(d)) as s:
        for i in range(3):
            s.put(*fault_campaign._block(s.spec, 10_000 + i))
    (path,) = [p for p in tmp_path.glob("agg_rank000_*.bin") if p.stat().st_size]
    os.truncate(path, path.stat().st_size - 100)  # tear the last record
    assert fault_campaign._torn_records(d) == 1 == fault_campaign._torn_records(d)
    row = fault_campaign.sigkill_mid_put(2, random.Random(3), d)
    assert row["detected"] == fault_campaign._torn_records(d) - 1
    assert row["acked_lost"] == row["wrong_served"] == 0


def test_campaign_covers_full_disks_foreign_slabs_and_collective_steps() -> None:
    """The issue-21 faults: each injection is detected, and none loses an acknowledged
    block, serves wrong bytes, hangs, raises from a get or delete, or brings a deleted
    block back after a restart."""
    from cascade.testing.rank_failure_job import BLOCKS_PER_RANK

    faults = ("full_disk_churn", "foreign_slab", "ctrl_c", "rank_open_failure", "rank_close_death")
    segments = mpich_segments.segments()
    rows = {r["fault"]: r for r in fault_campaign.campaign(1, faults, seed=11)}
    assert mpich_segments.segments() <= segments  # the failed ranks' jobs left nothing in /dev/shm
    churn = next(r for name, r in rows.items() if name.startswith("full disk"))
    if "skipped" not in churn:  # mounting a tmpfs needs root
        assert churn["detected"] == churn["injected"] == 1 and churn["operations"] == 600
        assert churn["raised"] == churn["resurrected"] == 0
    slab = next(r for name, r in rows.items() if "slab owner" in name)
    assert slab["detected"] == slab["injected"] == slab["acked_blocks"] == 1 and slab["raised"] == 0
    interrupted = next(r for name, r in rows.items() if name.startswith("Ctrl-C"))
    assert interrupted["detected"] == interrupted["injected"] == 1 and interrupted["raised"] == 0
    opened = next(r for name, r in rows.items() if "at the collective open" in name)
    assert opened["detected"] == opened["injected"] == 1
    closed = next(r for name, r in rows.items() if "before the collective close" in name)
    assert closed["detected"] == closed["injected"] == 1 and closed["acked_blocks"] == 4 * BLOCKS_PER_RANK
    for r in rows.values():
        if "skipped" not in r:
            assert r["wrong_served"] == 0 and not r["acked_lost"] and r["hangs"] == 0, r
