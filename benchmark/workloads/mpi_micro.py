"""mpi_micro: the REMOTE tier and the directory beside raw MPI RMA, in one run.

* :func:`remote_bandwidth`: rank 0 reads a block held in rank 1's window with
  ``RemoteTier.read_into`` and, alternating with it, the same number of bytes with raw
  mpi4py ``Get`` + ``Flush`` from a raw ``Win.Allocate`` window (``Lock_all`` held), for
  64 KiB .. 64 MiB. Median GB/s of the repeats (warm-up excluded) and the ratio.
* :func:`directory_latency`: ``lookup`` latency of ids owned by another rank (p50, p90,
  p99, max), alternating with one raw ``Fetch_and_op`` + ``Flush`` round trip to the same
  rank; ``insert_if_absent`` latency; batched ``lookup_many`` ids/s per rank with every
  rank looking up at once (mixed owners).

Both are collective and return the same plain (JSON-able) dict on every rank. Idle ranks
wait without spinning (``Ibarrier`` + sleep), so the measuring rank keeps a core.

Run: ``mpiexec -n 2 python -m mpi4py -m benchmark.workloads.mpi_micro [--save]``
(prints the JSON on rank 0; ``--save`` also writes ``benchmark/results/``).
"""
from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

import numpy as np

from cascade.distributed import DirectoryEntry, ShardedDirectory
from cascade.distributed.window_chunks import node_ids
from cascade.distributed.remote_tier import RemoteTier

from ..timing import gbps, summarize

SIZES = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
CHUNK = 16 << 20
NS = "bench/mpi_micro"


def _idle(comm) -> None:
    """Wait at a barrier without burning the core the measuring rank needs."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(1e-3)


def _repeats(nbytes: int) -> int:
    return max(10, min(200, (512 << 20) // nbytes))


def remote_bandwidth(comm, sizes: list[int] = SIZES) -> dict[str, Any]:
    """Collective. RemoteTier ``read_into`` vs raw ``Get`` GB/s, rank 0 reading from rank 1."""
    from mpi4py import MPI

    if comm.Get_size() < 2:
        return {"skipped": "needs 2 ranks: the REMOTE tier reads other ranks' memory"}
    top = max(sizes)
    rows = []
    with RemoteTier(comm, -(-top // CHUNK) * CHUNK + CHUNK, chunk_bytes=CHUNK) as tier:
        raw = MPI.Win.Allocate(top, 1, comm=comm)
        raw.Lock_all()
        try:
            for size in sizes:
                comm.Barrier()
                if comm.Get_rank() != 0:
                    _idle(comm)
                    continue
                data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
                key = (NS, f"{size:032x}")
                tier.put(key, [data])
                target = tier.location(key)[0]
                out = np.empty(size, dtype=np.uint8)
                n = _repeats(size)
                tier_s, raw_s = [], []
                for i in range(n + 2):  # two warm-up rounds, alternating tier and raw
                    t0 = time.perf_counter()
                    tier.read_into(key, out)
                    t1 = time.perf_counter()
                    raw.Get([out, MPI.BYTE], target, (0, size, MPI.BYTE))
                    raw.Flush(target)
                    t2 = time.perf_counter()
                    if i >= 2:
                        tier_s.append(t1 - t0)
                        raw_s.append(t2 - t1)
                tier.read_into(key, out)
                assert np.array_equal(out, data), "REMOTE tier returned wrong bytes"
                del tier[key]
                row = {"bytes": size, "repeats": n, "target_rank": target,
                       "tier_gbps": gbps(size, summarize(tier_s)["median"]),
                       "raw_get_gbps": gbps(size, summarize(raw_s)["median"]),
                       "tier_s": summarize(tier_s), "raw_s": summarize(raw_s)}
                row["ratio"] = row["tier_gbps"] / row["raw_get_gbps"]
                rows.append(row)
                _idle(comm)
        finally:
            raw.Unlock_all()
            raw.Free()
    return comm.bcast({"reader_rank": 0, "rows": rows}, root=0)


def directory_latency(comm, *, ids_per_rank: int = 20_000, lookups: int = 5_000,
                      batch: int = 4_096, batches: int = 20) -> dict[str, Any]:
    """Collective. Directory lookup / insert latency and batched throughput, with one
    raw ``Fetch_and_op`` + ``Flush`` round trip as the yardstick."""
    from mpi4py import MPI

    rank, size = comm.Get_rank(), comm.Get_size()
    rng = random.Random(rank)
    ids = [rng.randbytes(16).hex() for _ in range(ids_per_rank)]
    result: dict[str, Any] = {}
    with ShardedDirectory(comm, slots_per_rank=4 * ids_per_rank) as directory:
        insert_s = []
        for k, block_id in enumerate(ids):
            t0 = time.perf_counter()
            directory.insert_if_absent(NS, block_id, DirectoryEntry(1, rank, k, 1 << 20))
            insert_s.append(time.perf_counter() - t0)
        everything = [b for part in comm.allgather(ids) for b in part]
        target = 1 % size
        remote = [b for b in everything if directory.owner(b) == target][:lookups]

        counter = MPI.Win.Allocate(8, 8, comm=comm)
        counter.Lock_all()
        comm.Barrier()
        if rank == 0:
            one, got = np.ones(1, np.uint64), np.zeros(1, np.uint64)
            lookup_s, fop_s = [], []
            for i, block_id in enumerate(remote):
                t0 = time.perf_counter()
                entry = directory.lookup(NS, block_id)
                t1 = time.perf_counter()
                counter.Fetch_and_op(one, got, target, 0, MPI.SUM)
                counter.Flush(target)
                t2 = time.perf_counter()
                assert entry is not None
                if i >= 100:  # warm-up
                    lookup_s.append(t1 - t0)
                    fop_s.append(t2 - t1)
            lookup, fop = summarize(lookup_s), summarize(fop_s)
            result = {"lookup_target_rank": target, "lookup_us": _us(lookup), "raw_fetch_and_op_us": _us(fop),
                      "lookup_p50_over_raw_fetch_and_op": lookup["p50"] / fop["p50"],
                      "insert_us": _us(summarize(insert_s[100:]))}
        _idle(comm)
        counter.Unlock_all()
        counter.Free()

        keys = [(NS, b) for b in everything]
        rounds = [rng.sample(keys, min(batch, len(keys))) for _ in range(batches + 1)]
        directory.lookup_many(rounds[0])  # warm-up
        comm.Barrier()
        t0 = time.perf_counter()
        found = sum(e is not None for r in rounds[1:] for e in directory.lookup_many(r))
        rate = found / (time.perf_counter() - t0)
        assert found == sum(map(len, rounds[1:])), "lookup_many missed inserted ids"
        rates = comm.allgather(rate)
    result = comm.bcast(result, root=0)
    result["batched"] = {"batch": batch, "ranks_at_once": size, "ids_per_s_per_rank": rates,
                         "min_ids_per_s": min(rates), "median_ids_per_s": float(np.median(rates))}
    return result


def _us(summary: dict[str, float]) -> dict[str, float]:
    return {k: (v * 1e6 if k != "n" else v) for k, v in summary.items()}


def run(options: dict[str, Any], comm=None) -> dict[str, Any]:
    """Both measurements (collective). Options: ``sizes`` (bytes), ``ids_per_rank``,
    ``lookups``. ``comm`` defaults to the world: this is a benchmark driver, not library code."""
    if comm is None:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
    load_before = os.getloadavg()
    nodes = len(set(node_ids(comm)))
    result = {"ranks": comm.Get_size(), "nodes": nodes,
              "remote_bandwidth": remote_bandwidth(comm, options.get("sizes") or SIZES),
              "directory_latency": directory_latency(comm, ids_per_rank=int(options.get("ids_per_rank") or 20_000),
                                                     lookups=int(options.get("lookups") or 5_000))}
    result["remote_bandwidth"]["path"] = (
        "MPI RMA Get from rank 1's window (REMOTE tier), compared with raw MPI Get of the same bytes; "
        + ("both ranks on one node, so MPI moves the bytes through shared memory" if nodes == 1 else
           "ranks on different nodes"))
    result["loadavg_before_after"] = [load_before, os.getloadavg()]
    return result


def build_parser():
    import argparse

    p = argparse.ArgumentParser(prog="mpiexec -n 2 python -m mpi4py -m benchmark.workloads.mpi_micro",
                                description=__doc__.splitlines()[0])
    p.add_argument("--sizes", help="block sizes, e.g. 64K,16M (default 64K..64M)")
    p.add_argument("--ids-per-rank", type=int, help="directory ids inserted per rank (default 20000)")
    p.add_argument("--lookups", type=int, help="timed remote lookups (default 5000)")
    p.add_argument("--save", action="store_true", help="write benchmark/results/cascade_mpi_micro_*.json")
    p.add_argument("--out", help="results directory (implies --save)")
    return p


def main(argv: list[str]) -> None:
    from mpi4py import MPI

    from cascade.config import parse_size

    args = build_parser().parse_args(argv)
    comm = MPI.COMM_WORLD
    options = {"sizes": [parse_size(s.strip(), "--sizes") for s in args.sizes.split(",")] if args.sizes else None,
               "ids_per_rank": args.ids_per_rank, "lookups": args.lookups}
    result = run(options, comm)
    if comm.Get_rank() == 0:
        if args.save or args.out:
            from ..results import write_results
            result["results_file"] = str(write_results(
                "cascade", "mpi_micro", result, nodes=result["nodes"], ranks=result["ranks"], directory=args.out,
                config={k: v for k, v in options.items() if v is not None}))
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
