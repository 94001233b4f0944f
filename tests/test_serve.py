"""``cascade serve`` for real: 2 and 4 ranks under mpiexec (1 node and 2 emulated
nodes), engines attached as separate client processes (a real LMCache 0.5.x
StorageManager with the Cascade plugin, or a plain ``cascade.connect`` client).

Each test starts the job in a subprocess, waits until every rank listens, and stops
everything by PID in teardown.
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import cascade
from cascade.testing.serve_client import BATCH, block_of
from cascade.testing.serve_job import ROOT, ServeJob

pytest.importorskip("mpi4py", reason="the mpi extra (mpi4py) is not installed")
pytestmark = [pytest.mark.mpi, pytest.mark.timeout(120)]
needs_lmcache = pytest.mark.skipif(importlib.util.find_spec("lmcache") is None or importlib.util.find_spec("torch") is None,
                                   reason="LMCache and torch are not installed (third_party/install.sh)")


@pytest.fixture
def serve_job(tmp_path):
    jobs: list[ServeJob] = []

    def start(ranks: int, nodes: int = 1, **kw) -> ServeJob:
        jobs.append(ServeJob(str(tmp_path), ranks, nodes, **kw))
        return jobs[-1]

    yield start
    for job in jobs:
        job.stop()


def _client(mode: str, socket: str, *args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": ROOT, "LMCACHE_TRACK_USAGE": "false"}
    return subprocess.Popen([sys.executable, "-m", "cascade.testing.serve_client", mode, socket, *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **kw)


def _result(proc: subprocess.Popen, timeout: float = 60) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


@needs_lmcache
@pytest.mark.parametrize("ranks,nodes", [(2, 1), (4, 1), (4, 2)], ids=["2ranks", "4ranks", "4ranks-2nodes"])
def test_lmcache_instance_reads_chunks_another_instance_stored_on_another_rank(serve_job, ranks, nodes):
    job = serve_job(ranks, nodes)
    assert len(set(job.nodes.values())) == nodes
    chunks = 6
    stored = _result(_client("lmcache-store", job.socket(0), chunks))
    assert stored == {"stored": chunks, "rank": 0}
    fetched = _result(_client("lmcache-fetch", job.socket(ranks - 1), chunks))
    # another engine process, attached to another rank: every chunk is a hit, same bytes
    assert (fetched["hits"], fetched["exact"]) == (chunks, chunks), fetched
    stats = fetched["rank_stats"]
    assert stats["rank"] == ranks - 1 and stats["blocks"] == 0  # nothing of it stored on that rank
    assert stats["cluster_hits"] >= chunks  # ... every hit was served by rank 0


@pytest.mark.parametrize("nodes", [1, 2], ids=["1node", "2nodes"])
def test_client_killed_mid_put_leaks_no_pin_and_no_partial_block(serve_job, nodes):
    job = serve_job(2, nodes, block_bytes=256 << 10, shm="64M")
    killed = _client("put-forever", job.socket(0))
    pinned = json.loads(killed.stdout.readline())["pinned"]
    done = 0
    while done < 4 * BATCH:  # it is in its put loop: kill it at some point of one
        done = json.loads(killed.stdout.readline())["done"]
    killed.send_signal(signal.SIGKILL)
    killed.wait(10)
    for line in killed.stdout.read().splitlines():  # batches it finished before it died
        done = json.loads(line)["done"]
    with cascade.connect(job.socket(0)) as check:
        serve = check.stats()["serve"]
        for _ in range(600):  # the rank notices the hang-up when its thread next runs
            if serve["clients"] == 1:
                break
            threading.Event().wait(0.05)
            serve = check.stats()["serve"]
        assert serve["clients"] == 1 and serve["client_pins"] == 0, serve
        assert serve["staging_bytes"] == 64 << 20  # only ours is still mapped
        for block_id in pinned:  # the store's own pins are gone too: deletable now
            check.delete(block_id)
        # every block the store holds is one the client wrote whole, byte-exact (the
        # candidates: every batch it finished, and the one it was in when killed)
        candidates = [block_of(i, check.spec) for i in range(done + BATCH)]
        present = check.contains_many([b for b, _, _ in candidates])
        assert sum(present) >= min(done, 128)  # (the 64 MiB tier holds 256 blocks)
        held = [c for c, there in zip(candidates, present) if there]
        got = check.get_many([b for b, _, _ in held])
        wrong = [b for (b, k, v), g in zip(held, got) if g is None or not (np.array_equal(g[0], k) and np.array_equal(g[1], v))]
        assert wrong == []
        assert len(check) == len(held)  # nothing else (no half-written block) is counted


@needs_lmcache
@pytest.mark.parametrize("nodes,how", [(1, "stop"), (2, "stop"), (1, "kill")], ids=["1node", "2nodes", "1node-sigkill"])
def test_stopped_rank_fails_its_clients_at_once_and_lmcache_recomputes(serve_job, nodes, how):
    job = serve_job(2, nodes)
    waiting = _client("lmcache-wait", job.socket(1), 4, stdin=subprocess.PIPE)
    assert waiting.stdout.readline().strip() == "attached"
    client, elsewhere = cascade.connect(job.socket(1), timeout=300), cascade.connect(job.socket(0), timeout=300)
    k, v = client.spec.empty()
    client.put(k, v, block_id="ab" * 16)
    if how == "stop":
        assert job.stop_rank(1) == 0  # every rank stops, cleanly
    else:  # the rank dies without a word: no handler runs, its socket file stays
        os.kill(job.pids[1], signal.SIGKILL)
        job.proc.wait(60)  # mpiexec ends the job (the other rank with it)
    with pytest.raises(cascade.RankFailure, match="is gone"):  # EOF, not the 300 s reply timeout
        client.contains("ab" * 16)
    with pytest.raises(cascade.RankFailure, match="is gone"):  # and stays failed
        client.get_into("ab" * 16, k, v)
    with pytest.raises(cascade.RankFailure, match="is gone"):  # the other rank stopped with it
        elsewhere.contains("ab" * 16)
    with pytest.raises(cascade.RankFailure, match="cannot attach"):  # a new client is refused at once
        cascade.connect(job.socket(1), timeout=300)
    waiting.stdin.write("go\n")
    waiting.stdin.flush()
    result = _result(waiting)
    assert (result["hits"], result["misses"]) == (0, 4)  # misses: the engine recomputes


def test_ranks_not_started_under_mpi4py_refuse_to_serve(tmp_path):
    done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "mpiexec"), "-n", "2", sys.executable, "-m",
                           "cascade", "serve", "--socket-dir", str(tmp_path), "--set", "file_bytes=0"],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode != 0 and "python -m mpi4py -m cascade serve" in done.stderr, done.stderr


_STARTER = """
import sys, tempfile
from cascade.testing.serve_job import ServeJob
job = ServeJob(tempfile.mkdtemp(dir=sys.argv[1]), 2)
print(job.proc.pid, *job.pids.values(), flush=True)
sys.stdin.read()  # held until killed
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def test_a_job_whose_starter_is_killed_stops_with_it(tmp_path):
    """A test run killed from outside (SIGKILL: no teardown runs) leaves no mpiexec or
    rank of its jobs running."""
    starter = subprocess.Popen([sys.executable, "-c", _STARTER, str(tmp_path)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ROOT})
    pids = [int(p) for p in starter.stdout.readline().split()]
    try:
        assert len(pids) == 3 and all(_alive(p) for p in pids)  # mpiexec and both ranks
        starter.kill()
        starter.wait(10)
        deadline = time.monotonic() + 30
        while any(map(_alive, pids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in pids if _alive(p)]
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
