"""The device_io workload measures on a real GPU or says why it cannot: it never reports
figures without one (this machine has none; the GPU run is `pytest -m gpu` territory)."""
from __future__ import annotations

import pytest

from benchmark.workloads import device_io


def test_without_a_gpu_it_skips_with_the_reason_and_measures_nothing(tmp_path):
    cupy, reason = device_io.gpu_or_reason()
    if cupy is not None:
        pytest.skip("a GPU is usable here: the gpu-marked run measures device_io")
    result = device_io.run({"sizes": [65536], "rounds": 1, "file_dir": str(tmp_path)})
    assert result == {"skipped": reason, "not_run": [{"system": "cascade", "reason": reason}]} and reason
    assert device_io.table(result) == f"device_io skipped: {reason}"


@pytest.mark.gpu
def test_on_a_gpu_every_row_is_measured_byte_exact(tmp_path):
    cupy, reason = device_io.gpu_or_reason()
    if cupy is None:
        pytest.skip(reason)
    result = device_io.run({"sizes": [65536], "rounds": 2, "file_dir": str(tmp_path)})
    assert result["gpu"] and len(result["rows"]) == 2
    for row in result["rows"]:
        assert row["cascade"]["wrong_blocks"]["count"] == 0
        assert all(v["gbps"] > 0 for v in row["limits"].values())
        assert row["cascade"]["gpu_view"]["us"] > 0 and row["cascade"]["shm_view"]["us"] > 0
