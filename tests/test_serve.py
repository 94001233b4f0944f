"""``cascade serve`` for real: 2 and 4 ranks under mpiexec (1 node and 2 emulated
nodes), engines attached as separate client processes (a real LMCache 0.5.x
StorageManager with the Cascade plugin, or a plain ``cascade.connect`` client).

Each test starts the job in a subprocess, waits until every rank listens, and stops
everything by PID in teardown.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

import numpy as np
import pytest

import cascade
from cascade.testing.serve_client import BATCH, PINNED, block_of

pytest.importorskip("mpi4py", reason="the mpi extra (mpi4py) is not installed")
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [pytest.mark.mpi, pytest.mark.timeout(120)]


class ServeJob:
    """``mpiexec -n ranks python -m mpi4py -m cascade serve`` with a private socket dir."""

    def __init__(self, tmp_path, ranks: int, nodes: int = 1, *, block_bytes: int = 8192, shm: str = "16M") -> None:
        self.ranks = ranks
        self.socket_dir = tempfile.mkdtemp(prefix="cs-", dir="/tmp")  # short: sun_path holds 107 bytes
        shm_dir = tmp_path / "shm"
        shm_dir.mkdir(exist_ok=True)
        env = {**os.environ, "PYTHONPATH": ROOT}
        if nodes > 1:
            env["MPIR_CVAR_NUM_CLIQUES"] = str(nodes)
        self._mpich_before = set(glob.glob("/dev/shm/mpich_shm_*"))
        self.proc = subprocess.Popen(
            [MPIEXEC, "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "cascade", "serve",
             "--socket-dir", self.socket_dir, "--block-bytes", str(block_bytes),
             "--set", f"shm_bytes={shm}", "--set", "file_bytes=0", "--set", f"shm_dir={shm_dir}",
             "--set", f"file_dir={tmp_path / 'files'}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
        self.lines: list[str] = []
        self.pids: dict[int, int] = {}
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(90):
            self.stop()
            raise AssertionError("cascade serve did not come up:\n" + "".join(self.lines[-40:]))

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith("cascade serve: rank "):
                rank = int(line.split()[3].split("/")[0])
                self.pids[rank] = int(line.split("(pid ")[1].split(")")[0])
                if len(self.pids) == self.ranks:
                    self._ready.set()
        self._ready.set()

    def socket(self, rank: int) -> str:
        return os.path.join(self.socket_dir, f"r{rank}.sock")

    def stop_rank(self, rank: int) -> int:
        """SIGTERM one rank (every rank then stops); the job's exit code."""
        os.kill(self.pids[rank], signal.SIGTERM)
        return self.proc.wait(60)

    def stop(self) -> None:
        """Stop the job: SIGTERM a rank, and kill mpiexec's session if that is not enough."""
        if self.proc.poll() is None:
            try:
                if self.pids:
                    os.kill(next(iter(self.pids.values())), signal.SIGTERM)
                self.proc.wait(30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        for path in set(glob.glob("/dev/shm/mpich_shm_*")) - self._mpich_before:
            try:
                os.unlink(path)  # what a killed job left (a later job could draw the same name)
            except FileNotFoundError:
                pass
        shutil.rmtree(self.socket_dir, ignore_errors=True)


@pytest.fixture
def serve_job(tmp_path):
    jobs: list[ServeJob] = []

    def start(ranks: int, nodes: int = 1, **kw) -> ServeJob:
        jobs.append(ServeJob(tmp_path, ranks, nodes, **kw))
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


@pytest.mark.parametrize("ranks,nodes", [(2, 1), (4, 1), (4, 2)], ids=["2ranks", "4ranks", "4ranks-2nodes"])
def test_lmcache_instance_reads_chunks_another_instance_stored_on_another_rank(serve_job, ranks, nodes):
    job = serve_job(ranks, nodes)
    assert len({line.split(" on node ")[1].split()[0] for line in job.lines if " on node " in line}) == nodes
    chunks = 6
    stored = _result(_client("lmcache-store", job.socket(0), chunks))
    assert stored == {"stored": chunks, "rank": 0}
    fetched = _result(_client("lmcache-fetch", job.socket(ranks - 1), chunks))
    # another engine process, attached to another rank: every chunk is a hit, same bytes
    assert (fetched["hits"], fetched["exact"]) == (chunks, chunks), fetched
    stats = fetched["rank_stats"]
    assert stats["rank"] == ranks - 1 and stats["blocks"] == 0  # nothing of it stored on that rank
    assert stats["cluster_hits"] >= chunks  # ... every hit was served by rank 0


def test_client_killed_mid_put_leaks_no_pin_and_no_partial_block(serve_job):
    job = serve_job(2, block_bytes=256 << 10, shm="64M")
    killed = _client("put-forever", job.socket(0))
    pinned = json.loads(killed.stdout.readline())["pinned"]
    done = 0
    while done < 4 * BATCH:  # it is in its put loop: kill it at some point of one
        done = json.loads(killed.stdout.readline())["done"]
    killed.send_signal(signal.SIGKILL)
    killed.wait(10)
    with cascade.connect(job.socket(0)) as check:
        serve = check.stats()["serve"]
        for _ in range(100):  # the rank notices the hang-up when its thread next reads
            if serve["clients"] == 1:
                break
            threading.Event().wait(0.05)
            serve = check.stats()["serve"]
        assert serve["clients"] == 1 and serve["client_pins"] == 0, serve
        assert serve["staging_bytes"] == 64 << 20  # only ours is still mapped
        for block_id in pinned:  # the store's own pins are gone too: deletable now
            check.delete(block_id)
        # every block the store holds is one the client wrote whole, byte-exact
        candidates = [block_of(i, check.spec) for i in range(done + 4 * BATCH)]
        present = check.contains_many([b for b, _, _ in candidates])
        assert sum(present) >= done - 2 * BATCH  # (eviction may have dropped a few oldest)
        held = [c for c, there in zip(candidates, present) if there]
        got = check.get_many([b for b, _, _ in held])
        wrong = [b for (b, k, v), g in zip(held, got) if g is None or not (np.array_equal(g[0], k) and np.array_equal(g[1], v))]
        assert wrong == []
        assert len(check) == len(held)  # nothing else (no half-written block) is counted


def test_stopped_rank_fails_its_clients_at_once_and_lmcache_recomputes(serve_job):
    job = serve_job(2)
    waiting = _client("lmcache-wait", job.socket(1), 4, stdin=subprocess.PIPE)
    assert waiting.stdout.readline().strip() == "attached"
    client = cascade.connect(job.socket(1), timeout=300)
    k, v = client.spec.empty()
    client.put(k, v, block_id="ab" * 16)
    assert job.stop_rank(1) == 0  # every rank stops cleanly
    with pytest.raises(cascade.RankFailure, match="is gone"):  # EOF, not the 300 s reply timeout
        client.contains("ab" * 16)
    with pytest.raises(cascade.RankFailure, match="is gone"):  # and stays failed
        client.get_into("ab" * 16, k, v)
    waiting.stdin.write("go\n")
    waiting.stdin.flush()
    result = _result(waiting)
    assert (result["hits"], result["misses"]) == (0, 4)  # misses: the engine recomputes
