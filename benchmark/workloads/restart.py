"""restart: how long a warm restart takes per GiB of file tier, at the same job size and
at another one (files of ranks that are gone are adopted: copied, verified, fsynced).

``python -m benchmark.workloads.restart [--gib 1] [--cases 1:1,4:4,4:1,1:4] [--save [--out DIR]]``
runs, per case ``W:R``, a job of W ranks that fills its file tiers with 2 MiB blocks
(``--gib`` in all, file tier only), drops the files from the page cache, then a job of
R ranks whose every rank opens the store (timed: the collective constructor, scan,
adoption and republish included) and reads every block once (byte-exact check). Not
collective itself: it starts ``mpiexec`` jobs (``python -m mpi4py``) in subprocesses.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from cascade import CascadeStore, Config

from ..machine import drop_page_cache

MODEL, BLOCK_TOKENS = "llama3-8b", 16  # 2 MiB blocks
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")


def _config(file_dir: str, per_rank_bytes: int) -> Config:
    return Config(model=MODEL, block_tokens=BLOCK_TOKENS, shm_bytes=0, remote_bytes=0,
                  file_bytes=per_rank_bytes, file_dir=file_dir, directory_slots=1 << 14)


def _content(spec, rank: int, i: int):
    rng = np.random.default_rng([rank, i])
    key = rng.integers(-1000, 1000, spec.shape).astype(spec.dtype)
    return key, -key


def job(file_dir: str, phase: str, blocks_per_rank: int, capacity: int) -> None:
    """One rank of a ``write`` or ``read`` job (collective over the world)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD  # a program: its world is the job
    comm.Barrier()
    started = time.perf_counter()
    store = CascadeStore(_config(file_dir, capacity), comm=comm)
    open_s = comm.allreduce(time.perf_counter() - started, op=MPI.MAX)
    if phase == "write":
        ids = [store.put(*_content(store.spec, comm.rank, i)) for i in range(blocks_per_rank)]
        everyone = comm.gather(ids)
        if comm.rank == 0:
            with open(os.path.join(file_dir, "ids.json"), "w") as f:
                json.dump(everyone, f)
        store.close()
        return
    with open(os.path.join(file_dir, "ids.json")) as f:
        everyone = json.load(f)
    wrong = missing = 0
    key_out, value_out = store.spec.empty()
    for rank, ids in enumerate(everyone):
        for i, bid in enumerate(ids):
            if (rank + i) % comm.size != comm.rank:
                continue  # each block read once, by one rank
            if not store.get_into(bid, key_out, value_out):
                missing += 1
            elif not all(map(np.array_equal, (key_out, value_out), _content(store.spec, rank, i))):
                wrong += 1  # key and value both checked
    stats = store.stats()["tiers"]["file"]
    report = {"open_s": open_s, "recovered": comm.allreduce(stats["recovered"]),
              "adopted": comm.allreduce(stats["adopted"]), "missing": comm.allreduce(missing),
              "wrong": comm.allreduce(wrong)}
    store.close()
    if comm.rank == 0:
        print(json.dumps(report), flush=True)


def run_case(writers: int, readers: int, gib: float, workdir: str) -> dict[str, Any]:
    block = 2 << 20
    blocks = max(writers, int(gib * (1 << 30)) // block)  # K and V together: 2 MiB per block
    per_rank = -(-blocks // writers)
    total_bytes = per_rank * writers * block
    # every rank's tier must hold what it may adopt
    capacity = int(total_bytes * 1.25) + (64 << 20)
    file_dir = tempfile.mkdtemp(prefix="restart-", dir=workdir)
    try:
        def launch(ranks: int, phase: str) -> subprocess.CompletedProcess:
            cmd = [MPIEXEC, "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "benchmark.workloads.restart", "--job", phase,
                   "--dir", file_dir, "--blocks", str(per_rank), "--capacity", str(capacity)]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
            if done.returncode:
                raise RuntimeError(f"{phase} job failed: {done.stderr[-2000:]}")
            return done

        launch(writers, "write")
        files = [os.path.join(file_dir, n) for n in os.listdir(file_dir) if n.endswith(".bin")]
        dropped = drop_page_cache(files)
        report = json.loads(launch(readers, "read").stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(file_dir, ignore_errors=True)
    gib_kept = per_rank * writers * block / (1 << 30)
    return {"writers": writers, "readers": readers, "blocks": per_rank * writers, "gib": round(gib_kept, 3),
            "cache_dropped": dropped, **report, "open_s_per_gib": report["open_s"] / gib_kept}


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmark.workloads.restart", description=__doc__.split("\n")[0])
    p.add_argument("--gib", type=float, default=1.0, help="file-tier data written per case (GiB)")
    p.add_argument("--cases", default="1:1,4:4,4:1,1:4", help="W:R pairs (writer ranks : restarted ranks)")
    p.add_argument("--dir", default=None, help="where the file tiers go (default: $TMPDIR)")
    p.add_argument("--save", action="store_true", help="write cascade_restart_*.json into --out")
    p.add_argument("--out", default=None, help="where --save writes (default benchmark/results)")
    p.add_argument("--job", choices=("write", "read"), help=argparse.SUPPRESS)
    p.add_argument("--blocks", type=int, help=argparse.SUPPRESS)
    p.add_argument("--capacity", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.job:
        job(args.dir, args.job, args.blocks, args.capacity)
        return
    rows = []
    for case in args.cases.split(","):
        writers, readers = (int(n) for n in case.split(":"))
        row = run_case(writers, readers, args.gib, args.dir or tempfile.gettempdir())
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.save:
        from ..results import write_results

        path = write_results("cascade", "restart", {"rows": rows},
                             config={"gib": args.gib, "model": MODEL, "block_tokens": BLOCK_TOKENS},
                             directory=args.out)
        print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
