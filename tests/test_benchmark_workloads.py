"""Each comparison workload on a tiny config, for Cascade and one real peer (HDF5; Redis
for the trace replay, which needs a system that evicts), and Cascade's thread_scaling:
it runs and produces the fields ``benchmark/README.md`` documents."""
from __future__ import annotations

import json
import statistics

import numpy as np
import pytest

from benchmark import data, machine, run_benchmark
from benchmark.workloads import read_latency, read_throughput, scaling, thread_scaling, trace_replay, write_throughput
from benchmark.workloads.common import aligned_pair
from cascade import CascadeStore, Config
from cascade.buffers import hostcopy
from cascade.models import BlockSpec

SIZE = 64 << 10
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("bench")
    out = data.generate(base / "data", model="tiny", block_bytes=[SIZE], blocks=12, seed=0, progress=False)
    return {"data_dir": str(out), "file_dir": str(base / "files")}


def _options(dirs, **extra):
    return {"system": "cascade,hdf5", "sizes": [SIZE], "blocks": 4, "warmup": 2, "rounds": 2, **dirs, **extra}


def _check_common(result: dict, workload: str) -> None:
    assert result["schema"] == f"cascade-bench/{workload}/1"
    assert result["systems"] == ["cascade", "hdf5"] and result["block_sizes"] == [SIZE]
    lim = result["limits"][str(SIZE)]
    for key in ("memcpy_gbps", "memcpy_s_p50", "raw_odirect_read_gbps", "raw_buffered_cold_read_gbps",
                "raw_write_gbps", "before", "after"):
        assert key in lim
    assert result["data"]["model"] == "tiny" and len(result["data"]["index_sha256"]) == 64
    assert "skipped" in result["mpi_limits"] and result["not_run"] == [] and result["interleaved_rounds"]
    for row in result["rows"]:
        for key in ("system", "block_bytes", "mode", "blocks", "warmup_blocks", "capacity_bytes", "versions",
                    "describe", "vs_limit", "vs_systems"):
            assert key in row, key
        assert row["blocks"] == 4 and row["capacity_bytes"] == 2 * 6 * SIZE
    assert {r["system"] for r in result["rows"]} == {"cascade", "hdf5"}


#: The ratio to the streamed copy each DRAM figure has where the compiled copies are built.
STREAMED = {"streamed_copy"} if hostcopy.COMPILED else set()


def test_write_throughput(dirs) -> None:
    result = write_throughput.run(_options(dirs))
    _check_common(result, "write_throughput")
    for row in result["rows"]:
        assert row["mode"] == "put" and row["put_gbps"] > 0 and len(row["put_gbps_rounds"]) == 2
        assert row["stored_after_put"] == 4 and row["bytes_checked_blocks"] > 0
        assert {"p50", "p90", "p99", "max"} <= set(row["put_op_s"]) and len(row["samples"]["put_op_s"]) == 2
        assert set(row["vs_limit"]) == {"memcpy", "raw_write"} | STREAMED
    cascade = next(r for r in result["rows"] if r["system"] == "cascade")
    assert cascade["vs_systems"]["hdf5"] > 0
    assert result["targets"][0]["met"] is None  # lmcache_cpu not part of this run
    assert "put GB/s" in write_throughput.table(result)


def test_read_throughput_hot_and_cold(dirs) -> None:
    result = read_throughput.run(_options(dirs))
    _check_common(result, "read_throughput")
    modes = {(r["system"], r["mode"]) for r in result["rows"]}
    assert modes == {("cascade", "hot"), ("hdf5", "hot"), ("hdf5", "cold")}
    lim = result["limits"][str(SIZE)]
    for row in result["rows"]:
        assert row["get_gbps"] > 0 and row["misses"] == 0 and len(row["samples"]["get_op_s"]) == 2
        same = {"raw_read_same_mode"} if row["mode"] == "cold" else set()
        assert set(row["vs_limit"]) == {"memcpy", "raw_odirect_read", "raw_buffered_cold_read"} | same | STREAMED
        if STREAMED:  # against the streamed copy of the same limits, measured where the copies are compiled
            assert row["vs_limit"]["streamed_copy"] == row["get_gbps"] / lim["streamed_copy_gbps"]
    cold = next(r for r in result["rows"] if r["mode"] == "cold")
    # HDF5 (sec2 driver) reads through the page cache: its cold pass is held to the raw buffered cold read
    assert cold["read_mode"] == "buffered"
    assert cold["vs_limit"]["raw_read_same_mode"] == cold["get_gbps"] / lim["raw_buffered_cold_read_gbps"]
    assert "posix_fadvise" in cold["cold_method"] and cold["resident_fraction_after_drop"] <= 0.01
    assert cold["page_cache_drops"][0]["resident_fraction_before"] >= cold["resident_fraction_after_drop"]
    assert {"system": "cascade", "mode": "cold", "reason": "in-memory system: nothing to read cold"} \
        in result["not_applicable"]
    assert "hdf5" in next(r for r in result["rows"] if r["system"] == "cascade")["vs_systems"]
    assert "get GB/s" in read_throughput.table(result)


def test_read_latency(dirs) -> None:
    result = read_latency.run(_options(dirs, ops=20))
    _check_common(result, "read_latency")
    hot = [r for r in result["rows"] if r["mode"] == "hot"]
    assert len(hot) == 2 and all(r["ops"] == 20 and len(r["samples_s"]) == 20 for r in hot)
    for row in result["rows"]:
        assert {"p50", "p90", "p99", "max"} <= set(row["latency_s"]) and row["p50_s"] == row["latency_s"]["p50"]
        assert row["latency_s"]["p50"] <= row["latency_s"]["p99"] <= row["latency_s"]["max"]
    cold = next(r for r in result["rows"] if r["mode"] == "cold")
    assert cold["system"] == "hdf5" and cold["ops"] == 2 * 4
    assert "p99 ms" in read_latency.table(result)


@pytest.mark.parametrize("workload", [read_throughput, read_latency])
def test_cold_pass_starts_right_after_the_drop(dirs, workload, monkeypatch) -> None:
    """The warm-up gets run before the page-cache drop, never between it and the timed
    gets: HDF5 reads whole 4 MiB chunks, so a warm-up get after the drop made the measured
    blocks of its chunk resident (and cached in HDF5's chunk cache) while the row said 0."""
    from benchmark.workloads import blockio

    events: list = []
    real_get_all, real_drop = blockio.get_all, read_throughput.drop

    def get_all(adapter, blocks, outs):
        resident, total = machine.resident_bytes(machine.files_under(adapter.data_dir))
        events.append((len(blocks), resident / total))
        return real_get_all(adapter, blocks, outs)

    def drop(adapter):
        events.append("drop")
        return real_drop(adapter)

    monkeypatch.setattr(blockio, "get_all", get_all)
    monkeypatch.setattr(read_throughput, "drop", drop)
    result = workload.run(_options(dirs, system="hdf5", rounds=1, ops=8))
    assert result["not_run"] == [] and events.count("drop") == 1
    after = events[events.index("drop") + 1]
    assert after[0] == 4 and after[1] <= 0.01  # the timed pass of the 4 measured blocks, from evicted files


def test_trace_replay_every_evicting_system(dirs) -> None:
    result = trace_replay.run({"system": "cascade,cascade_lru,cascade_file,redis", "requests": 30, "full_trace": False,
                               "capacities": [1000], "sizes": [16 << 10], "file_dir": dirs["file_dir"]})
    assert result["schema"] == "cascade-bench/trace_replay/3" and result["compare_requests"] == 30
    assert result["not_run"] == [], result["not_run"]  # every system here is installed: none may fail
    assert sorted(r["system"] for r in result["system_rows"]) == sorted(["cascade", "cascade_lru", "cascade_file",
                                                                        "redis"])
    assert {r["scope"] for r in result["system_rows"]} == {"compare"}
    for row in result["system_rows"]:
        for key in ("capacity_blocks", "capacity_bytes", "block_bytes", "requests", "truncated", "references",
                    "hits", "block_hit_ratio", "token_hit_ratio", "lru_block_hit_ratio", "belady_block_hit_ratio",
                    "gap_closed", "resident_blocks", "observed_via", "elapsed_s", "us_per_reference", "vs_systems"):
            assert key in row, key
        assert row["requests"] == 30 and row["capacity_bytes"] == 1000 * (16 << 10)
        assert 0 <= row["block_hit_ratio"] <= row["belady_block_hit_ratio"] + 1e-9
        assert row["references"] > 0 and row["hits"] > 0 and not row["truncated"]
        assert set(row["vs_systems"]) == {"cascade", "cascade_lru", "cascade_file", "redis"} - {row["system"]}
    (row,) = result["rows"]  # the Cascade layout the paper reads
    for key in ("reference_lru", "reference_belady", "cascade_semantic", "cascade_lru"):
        assert "block_hit_ratio" in row[key] and "token_hit_ratio" in row[key]
    assert row["cascade_lru"]["block_hit_ratio"] == row["reference_lru"]["block_hit_ratio"]
    assert result["targets"][0]["met"] is None  # no 5,000-block capacity in this run
    assert "Belady" in trace_replay.table(result)
    redis = next(r for r in result["system_rows"] if r["system"] == "redis")
    assert redis["wrong"] == 0  # every hit of the real peer was checked whole


def test_trace_replay_counts_a_peer_returning_other_bytes_as_wrong_not_as_a_hit(monkeypatch) -> None:
    import contextlib

    class ReturnsZeros:  # a faulty peer: claims every id it was handed, returns zeros
        def __init__(self) -> None:
            self.seen: set[str] = set()

        def get_into(self, bid, key_out, value_out) -> bool:
            key_out[:] = 0
            value_out[:] = 0
            return bid in self.seen

        def put(self, bid, key, value) -> None:
            self.seen.add(bid)

        def flush(self) -> None:
            pass

        def versions(self) -> dict:
            return {}

        def contains(self, bid) -> bool:
            return bid in self.seen

    monkeypatch.setattr(trace_replay.common, "started", lambda *a, **k: contextlib.nullcontext(ReturnsZeros()))
    requests = trace_replay.load_requests({"requests": 40})[0][:40]
    row = trace_replay.replay_adapter("zeros", requests, 100, 16 << 10, 16, "/tmp", float("inf"))
    assert row["hits"] == 0 and row["wrong"] > 0 and row["block_hit_ratio"] == 0.0


def test_trace_replay_refuses_a_system_without_eviction() -> None:
    with pytest.raises(ValueError, match="not part of this workload"):
        trace_replay.run({"system": "hdf5", "requests": 1})


def test_scaling_one_and_two_ranks(dirs) -> None:
    result = scaling.run({"system": "cascade,hdf5,mooncake", "rank_counts": [1, 2], "sizes": [SIZE],
                          "blocks": 2, "warmup": 1, "rounds": 1, **dirs})
    assert result["schema"] == "cascade-bench/scaling/1"
    assert all(launch["returncode"] == 0 for launch in result["launches"]), result["launches"]
    assert {(r["system"], r["ranks"]) for r in result["rows"]} == {
        ("cascade", 1), ("cascade", 2), ("hdf5", 1), ("hdf5", 2)}
    assert result["not_run"][0]["system"] == "mooncake" and result["not_run"][0]["status"] == "not_run"
    assert "mpi_get_pair_gbps" in result["limits"]["2"] and "memcpy_aggregate_gbps" in result["limits"]["1"]
    for row in result["rows"]:
        assert row["put_gbps"] > 0 and row["get_gbps"] > 0 and row["misses"] == 0
        assert set(row["speedup_vs_1_rank"]) == {"put_gbps", "get_gbps"}
        assert "put_gbps_vs_memcpy_aggregate" in row["vs_limit"]
    two = next(r for r in result["rows"] if r["system"] == "cascade" and r["ranks"] == 2)
    # one node: the peer's blocks come from its /dev/shm slab, so memcpy is the yardstick, not MPI Get
    assert two["cross_get_gbps"] > 0 and "cross_get_gbps_vs_memcpy_aggregate" in two["vs_limit"]
    assert "cross_get_gbps_vs_mpi_get_aggregate" not in two["vs_limit"] and "/dev/shm" in two["cross_get_path"]
    assert "hdf5" in two["vs_systems"]
    assert "xget" in scaling.table(result)


def test_parallel_raw_reads_land_every_block(tmp_path) -> None:
    assert [len(r) for r in machine.shares(10, 4)] == [3, 3, 2, 2] and machine.shares(1, 2)[1] == range(1, 1)
    path = str(tmp_path / "raw.bin")
    parts = [np.full(SIZE // 2, i, dtype=np.uint8) for i in range(6)]  # 3 blocks: key i, value i + 1
    assert machine.write_file(path, parts) == 3 * SIZE
    for how in ("odirect", "buffered_cold", "buffered_hot"):
        outs = [aligned_pair(SIZE // 2) for _ in range(3)]
        got = machine.raw_read_threads(path, outs, 2, how)
        assert got["bytes"] == 3 * SIZE and got["gbps"] > 0 and got["threads"] == 2
        assert all((k == 2 * j).all() and (v == 2 * j + 1).all() for j, (k, v) in enumerate(outs)), how
    assert got["odirect"] is False and "page_cache" not in got
    copy = machine.memcpy_threads([(p, np.zeros_like(p)) for p in parts], 3)
    assert copy["bytes"] == 3 * SIZE and copy["gbps"] > 0


def test_scaling_ends_a_job_past_its_limit_with_its_ranks_and_goes_on(dirs, tmp_path, monkeypatch) -> None:
    import sys

    from cascade.testing.pids import SLEEPING_GRANDCHILD, gone, written_pid

    pid_files = []

    def hung_job(ranks, *args):  # a job whose ranks never finish
        pid_files.append(tmp_path / f"pid{ranks}")
        return [sys.executable, "-c", SLEEPING_GRANDCHILD, str(pid_files[-1])]

    monkeypatch.setattr(scaling, "TIMEOUT_S", 2.0)
    monkeypatch.setattr(scaling, "mpiexec_command", hung_job)
    result = scaling.run({"system": "cascade", "sizes": [SIZE], "blocks": 2, "warmup": 1, "rounds": 1,
                          "rank_counts": [1, 2], **dirs})
    failed = [p for p in result["not_run"] if p.get("status") == "failed"]
    assert [p["ranks"] for p in failed] == [1, 2] and all("ran past 2.0 s" in p["reason"] for p in failed)
    assert all(gone(written_pid(path)) for path in pid_files)


def test_thread_scaling(dirs) -> None:
    result = thread_scaling.run({"sizes": [SIZE], "threads": [1, 2], "blocks": 4, "warmup": 1, "rounds": 2, **dirs})
    assert result["schema"] == "cascade-bench/thread_scaling/1" and result["thread_counts"] == [1, 2]
    forms = set(thread_scaling.FORMS)
    rows = result["rows"]
    configs = (("shm", None, "dram"), ("file", "auto", "cold"), ("file", "auto", "hot"), ("file", "direct", "cold"))
    assert {(r["tier"], r.get("file_read_mode"), r["cache"], r["form"], r["threads"])
            for r in rows if r["system"] == "cascade"} == {(*c, f, n) for c in configs for f in forms for n in (1, 2)}
    assert {(r["limit"], r["threads"]) for r in rows if r["system"] == "limit"} == {
        (name, n) for name in thread_scaling.LIMITS for n in (1, 2)}
    assert result["not_run"] == [], result["not_run"]
    for row in rows:
        assert row["get_gbps"] > 0 and len(row["get_gbps_rounds"]) == 2 and row["blocks"] == 4
        assert row["speedup_vs_1_thread"] > 0 and (row["threads"] == 2 or row["speedup_vs_1_thread"] == 1.0)
        if row["system"] == "cascade":
            assert row["misses"] == 0 and row["bytes_checked_blocks"] == 2 * 2  # every pass: 2 blocks compared
            same = {"raw_read_same_mode"} if row["cache"] == "cold" else set()
            assert set(row["vs_limit"]) == set(row["vs_limit_range"]) == set(thread_scaling.VS[row["cache"]]) | same
            if same:  # the raw cold read of the mode the tier read in
                limit = "raw_odirect_read" if row["effective_read_mode"] == "direct" else "raw_buffered_cold_read"
                assert row["raw_read_same_mode_limit"] == limit
                assert row["vs_limit"]["raw_read_same_mode"] == row["vs_limit"][limit]
            assert all(lo <= row["vs_limit"][n] <= hi for n, (lo, hi) in row["vs_limit_range"].items())
        if row.get("cache") == "cold" or row.get("limit") == "raw_buffered_cold_read":
            assert "posix_fadvise" in row["cold_method"] and row["resident_fraction_after_drop"] <= 0.01
        if "file_read_mode" in row:
            assert row["effective_read_mode"] == {"auto": "buffered", "direct": "direct"}[row["file_read_mode"]]
    cold = [r for r in rows if r.get("cache") == "cold"]
    targets = {t["name"]: t for t in result["targets"]}
    assert len(targets) == len(cold) + len(configs) * len(forms)  # cold vs raw per row; growth per config at x2
    for r in cold:
        (t,) = [t for name, t in targets.items()
                if name.startswith(f"file {r['file_read_mode']} cold {r['form']} x{r['threads']} ")]
        assert t["value"] == r["vs_limit"]["raw_read_same_mode"] and t["met"] == (t["value"] >= 0.8)
        assert f"raw {r['effective_read_mode']} cold read" in t["name"]
    assert "limit raw_odirect_read" in thread_scaling.table(result)


def test_runner_writes_a_results_file(dirs, tmp_path) -> None:
    rc = run_benchmark.main(["--system", "cascade,hdf5", "--workload", "write_throughput", "--sizes", "64K",
                             "--blocks", "3", "--warmup", "1", "--rounds", "1", "--data-dir", dirs["data_dir"],
                             "--file-dir", dirs["file_dir"], "--out", str(tmp_path)])
    assert rc == 0
    (path,) = tmp_path.glob("cascade+hdf5_write_throughput_1n_*.json")
    doc = json.loads(path.read_text())
    for key in ("command", "versions", "machine", "config", "rows", "limits", "targets"):
        assert key in doc
    assert doc["config"]["blocks"] == 3 and doc["machine"]["cpus"] >= 1


def test_trace_replay_covers_every_system_with_eviction() -> None:
    """Every evicting peer replays, in its default variant only (the variants keep the same blocks)."""
    from benchmark.adapters import default_variants
    from benchmark.workloads.common import with_eviction

    evicting = with_eviction()
    assert set(default_variants(evicting)) <= set(trace_replay.SYSTEMS)
    assert {"redis_unix", "lmcache_disk_odirect"} <= set(evicting) and not set(evicting) - set(
        default_variants(evicting)) & set(trace_replay.SYSTEMS)
    assert set(trace_replay.FULL_TRACE) <= set(trace_replay.SYSTEMS)


def test_trace_replay_compares_every_system_on_the_same_prefix(dirs) -> None:
    result = trace_replay.run({"system": "cascade,redis", "requests": 10, "capacities": [200],
                               "sizes": [16 << 10], "file_dir": dirs["file_dir"]})
    compare = [r for r in result["system_rows"] if r["scope"] == "compare"]
    assert sorted(r["system"] for r in compare) == ["cascade", "redis"]
    assert {r["requests"] for r in compare} == {10} and {r["references"] for r in compare} == {compare[0]["references"]}
    full = [r for r in result["system_rows"] if r["scope"] == "full"]
    assert [r["system"] for r in full] == ["cascade"] and full[0]["requests"] == result["requests"] > 10
    assert full[0]["vs_systems"] == {}  # never compared with a peer's shorter replay


def test_every_installed_system_runs_and_reports_sane_figures(tmp_path) -> None:
    """All systems of the comparison: only PDC (not installable here) may be missing;
    a peer that fails or cannot start fails this test. 2 MiB blocks: capacity 24 MiB,
    above Mooncake's 16 MiB minimum segment."""
    size = 2 << 20
    out = data.generate(tmp_path / "data", model="llama3-8b", block_bytes=[size], blocks=6, seed=0, progress=False)
    result = read_throughput.run({"system": "all", "sizes": [size], "blocks": 4, "warmup": 2, "rounds": 1,
                                  "data_dir": str(out), "file_dir": str(tmp_path / "files")})
    assert [p["system"] for p in result["not_run"]] == ["pdc"], result["not_run"]
    assert result["not_run"][0]["status"] == "skipped"
    ran = {r["system"] for r in result["rows"]}
    assert ran == {"cascade", "cascade_file", "lmcache_cpu", "lmcache_disk", "lmcache_disk_odirect", "lmcache_cpu_disk",
                   "hdf5", "hdf5_nocache", "redis", "redis_unix", "mooncake"}
    # every peer with variants gets its best one per mode, chosen on this run's figures
    for fam, variants in (("hdf5", {"hdf5", "hdf5_nocache"}), ("redis", {"redis", "redis_unix"}),
                          ("lmcache_disk", {"lmcache_disk", "lmcache_disk_odirect"})):
        for mode in ("hot", "cold") if fam != "redis" else ("hot",):
            rows = [r for r in result["rows"] if r["system"] in variants and r["mode"] == mode]
            win = max(rows, key=lambda r: r["get_gbps"])
            assert result["best_variants"][fam][f"{size}/{mode}"] == win["system"]
            assert [r["system"] for r in rows if r["best_variant"]] == [win["system"]]
            mine = next(r for r in result["rows"] if r["system"] == ("cascade" if mode == "hot" else "cascade_file")
                        and r["mode"] == mode)
            assert mine["vs_best"][fam] == mine["get_gbps"] / win["get_gbps"]
    lim = result["limits"][str(size)]
    assert all(lo <= hi for lo, hi in lim["spread"].values())
    for row in result["rows"]:
        assert row["misses"] == 0 and row["stored_after_put"] == 4 and row["bytes_checked_blocks"] > 0, row["system"]
        assert 0.001 < row["get_gbps"] < 1000, (row["system"], row["get_gbps"])
        assert set(row["vs_systems"]) >= (ran - {row["system"]}) if row["mode"] == "hot" else True
        assert set(row["vs_limit_range"]) == set(row["vs_limit"])
        assert row.get("above_noisy_limit", []) == sorted(k for k, v in row["vs_limit"].items() if v > 1)


def test_best_variant_per_peer_and_group() -> None:
    """The best variant of each peer is chosen per (size, mode) from the run's own figures;
    lower is better for latency, and a row is never compared with its own family."""
    from benchmark.workloads.common import add_best_variants

    rows = [{"system": s, "block_bytes": b, "mode": "hot", "p50_s": t} for s, b, t in (
        ("cascade", 1, 1.0), ("redis", 1, 4.0), ("redis_unix", 1, 2.0),
        ("cascade", 2, 1.0), ("redis", 2, 3.0), ("redis_unix", 2, 6.0))]
    best = add_best_variants(rows, "p50_s", ("block_bytes", "mode"), higher_is_better=False)
    assert best["redis"] == {"1/hot": "redis_unix", "2/hot": "redis"}
    assert [r["vs_best"]["redis"] for r in rows if r["system"] == "cascade"] == [2.0, 3.0]
    assert [r["best_variant"] for r in rows] == [True, False, True, True, True, False]
    assert all("redis" not in r["vs_best"] for r in rows if r["family"] == "redis")


def test_limits_are_measured_the_way_cascade_reads(tmp_path) -> None:
    """The raw O_DIRECT limit cuts a block into the file tier's requests and depth, and the
    memcpy limit rotates through buffers larger than the last-level cache."""
    from cascade.tiers import record_io

    big = record_io.PARALLEL_MIN
    assert machine.odirect_plan(big) == (record_io.CHUNK, record_io.READERS)
    assert machine.odirect_plan(big - 4096) == (big - 4096, 1)
    raw = machine.raw_file_gbps(str(tmp_path), big, 2 * big)
    assert (raw["odirect_request_bytes"], raw["odirect_in_flight"]) == (
        (record_io.CHUNK, record_io.READERS) if raw["odirect"] else (big, 1))
    mem = machine.memcpy_gbps(2 << 20, repeats=3)
    assert mem["working_set_bytes"] >= 4 * machine.llc_bytes() and mem["gbps"] > 0
    assert (mem["streamed_gbps"] > 0) if hostcopy.COMPILED else mem["streamed_gbps"] is None
    assert not list(tmp_path.iterdir())


def test_tier_bandwidth_small(tmp_path) -> None:
    from benchmark.workloads import tier_bandwidth

    result = tier_bandwidth.run({"sizes": [64 << 10], "total_bytes": 1 << 20, "file_dir": str(tmp_path)})
    (row,) = result["rows"]
    assert row["block_bytes"] == 64 << 10 and row["memcpy"]["gbps"] > 0 and row["raw_file"]["read_gbps"] > 0
    for tier in ("gpu", "shm", "lustre"):
        assert row[tier]["put_gbps"] > 0 and row[tier]["get_gbps"] > 0, tier
    assert row["store_put_hashed"]["put_gbps"] > 0
    assert row["ratios"]["shm_get_vs_memcpy"] == pytest.approx(row["shm"]["get_gbps"] / row["memcpy"]["gbps"])
    if hostcopy.COMPILED:  # and against the streamed copy, the faster way to memory where glibc does not stream
        streamed = row["memcpy"]["streamed_gbps"]
        assert row["ratios"]["shm_put_vs_streamed_copy"] == pytest.approx(row["shm"]["put_gbps"] / streamed)
    else:
        assert "shm_put_vs_streamed_copy" not in row["ratios"]
    # cold file-tier gets: a whole pass against the better raw read of the mode the tier read in
    mode = row["lustre"]["read_mode"]
    key = "read_gbps" if mode == "direct" else "buffered_cold_read_gbps"
    raw = max(row["raw_file"][key], row["raw_file_after"][key])
    assert row["raw_read_same_mode"] == {"read_mode": mode, "gbps": raw, "limit": (
        "raw_odirect_read" if mode == "direct" else "raw_buffered_cold_read")}
    assert row["ratios"]["lustre_cold_aggregate_vs_raw_same_mode"] == row["lustre"]["get_aggregate_gbps"] / raw
    write = max(row["raw_file"]["write_gbps"], row["raw_file_after"]["write_gbps"])
    assert row["ratios"]["lustre_put_vs_raw_write"] == row["lustre"]["put_gbps"] / write
    mem = result["memory_overhead"]
    assert [r["block_bytes"] for r in mem["rows"]] == [64 << 10, 1 << 20]
    for r in mem["rows"]:
        # the slab is twice the data and not counted: what is left is the store's own memory, far below the data
        assert r["slab_bytes"] == 2 * r["data_bytes"] and r["slab_resident_bytes"] > 0
        assert abs(r["overhead_bytes"]) < r["data_bytes"] and r["overhead_fraction"] < 0.5
    assert mem["overhead_fraction"] == mem["rows"][-1]["overhead_fraction"] and "smaps" in mem["method"]
    assert not list(tmp_path.iterdir())  # its work directory is removed
    assert "memory overhead" in tier_bandwidth.table(result)


def test_tier_bandwidth_ratios_take_the_better_raw_limit() -> None:
    """Every ratio to a raw file limit, the lustre put's to the raw write included, uses
    the better of the measurements before and after the tiers."""
    from benchmark.workloads import tier_bandwidth

    tiers = {t: {"put_gbps": 1.0, "get_gbps": 2.0} for t in ("gpu", "shm", "store_put_hashed")}
    row = {"memcpy": {"gbps": 10.0}, **tiers,
           "lustre": {"put_gbps": 0.5, "read_mode": "buffered", "get_aggregate_gbps": 1.0},
           "raw_file": {"write_gbps": 0.5, "read_gbps": 4.0, "buffered_cold_read_gbps": 1.0},
           "raw_file_after": {"write_gbps": 1.0, "read_gbps": 2.0, "buffered_cold_read_gbps": 2.0}}
    tier_bandwidth.add_ratios(row)
    ratios = row["ratios"]
    assert ratios["lustre_put_vs_raw_write"] == 0.5  # against the after measurement, the better one
    assert ratios["lustre_cold_aggregate_vs_raw_odirect_read"] == 0.25  # against the before one
    assert ratios["lustre_cold_aggregate_vs_raw_same_mode"] == 0.5 and row["raw_read_same_mode"]["gbps"] == 2.0


def test_file_read_mode_runs_every_pass_in_a_shuffled_order(tmp_path) -> None:
    from benchmark.workloads import file_read_mode

    result = file_read_mode.run({"sizes": [SIZE], "blocks": 16, "rounds": 2, "file_dir": str(tmp_path)})
    [row] = result["rows"]
    passes = {f"{side} {how} {form}" for side, how, form in file_read_mode._passes(0)}
    assert len(passes) == 10 and "records buffered loop" in passes and "cascade buffered batches" in passes
    orders = [s["order"] for s in row["samples"]]
    assert all(sorted(o) == sorted(passes) for o in orders) and orders[0] != orders[1]  # seeds 0 and 1
    for mode in file_read_mode.MODES:
        for form in file_read_mode.FORMS:
            cell = row[f"{mode}_{form}"]
            assert cell["wrong"] == 0 and cell["gbps"] > 0
            assert cell["fastest_gbps"] == max(s[f"{mode}_{form}_gbps"] for s in row["samples"]) >= cell["gbps"]
            fastest_raw = max(row[f"raw_{how}_{form}_fastest_gbps"] for how in file_read_mode.RAW_HOWS)
            assert cell["fastest_vs_best_raw"] == pytest.approx(cell["fastest_gbps"] / fastest_raw)
            assert all(s[f"{mode}_{form}_sys_s_per_gb"] >= 0 for s in row["samples"])
            way = cell["better_raw"]  # the raw way with the higher median rate; each round's ratio to it
            assert way == max(file_read_mode.RAW_HOWS, key=lambda how: statistics.median(
                s[f"raw_{how}_{form}_gbps"] for s in row["samples"]))
            assert cell["vs_better_raw"] == pytest.approx(statistics.median(
                s[f"{mode}_{form}_gbps"] / s[f"raw_{way}_{form}_gbps"] for s in row["samples"]))
            assert cell["vs_better_raw"] >= cell["vs_best_raw"]  # one way never reads above the better of two
    for form in file_read_mode.FORMS:
        assert row[f"raw_odirect_{form}_gbps"] > 0 and row[f"raw_buffered_cold_{form}_gbps"] > 0
    batches = row["buffered_batches"]  # a stream read a batch at a time, against the raw batch reads and the loop
    assert batches["wrong"] == 0 and batches["better_raw"] == row["buffered_batch"]["better_raw"]
    assert batches["time_vs_loop"] == pytest.approx(statistics.median(
        s["buffered_loop_gbps"] / s["buffered_batches_gbps"] for s in row["samples"]))
    records = row["records_loop"]  # the tier's own reads without the store: every record read and verified
    assert records["wrong"] == 0 and records["gbps"] > 0
    assert records["buffered_loop_vs_records"] == pytest.approx(statistics.median(
        s["buffered_loop_gbps"] / s["records_loop_gbps"] for s in row["samples"]))
    assert "without the store" in file_read_mode.table(result)


def test_the_records_pass_refuses_a_record_whose_bytes_changed(tmp_path) -> None:
    """A flipped payload byte fails the pass's digest check, as it fails the tier's."""
    from benchmark.workloads.file_read_mode import _read_records
    from cascade.identity import DEFAULT_NAMESPACE
    from cascade.tiers.records import key_seed

    spec = BlockSpec.flat(SIZE)
    blocks = [spec.empty() for _ in range(2)]
    for n, (key, value) in enumerate(blocks):
        key.fill(n + 1)
        value.fill(n + 3)
    ids = [f"{n + 1:032x}" for n in range(2)]
    with CascadeStore(Config(shm_bytes=0, remote_bytes=0, file_bytes=64 << 20, file_dir=str(tmp_path)),
                      block_spec=spec) as store:
        store.put_many(blocks, block_ids=ids)
        store.flush()
        spans = [store.tiers[0].record_span((DEFAULT_NAMESPACE, b)) for b in ids]
    path, offset, _, _ = spans[1]
    with open(path, "r+b") as f:
        f.seek(offset + 5)
        f.write(bytes([f.read(1)[0] ^ 0xFF]))
    outs = [spec.empty() for _ in range(2)]
    assert _read_records(spans, [key_seed(DEFAULT_NAMESPACE, b) for b in ids], outs) == [True, False]
    assert np.array_equal(outs[0][0], blocks[0][0]) and np.array_equal(outs[0][1], blocks[0][1])


def test_write_throughput_times_no_cascade_set_up_at_warmup_0(dirs, monkeypatch) -> None:
    """With no warm-up put, Cascade's store (SHM slab, prefaulted) is still opened before
    the timed puts, as peers start before them: every put finds it open."""
    from benchmark.adapters.cascade_adapter import CascadeAdapter

    seen: list = []
    real_put = CascadeAdapter.put

    def put(self, block_id, key, value):
        seen.append(self.describe()["block_bytes"])
        return real_put(self, block_id, key, value)

    monkeypatch.setattr(CascadeAdapter, "put", put)
    result = write_throughput.run(_options(dirs, system="cascade", warmup=0, rounds=2))
    assert result["not_run"] == [] and result["rows"][0]["warmup_blocks"] == 0
    assert seen == [SIZE] * 2 * 4


@pytest.mark.parametrize("args, message", [
    (["--sizes", "2Q"], "argument --sizes: expected a size such as 64K or 2M, got '2Q'"),
    (["--sizes", "0"], "argument --sizes: a size must be > 0, got '0'"),
    (["--sizes", ","], "argument --sizes: expected a size such as 64K or 2M, got ''"),
    (["--capacities", "10,x"], "argument --capacities: expected an integer, got 'x'"),
    (["--rounds", "0"], "argument --rounds: must be >= 1, got 0"),
    (["--blocks", "0"], "argument --blocks: must be >= 1, got 0"),
    (["--blocks", "-1"], "argument --blocks: must be >= 1, got -1"),
    (["--warmup", "-1"], "argument --warmup: must be >= 0, got -1"),
    (["--rank-counts", "0"], "argument --rank-counts: must be >= 1, got 0"),
    (["--threads", "1,0"], "argument --threads: must be >= 1, got 0"),
    (["--system", "cascade,"], "workload write_throughput runs cascade, "),
])
def test_runner_refuses_bad_options_in_one_line(args, message, tmp_path, capsys) -> None:
    """A bad option is a one-line usage error (exit 2) before anything runs: never a
    traceback, a default run in its place, or a run recorded as failed."""
    argv = ["--system", "cascade", "--workload", "write_throughput", "--out", str(tmp_path / "out"), *args]
    with pytest.raises(SystemExit) as exc:
        run_benchmark.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err.splitlines()[-1] and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("workload", ["scaling", "trace_replay", "queue_hints"])
def test_one_size_workloads_refuse_more_sizes(workload, tmp_path, capsys) -> None:
    """scaling, trace_replay and queue_hints run one block size: more are refused, not dropped."""
    with pytest.raises(SystemExit) as exc:
        run_benchmark.main(["--system", "cascade", "--workload", workload, "--sizes", "256K,512K",
                            "--out", str(tmp_path)])
    last = capsys.readouterr().err.splitlines()[-1]
    assert exc.value.code == 2 and f"{workload} runs one block size; got 2 sizes" in last
    assert not list(tmp_path.iterdir())


def test_runner_checks_out_before_running(tmp_path, capsys) -> None:
    """An --out that cannot be written is refused before the run, not found after it."""
    blocked = tmp_path / "a_file"
    blocked.write_text("")
    with pytest.raises(SystemExit) as exc:
        run_benchmark.main(["--system", "cascade", "--workload", "write_throughput", "--out", str(blocked / "sub")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"--out {blocked / 'sub'}: cannot write results there" in err.splitlines()[-1]
    assert "write_throughput 2 MiB" not in err  # nothing ran


def test_zero_counts_are_values_not_defaults(dirs) -> None:
    """0 given for a count is taken as given (refused where it cannot run), never replaced
    by the workload's default."""
    from benchmark.workloads.common import OptionError

    for option in ("blocks", "rounds"):
        with pytest.raises(OptionError, match=f"{option} must be >= 1, got 0"):
            write_throughput.run(_options(dirs, **{option: 0}))
    with pytest.raises(OptionError, match="blocks must be >= 1, got 0"):
        scaling.run({"system": "cascade", "blocks": 0, **dirs})


def test_tables_label_sizes_below_a_mib() -> None:
    from benchmark.workloads.common import format_targets

    target = {"name": "t", "block_bytes": 256 << 10, "mode": "hot", "value": None, "threshold": 1.0, "met": None}
    assert format_targets([target]) == ["target t @ 256 KiB (hot): n/a (>= 1.0x) not measured"]
    table = scaling.table({"blocks_per_rank": 2, "block_bytes": 256 << 10, "limits": {}, "rows": [], "not_run": []})
    assert table.splitlines()[0] == "weak scaling: 2 x 256 KiB blocks per rank"
