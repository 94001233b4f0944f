"""Multi-rank jobs for the fault campaign: ``python -m mpi4py -m benchmark.fault_rank_job DIR PHASE``.

PHASE ``open_fail``: the last rank's file-tier lock is held by another tier of its own
process, so its part of the collective open fails; every rank records how the open
ended, then the same job opens the store for real and checks a put and get on each rank.
Rank 0 prints ``{"raised": N, "named": N, "reopened": N, "wrong": N}`` (ranks whose open
raised, ranks whose error named the failing rank or cause, ranks that reopened, wrong
bytes read after reopening).

PHASE ``close_death``: every rank puts blocks into the file tier (the ids are saved as
``cascade.testing.rank_failure_job`` saves them, so its ``read`` phase checks them after a
restart), then rank 2 SIGKILLs itself just before ``close()`` while the others close:
the job must end promptly with an error.
"""
from __future__ import annotations

import json
import os
import signal
import sys

from cascade import CascadeError, CascadeStore, Config, RankFailure
from cascade.testing.rank_blocks import content
from cascade.testing.rank_failure_job import BLOCKS_PER_RANK
from cascade.tiers.file_tier import FileTier


def _config(file_dir: str) -> Config:  # the same as cascade.testing.rank_failure_job's
    return Config(model="tiny", shm_bytes=0, remote_bytes=0, file_bytes=64 << 20, file_dir=file_dir,
                  directory_slots=4096)


def open_fail(comm, file_dir: str) -> None:
    culprit = comm.size - 1
    squatter = FileTier(1 << 20, file_dir, rank=culprit) if comm.rank == culprit else None
    raised = named = False
    try:
        CascadeStore(_config(file_dir), comm=comm).close()
    except CascadeError as exc:
        raised = True
        named = ("held by another process" in str(exc)) if comm.rank == culprit else (
            isinstance(exc, RankFailure) and f"[{culprit}]" in str(exc))
    finally:
        if squatter is not None:
            squatter.close()
    with CascadeStore(_config(file_dir), comm=comm) as store:
        kv = content(store.spec, comm.rank, 0)
        got = store.get(store.put(*kv))
        wrong = got is None or not all((a == b).all() for a, b in zip(got, kv))
    report = {"raised": comm.allreduce(int(raised)), "named": comm.allreduce(int(named)),
              "reopened": comm.allreduce(1), "wrong": comm.allreduce(int(wrong))}
    if comm.rank == 0:
        print(json.dumps(report), flush=True)


def close_death(comm, file_dir: str) -> None:
    store = CascadeStore(_config(file_dir), comm=comm)
    ids = [store.put(*content(store.spec, comm.rank, i)) for i in range(BLOCKS_PER_RANK)]
    store.flush()
    everyone = comm.gather(ids)
    if comm.rank == 0:
        with open(os.path.join(file_dir, "ids.json"), "w") as f:
            json.dump(everyone, f)
    comm.Barrier()
    if comm.rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)  # dies without a word to MPI, just before close
    store.close()


def main(file_dir: str, phase: str) -> None:
    from mpi4py import MPI

    {"open_fail": open_fail, "close_death": close_death}[phase](MPI.COMM_WORLD, file_dir)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
