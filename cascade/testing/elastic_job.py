"""A job for elastic-restart tests: ``python -m mpi4py -m cascade.testing.elastic_job DIR PHASE [MODEL]``.

PHASE ``write``: every rank puts :data:`BLOCKS_PER_RANK` blocks into a small SHM tier, its
peers' DRAM (REMOTE) and the file tier under DIR, rank 0 saves the ids, then the store
closes (keeping what it can in the file tier). PHASE ``read``: a job of any size
warm-starts from DIR and every rank reads every saved block; rank 0 prints one JSON line
``{"ranks", "blocks", "recovered", "adopted", "wrong", "missing", "open_s", "file_bytes"}``.
A ``read`` whose MODEL differs from the writer's prints ``{"refused": message}`` (every
rank refuses) and exits 3.
"""
from __future__ import annotations

import json
import os
import sys
import time

from cascade import CascadeStore, Config, ConfigError, RankFailure
from cascade.testing.rank_blocks import content, count_wrong_and_missing

BLOCKS_PER_RANK = 40


def config(file_dir: str, model: str) -> Config:
    # 8 blocks of SHM and 8 of lent DRAM per rank: most blocks end in the file tier, and
    # some sit in other ranks' DRAM when the writer closes
    return Config(model=model, shm_bytes=8 * 4096, remote_bytes=8 * 4096, file_bytes=64 << 20,
                  file_dir=file_dir, directory_slots=4096)


def main(file_dir: str, phase: str, model: str = "tiny") -> int:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD  # a program, not library code: its world is the job
    ids_path = os.path.join(file_dir, "ids.json")
    started = time.perf_counter()
    try:
        store = CascadeStore(config(file_dir, model), comm=comm)
    except (ConfigError, RankFailure) as exc:
        if comm.rank == 0:
            print(json.dumps({"refused": str(exc)}), flush=True)
        return 3
    open_s = comm.allreduce(time.perf_counter() - started, op=MPI.MAX)
    if phase == "write":
        ids = [store.put(*content(store.spec, comm.rank, i)) for i in range(BLOCKS_PER_RANK)]
        everyone = comm.gather(ids)
        if comm.rank == 0:
            with open(ids_path, "w") as f:
                json.dump(everyone, f)
        store.close()
        return 0
    with open(ids_path) as f:
        everyone = json.load(f)
    wrong, missing = count_wrong_and_missing(store, everyone)
    file_stats = store.stats()["tiers"]["file"]
    report = {"ranks": comm.size, "blocks": sum(len(ids) for ids in everyone),
              "recovered": comm.allreduce(file_stats["recovered"]), "adopted": comm.allreduce(file_stats["adopted"]),
              "wrong": comm.allreduce(wrong), "missing": comm.allreduce(missing), "open_s": round(open_s, 4),
              "file_bytes": comm.allreduce(file_stats["bytes"])}
    store.close()
    if comm.rank == 0:
        print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
