"""stress_mpi: many ranks put, pin, delete and read each other's blocks; every byte of
every cross-rank hit is compared with what was put.

Three phases, each a fresh :class:`~cascade.CascadeStore` over ``comm``:

* ``pins_shm_full``: each rank pins its own blocks until its SHM tier is full of pinned
  blocks, so later puts land in the REMOTE tier (other ranks' windows) or the file tier;
* ``shm0``: ``shm_bytes=0``: every put enters the REMOTE tier directly;
* ``no_file``: SHM + REMOTE only, small: blocks are dropped all the time.

In each phase every rank mixes puts (its own seeds and seeds every rank puts: dedup),
gets of any rank's seeds, pin/get/unpin of other ranks' blocks and deletes, until it has
``hits_per_rank`` cross-rank hits (or ran ten times as many operations, or ``seconds``
ran out). A hit served by another
rank (``cluster_hits`` rose) is compared byte for byte with the block derived from its
seed: ``wrong_bytes`` counts differing bytes, ``checksum_mismatches`` the cross-rank
reads the published checksum turned into misses (plus local tiers' corruptions).

Collective. Run:
``mpiexec -n 4 python -m mpi4py -m benchmark.workloads.stress_mpi [--hits 30000] [--save]``
(prints the JSON on rank 0; ``--save`` writes ``benchmark/results/cascade_stress_mpi_*.json``).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from typing import Any

import numpy as np

from cascade import BlockNotFound, BlockPinned, CascadeStore, Config, TierFull, block_id

BLOCK = 4096  # the "tiny" model's block bytes
PHASES: dict[str, dict[str, Any]] = {
    "pins_shm_full": dict(shm_bytes=24 * BLOCK, remote_bytes=96 * BLOCK, file_bytes=512 * 2 * BLOCK),
    "shm0": dict(shm_bytes=0, remote_bytes=96 * BLOCK, file_bytes=512 * 2 * BLOCK),
    "no_file": dict(shm_bytes=32 * BLOCK, remote_bytes=48 * BLOCK, file_bytes=0),
}
COUNTS = ("puts", "rejected", "gets", "cross_hits", "local_hits", "misses", "verified_bytes",
          "wrong_bytes", "wrong_blocks", "checksum_mismatches", "pins", "deletes", "invariant_broken")


def _blocks(spec, seeds: range) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    out = {}
    for s in seeds:
        rng = np.random.default_rng(s)
        out[s] = (rng.standard_normal(spec.shape).astype(spec.dtype), rng.standard_normal(spec.shape).astype(spec.dtype))
    return out


def _wrong(got, want) -> int:
    """Bytes of ``got`` that differ from ``want`` (both (key, value))."""
    return sum(int(np.count_nonzero(g.view(np.uint8) != w.view(np.uint8))) for g, w in zip(got, want))


def run_phase(comm, name: str, file_dir: str, *, hits_per_rank: int, seconds: float,
              seeds_per_rank: int = 96, shared_seeds: int = 64) -> dict[str, int]:
    """One phase (collective); returns this rank's counts."""
    from mpi4py import MPI

    cfg = Config(model="tiny", file_dir=file_dir, directory_slots=1 << 14, **PHASES[name])
    store = CascadeStore(cfg, comm=comm)
    spec = store.spec
    size, rank = comm.Get_size(), comm.Get_rank()
    base = 1_000_000 * (1 + list(PHASES).index(name))
    shared = range(base, base + shared_seeds)
    own = [range(base + shared_seeds + r * seeds_per_rank, base + shared_seeds + (r + 1) * seeds_per_rank)
           for r in range(size)]
    data = _blocks(spec, range(base, own[-1].stop))
    ids = {s: block_id(*data[s]) for s in data}
    by_id = {b: s for s, b in ids.items()}
    mine = list(own[rank]) + list(shared)
    theirs = [s for r in range(size) if r != rank for s in own[r]] + list(shared)
    rng = np.random.default_rng(rank + 17 * len(name))
    c = dict.fromkeys(COUNTS, 0)
    held: list[str] = []
    counters, tier_counters = store.counters, store.tier_counters

    def snapshot() -> tuple[int, int]:  # (cross-rank hits, checksum mismatches) so far
        return counters.cluster_hits, counters.cluster_corruptions + sum(t.corruptions for t in tier_counters)
    for s in mine[:seeds_per_rank // 2]:  # a first round, so every rank has something to read
        store.put(*data[s])
        c["puts"] += 1
    comm.Barrier()
    end = time.perf_counter() + seconds
    try:
        ops = 0  # also bounded by operations (one rank alone never has a cross-rank hit)
        while c["cross_hits"] < hits_per_rank and ops < 10 * hits_per_rank and time.perf_counter() < end:
            ops += 1
            op = rng.random()
            if op < 0.2:
                s = int(rng.choice(mine))
                try:
                    store.put(*data[s])
                except TierFull:
                    c["rejected"] += 1
                c["puts"] += 1
                if name == "pins_shm_full" and len(held) < 24 and not rng.integers(0, 4):
                    try:
                        store.pin(ids[s])  # SHM fills up with pinned blocks: puts go further down
                        held.append(ids[s])
                        c["pins"] += 1
                    except BlockNotFound:
                        pass
            elif op < 0.23:
                s = int(rng.choice(mine))
                try:
                    store.delete(ids[s])
                    c["deletes"] += 1
                except (BlockNotFound, BlockPinned):
                    pass
            else:
                s = int(rng.choice(theirs))
                pinned = op > 0.95
                if pinned:
                    try:
                        store.pin(ids[s])
                    except BlockNotFound:
                        pinned = False
                before = snapshot()
                got = store.get(ids[s])
                after = snapshot()
                if pinned:
                    store.unpin(ids[s])
                c["gets"] += 1
                c["checksum_mismatches"] += after[1] - before[1]
                if got is None:
                    c["misses"] += 1
                    continue
                if after[0] > before[0]:
                    c["cross_hits"] += 1
                    c["verified_bytes"] += spec.block_bytes
                    wrong = _wrong(got, data[by_id[ids[s]]])
                    c["wrong_bytes"] += wrong
                    c["wrong_blocks"] += wrong > 0
                else:
                    c["local_hits"] += 1
                    c["wrong_blocks"] += _wrong(got, data[s]) > 0
        for bid in held:
            store.unpin(bid)
        final = store.stats()
        c["invariant_broken"] = int(final["puts"] != final["stored"] + final["deduped"] + final["rejected"])
        comm.Barrier()
    finally:
        store.close(keep=False)
    return {k: int(comm.allreduce(v, op=MPI.SUM)) for k, v in c.items()}


def run(comm, *, hits: int, seconds: float, phases: list[str] | None = None) -> dict[str, Any]:
    """All phases (collective): ``hits`` cross-rank hits in all, spread over the phases
    and ranks. Returns the totals per phase and overall."""
    phases = phases or list(PHASES)
    per_rank = -(-hits // (len(phases) * comm.Get_size()))
    out: dict[str, Any] = {"phases": {}}
    for name in phases:
        tmp = comm.bcast(tempfile.mkdtemp(prefix="cascade-stress-") if comm.Get_rank() == 0 else None)
        try:
            t0 = time.perf_counter()
            out["phases"][name] = {**run_phase(comm, name, tmp, hits_per_rank=per_rank, seconds=seconds),
                                   "seconds": round(time.perf_counter() - t0, 2), "config": PHASES[name]}
        finally:
            comm.Barrier()
            if comm.Get_rank() == 0:
                shutil.rmtree(tmp, ignore_errors=True)
    out["total"] = {k: sum(p[k] for p in out["phases"].values()) for k in COUNTS}
    return out


def main(argv: list[str]) -> None:
    from mpi4py import MPI

    from cascade.distributed.window_chunks import node_ids

    p = argparse.ArgumentParser(prog="stress_mpi", description=__doc__.split("\n\n")[0])
    p.add_argument("--hits", type=int, default=120_000, help="cross-rank hits to verify, in all (default 120000)")
    p.add_argument("--seconds", type=float, default=600.0, help="time cap per phase (default 600)")
    p.add_argument("--save", action="store_true", help="write benchmark/results/cascade_stress_mpi_*.json")
    p.add_argument("--out", help="results directory (implies --save)")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    nodes = len(set(node_ids(comm)))
    result = run(comm, hits=args.hits, seconds=args.seconds)
    if comm.Get_rank() == 0:
        result["ranks"], result["emulated_nodes"] = comm.Get_size(), nodes
        if args.save or args.out:
            from ..results import write_results
            result["results_file"] = str(write_results("cascade", "stress_mpi", result, nodes=nodes,
                                                       ranks=comm.Get_size(), config={"phases": PHASES},
                                                       directory=args.out))
        print(json.dumps(result["total"] | {"results_file": result.get("results_file")}, indent=1))
    total = comm.bcast(result["total"] if comm.Get_rank() == 0 else None)
    if total["wrong_bytes"] or total["wrong_blocks"] or total["invariant_broken"]:
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
