"""Warm restart at any job size: a job restarted on fewer or more ranks reads back every
block the last one kept, byte-exact (runs mpiexec jobs in subprocesses, at 1 node and at
2 emulated nodes), and a restart with another block layout is refused."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from cascade import CascadeStore, Config, ConfigError
from cascade.models import BlockSpec
from cascade.testing.elastic_job import BLOCKS_PER_RANK

pytest.importorskip("mpi4py", reason="the mpi extra (mpi4py) is not installed")
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]


def job(ranks: int, file_dir, phase: str, *, nodes: int, model: str = "tiny") -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if nodes == 2 and ranks > 1:
        env["MPIR_CVAR_NUM_CLIQUES"] = "2"
    cmd = [MPIEXEC, "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "cascade.testing.elastic_job",
           str(file_dir), phase, model]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)


def last_json(run: subprocess.CompletedProcess) -> dict:
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("before,after", [(4, 3), (3, 4), (4, 1), (1, 4)])
def test_restart_on_another_number_of_ranks_finds_every_block(tmp_path, before, after, nodes):
    written = job(before, tmp_path, "write", nodes=nodes)
    assert written.returncode == 0, written.stderr[-3000:]
    read = job(after, tmp_path, "read", nodes=nodes)
    assert read.returncode == 0, read.stderr[-3000:]
    report = last_json(read)
    print(f"{before} -> {after} ranks, {nodes} node(s): {report}")
    blocks = before * BLOCKS_PER_RANK
    assert report["blocks"] == blocks
    assert report["missing"] == 0 and report["wrong"] == 0, report
    assert report["recovered"] + report["adopted"] == blocks, report
    # the files of ranks that are gone were adopted, not left behind
    left = {int(os.path.basename(p)[8:11]) for p in glob.glob(str(tmp_path / "agg_rank*_*.bin"))}
    assert max(left) < after, sorted(left)
    manifest = json.loads((tmp_path / "cascade-manifest.json").read_text())
    assert manifest["world_size"] == after


def test_restart_with_another_model_is_refused_on_every_rank(tmp_path):
    assert job(2, tmp_path, "write", nodes=1).returncode == 0
    refused = job(2, tmp_path, "read", nodes=1, model="llama3-8b")
    assert refused.returncode == 3, refused.stderr[-3000:]
    assert "layout" in last_json(refused)["refused"]


def test_same_size_blocks_of_another_shape_are_refused(tmp_path):
    cfg = Config(model="tiny", shm_bytes=0, file_bytes=1 << 20, file_dir=str(tmp_path))
    with CascadeStore(cfg) as store:
        key, value = store.spec.empty()
        store.put(key, value)
    tiny = BlockSpec.for_model("tiny", 16)
    same_bytes = BlockSpec((tiny.shape[0] * 2, tiny.shape[1], tiny.shape[2] // 2, tiny.shape[3]), tiny.dtype)
    assert same_bytes.block_bytes == tiny.block_bytes
    with pytest.raises(ConfigError, match="layout"):
        CascadeStore(cfg, block_spec=same_bytes)
    with CascadeStore(cfg) as store:  # the refusal changed nothing
        assert len(store) == 1


def test_a_store_opened_without_comm_on_a_bigger_jobs_files_says_it_serves_its_own_only(tmp_path, caplog):
    cfg = Config(model="tiny", shm_bytes=0, file_bytes=1 << 20, file_dir=str(tmp_path))
    with CascadeStore(cfg) as store:
        store.put(*store.spec.empty())
    path = tmp_path / "cascade-manifest.json"
    written = json.loads(path.read_text())
    path.write_text(json.dumps({**written, "world_size": 3}))  # as a job of 3 ranks leaves it
    with caplog.at_level("WARNING", logger="cascade.manifest"), CascadeStore(cfg) as store:
        assert len(store) == 1
    assert "written by a job of 3 ranks; a store opened without comm serves only its own rank's files" in caplog.text


def test_close_counts_every_block_it_could_not_keep(tmp_path):
    stats_dir = tmp_path / "stats"
    records = 3  # the file tier has room for 3 records (header page + one 4 KiB payload each)
    settings = dict(model="tiny", shm_bytes=4 * 4096, file_bytes=records * 8192, file_dir=str(tmp_path / "files"))
    store = CascadeStore(Config(**settings, stats_dir=str(stats_dir)))
    for i in range(6):  # 4 stay in SHM, the rest are demoted to the file tier
        key, value = store.spec.empty()
        key[...], value[...] = i, -i
        store.put(key, value)
    store.flush()  # the background demoter is idle: the counts below stay put
    in_file = store.stats()["tiers"]["file"]["blocks"]
    held = len(store)
    store.close()
    counters = json.loads(next(stats_dir.glob("stats_rank*.json")).read_text())
    assert counters["kept_at_close"] == records - in_file
    assert counters["lost_at_close"] == held - records
    with CascadeStore(Config(**settings)) as again:  # what close said it kept is what comes back
        assert len(again) == records
