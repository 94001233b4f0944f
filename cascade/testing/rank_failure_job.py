"""A 4-rank job for fault tests: ``python -m mpi4py -m cascade.testing.rank_failure_job DIR PHASE``.

PHASE ``write``: every rank puts 20 blocks into the file tier under DIR, rank 0 saves the
ids, then rank 2 SIGKILLs itself while the others keep using the directory (the job must
end promptly with an error). PHASE ``read``: a fresh job warm-starts from DIR and reads
every saved block from whichever rank holds it; rank 0 prints
``{"recovered": N, "wrong": N, "missing": N}``.
"""
from __future__ import annotations

import json
import os
import signal
import sys

from cascade import CascadeStore, Config
from cascade.testing.rank_blocks import content, count_wrong_and_missing

BLOCKS_PER_RANK = 20


def main(file_dir: str, phase: str) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD  # a program, not library code: its world is the job
    cfg = Config(model="tiny", shm_bytes=0, remote_bytes=0, file_bytes=64 << 20, file_dir=file_dir,
                 directory_slots=4096)
    store = CascadeStore(cfg, comm=comm)
    ids_path = os.path.join(file_dir, "ids.json")
    if phase == "write":
        ids = [store.put(*content(store.spec, comm.rank, i)) for i in range(BLOCKS_PER_RANK)]
        everyone = comm.gather(ids)
        if comm.rank == 0:
            with open(ids_path, "w") as f:
                json.dump(everyone, f)
        comm.Barrier()
        if comm.rank == 2:
            os.kill(os.getpid(), signal.SIGKILL)  # dies without a word to MPI
        while True:  # the others keep working against rank 2's directory shard
            for bid in ids:
                store.contains(bid)
            comm.Barrier()
    with open(ids_path) as f:
        everyone = json.load(f)
    wrong, missing = count_wrong_and_missing(store, everyone)
    report = {"recovered": comm.allreduce(store.stats()["tiers"]["file"]["recovered"]),
              "wrong": comm.allreduce(wrong), "missing": comm.allreduce(missing)}
    store.close()
    if comm.rank == 0:
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
