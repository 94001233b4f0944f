"""The read_stall benchmark workload runs end to end at a tiny size: the prober's gets are
timed in each setting, the scans read every block from the file tier, byte-exact (its
numbers belong to results JSON, not to this test)."""
from __future__ import annotations

from benchmark.workloads import read_stall


def test_read_stall_probes_beside_each_scan_of_the_file_tier(tmp_path):
    result = read_stall.run({"sizes": [65536], "rounds": 2, "blocks": 32, "file_dir": str(tmp_path)})
    (row,) = result["rows"]
    assert row["wrong"] == 0 and row["blocks"] == 32
    for sample in row["samples"]:
        assert all(sample["probe_us"][s]["probes"] > 0 for s in read_stall.SETTINGS)
        assert sample["scan_file_tier_hits"] == {"beside_loop": 32, "beside_batch": 32}
        assert sample["probes_from_shm"] == sum(sample["probe_us"][s]["probes"] for s in read_stall.SETTINGS)
    for setting in read_stall.SETTINGS:
        assert 0 < row[f"{setting}_p50_us"] <= row[f"{setting}_p99_us"] <= row[f"{setting}_max_us"]
    assert row["compactions"] >= 1  # the writer's file, half dead (the reopened store writes a file of its own)
    assert row["beside_loop_scan_from_file_tier"] and row["beside_batch_scan_from_file_tier"]
    assert row["beside_loop_scan_gbps"] > 0 and row["beside_batch_scan_gbps"] > 0
    assert "64 KiB" in read_stall.table(result)
