"""scaling: aggregate put / get GB/s at 1, 2 and 4 ranks, one process per rank (mpiexec).

The runner (one process) launches, per rank count R,
``mpiexec -n R python -m mpi4py -m benchmark.workloads.scaling --worker ...``; the world
then measures every selected system in turn and rank 0 hands the figures back in a JSON
file the runner reads (the runner alone writes the results file).

Weak scaling: each rank moves ``blocks`` blocks of ``block_bytes`` (default 32 x 2 MiB,
its own slice of the shared data directory), after ``warmup`` untimed blocks. Per phase
every rank starts after a barrier; aggregate GB/s = bytes moved by all ranks / wall time
of the phase (first rank's start to last rank's end), median of ``rounds`` rounds (a
fresh store for every put round).

* Cascade (``cascade``: SHM tier; ``cascade_file``: file tier) runs as one cluster-wide
  store over ``COMM_WORLD`` (``CascadeStore(..., comm=)``): ``put`` (precomputed ids, no KV hashing,
  published in the sharded directory), local ``get``, and ``cross_get``: rank r reads the
  blocks rank r+1 put (through the directory and, on one node, straight from the peer's
  /dev/shm slab or files: ``cross_get_path`` says which; no MPI transfer, so it is
  compared with aggregate memcpy, not with MPI Get).
* Every put phase ends with every system's ``flush`` (Cascade: fsync of its file tier).
* Peers run one private instance per rank (1 rank per process x R processes, the way a
  serving engine runs one LMCache per worker; HDF5 one file per rank; Redis one server per
  rank, a shard each). They have no cross-rank get: an instance only sees its own
  blocks. Mooncake is not run (:data:`WHY_NOT`).

Limits measured by the same world: aggregate memcpy (every rank copying at once; bytes / wall time) and raw
MPI ``Get`` (rank 0 from rank 1, and every rank from its neighbour at once).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import numpy as np
from tqdm import tqdm

from cascade import Config
from cascade.app.process_group import run_in_group

from ..data import BlockData, default_dir, ensure, prefault
from ..machine import memcpy_aggregate, mpi_get_limits, mpiexec_command
from ..timing import gbps
from . import common

SYSTEMS: tuple[str, ...] = ("cascade", "cascade_file", "lmcache_cpu", "lmcache_disk", "lmcache_disk_odirect",
                            "lmcache_cpu_disk", "hdf5", "hdf5_nocache", "redis", "redis_unix", "mooncake", "pdc")
WHY_NOT: dict[str, str] = {
    "mooncake": ("not run: Mooncake's scaling is many clients of one shared master, but the adapter starts a "
                 "private master per instance (in a private network namespace per process), so N processes "
                 "would be N unrelated single-client stores, not a scaled Mooncake"),
}
RANK_COUNTS = [1, 2, 4]
BLOCK_BYTES = 2 << 20
BLOCKS = 32
WARMUP = 4
ROUNDS = 3
TIMEOUT_S = 900.0
CASCADE = {"cascade": "shm", "cascade_file": "file"}


def rank_counts(ranks: int) -> list[int]:
    """1, 2, 4, ... up to ``max(4, ranks)``, ending with ``ranks`` when it is larger."""
    out, r = [], 1
    while r <= max(4, ranks):
        out.append(r)
        r *= 2
    return out + ([ranks] if ranks > out[-1] else [])


# -- the launcher (runner side, one process) ------------------------------------------------
def run(options: dict[str, Any]) -> dict[str, Any]:
    """Options: ``system``, ``rank_counts`` (default 1, 2, 4, ... up to ``max(4, ranks)``),
    ``sizes`` (one block size), ``blocks``
    (per rank), ``warmup``, ``rounds``, ``data_dir``, ``file_dir``, ``seed``."""
    systems = common.select(options.get("system") or "all", SYSTEMS)
    counts = options.get("rank_counts") or rank_counts(int(options.get("ranks") or 1))
    size = common.one_size(options, BLOCK_BYTES, "scaling")
    blocks = common.count_option(options, "blocks", BLOCKS)
    warmup = common.count_option(options, "warmup", WARMUP, least=0)
    rounds = common.count_option(options, "rounds", ROUNDS)
    seed = int(options.get("seed") or 0)
    file_dir = options.get("file_dir") or Config().file_dir
    data_dir = str(ensure(options.get("data_dir") or default_dir(), [size], max(counts) * (blocks + warmup), seed=seed))
    runnable = [s for s in systems if s not in WHY_NOT]
    rows: list[dict[str, Any]] = []
    problems = [{"system": s, "status": "not_run", "reason": WHY_NOT[s]} for s in systems if s in WHY_NOT]
    limits: dict[str, Any] = {}
    launches = []
    for ranks in tqdm(counts, desc="scaling", unit="launch"):
        with tempfile.TemporaryDirectory(prefix="scaling_") as tmp:
            out = os.path.join(tmp, "world.json")
            cmd = mpiexec_command(ranks, "benchmark.workloads.scaling", "--worker", "--out", out,
                                  "--systems", ",".join(runnable), "--block-bytes", str(size), "--blocks", str(blocks),
                                  "--warmup", str(warmup), "--rounds", str(rounds), "--data-dir", data_dir,
                                  "--file-dir", file_dir)
            t0 = time.perf_counter()
            proc = run_in_group(cmd, timeout=TIMEOUT_S, capture_output=True, text=True)  # a hung job: every rank ends
            if proc is None:
                launches.append({"ranks": ranks, "command": cmd, "returncode": None,
                                 "seconds": time.perf_counter() - t0, "stderr_tail": ""})
                problems.append({"system": ",".join(runnable), "ranks": ranks, "status": "failed",
                                 "reason": f"mpiexec ran past {TIMEOUT_S} s and was ended with its ranks"})
                continue
            launches.append({"ranks": ranks, "command": cmd, "returncode": proc.returncode,
                             "seconds": time.perf_counter() - t0, "stderr_tail": proc.stderr[-2000:]})
            if proc.returncode != 0 or not os.path.exists(out):
                problems.append({"system": ",".join(runnable), "ranks": ranks, "status": "failed",
                                 "reason": f"mpiexec exited {proc.returncode}: {proc.stderr[-800:]}"})
                continue
            world = json.loads(open(out).read())
        limits[str(ranks)] = world["limits"]
        rows.extend(world["rows"])
        problems.extend(world["problems"])
    _ratios(rows, limits)
    with BlockData(data_dir) as data:
        data_info = data.describe()
    return {"schema": "cascade-bench/scaling/1", "systems": systems, "rank_counts": counts, "block_bytes": size,
            "blocks_per_rank": blocks, "warmup_blocks": warmup, "rounds": rounds, "data": data_info,
            "file_dir": file_dir, "limits": limits, "rows": rows, "not_run": problems, "launches": launches}


def _ratios(rows: list[dict[str, Any]], limits: dict[str, Any]) -> None:
    for row in rows:
        lim = limits.get(str(row["ranks"]), {})
        mem = lim.get("memcpy_aggregate_gbps")
        mpi = lim.get("mpi_get_aggregate_gbps")
        row["vs_limit"] = {f"{m}_vs_memcpy_aggregate": row[m] / mem for m in ("put_gbps", "get_gbps") if mem and row.get(m)}
        if row.get("cross_get_gbps"):
            # A cross-rank get on one node reads the peer's slab or files directly: its
            # yardstick is memcpy, not MPI Get. Only multi-node rows go through MPI.
            if row.get("nodes", 1) > 1 and mpi:
                row["vs_limit"]["cross_get_gbps_vs_mpi_get_aggregate"] = row["cross_get_gbps"] / mpi
            elif mem:
                row["vs_limit"]["cross_get_gbps_vs_memcpy_aggregate"] = row["cross_get_gbps"] / mem
        one = common.find(rows, system=row["system"], ranks=1)
        row["speedup_vs_1_rank"] = {m: row[m] / one[m] for m in ("put_gbps", "get_gbps") if one and one.get(m)}
    for metric in ("put_gbps", "get_gbps"):
        buckets: dict[int, list[dict[str, Any]]] = {}
        for row in rows:
            buckets.setdefault(row["ranks"], []).append(row)
        for bucket in buckets.values():
            for row in bucket:
                vs = row.setdefault("vs_systems", {})
                for other in bucket:
                    if other is not row and other.get(metric):
                        vs.setdefault(other["system"], {})[metric] = row[metric] / other[metric]


def table(result: dict[str, Any]) -> str:
    lines = [f"weak scaling: {result['blocks_per_rank']} x {common.size_label(result['block_bytes'])} blocks per rank"]
    for ranks, lim in result["limits"].items():
        lines.append(f"limits @ {ranks} rank(s): memcpy aggregate {lim['memcpy_aggregate_gbps']:.2f} GB/s"
                     + (f", raw MPI Get pair {lim['mpi_get_pair_gbps']:.2f} / aggregate {lim['mpi_get_aggregate_gbps']:.2f} GB/s"
                        if lim.get("mpi_get_pair_gbps") else ""))
    lines.append(f"{'system':<17} {'ranks':>5} {'put GB/s':>9} {'get GB/s':>9} {'xget GB/s':>9} {'put x1':>7} {'get x1':>7}")
    for r in result["rows"]:
        x = r.get("cross_get_gbps")
        sp = r.get("speedup_vs_1_rank", {})
        lines.append(f"{r['system']:<17} {r['ranks']:>5} {r['put_gbps']:>9.2f} {r['get_gbps']:>9.2f} "
                     f"{'-' if x is None else f'{x:.2f}':>9} {sp.get('put_gbps', float('nan')):>7.2f} "
                     f"{sp.get('get_gbps', float('nan')):>7.2f}")
    for p in result["not_run"]:
        lines.append(f"{p['system']:<17} {p.get('ranks', ''):>5} {p['status']}: {p['reason'][:160]}")
    return "\n".join(lines)


# -- the world (mpiexec side) -----------------------------------------------------------------
def _barrier(comm) -> None:
    """A barrier that sleeps while waiting (ranks may outnumber cores)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(1e-4)


def _timed(comm, fn) -> tuple[float, float]:
    """Run ``fn`` on every rank between two barriers; (this rank's seconds, wall seconds
    of the phase: first start to last finish, on the node's monotonic clock)."""
    from mpi4py import MPI

    _barrier(comm)
    t0 = time.perf_counter()
    fn()
    t1 = time.perf_counter()
    _barrier(comm)
    # perf_counter is CLOCK_MONOTONIC, one clock for the ranks of a node; across nodes
    # fall back to the slowest rank's own time.
    if comm.allreduce(len(set(comm.allgather(os.uname().nodename))), op=MPI.MAX) == 1:
        return t1 - t0, comm.allreduce(t1, op=MPI.MAX) - comm.allreduce(t0, op=MPI.MIN)
    return t1 - t0, comm.allreduce(t1 - t0, op=MPI.MAX)


class _Store:
    """Cascade's cluster store or a peer adapter behind put/get_into/clear/close."""

    def __init__(self, name: str, comm, capacity: int, file_dir: str, half: int) -> None:
        self.name = name
        self.comm = comm
        self.cross = name in CASCADE
        self._ctx = None
        if self.cross:
            from cascade import CascadeStore
            from cascade.models import BlockSpec

            tier = CASCADE[name]
            cfg = Config(shm_bytes=capacity if tier == "shm" else 0, file_bytes=capacity if tier == "file" else 0,
                         remote_bytes=0, file_dir=file_dir, file_odirect=True)
            self.store = CascadeStore(cfg, block_spec=BlockSpec.flat(2 * half), comm=comm)
            self.versions = {"cascade": __import__("cascade").__version__}
        else:
            self._ctx = common.started(name, capacity, file_dir)
            self.store = self._ctx.__enter__()
            self.versions = self.store.versions()

    def put(self, b) -> None:
        if self.cross:
            # the id is precomputed (as the adapter does and as an engine passes token-prefix ids)
            self.store.put(b.key, b.value, block_id=b.id, verify=False, namespace="bench")
        else:
            self.store.put(b.id, b.key, b.value)

    def get_into(self, b, outs) -> bool:
        if self.cross:
            return self.store.get_into(b.id, *outs, namespace="bench")
        return self.store.get_into(b.id, *outs)

    def flush(self) -> None:
        """Every system's durable step (Cascade: fsync of its file tier; local)."""
        self.store.flush()

    def close(self) -> None:
        if self.cross:
            self.store.close()
        elif self._ctx is not None:
            self._ctx.__exit__(None, None, None)


def _open(comm, name: str, capacity: int, file_dir: str, half: int) -> tuple[_Store | None, str]:
    """Collective: every rank starts its store; (store, "") or (None, first rank's error)."""
    error = ""
    try:
        store = _Store(name, comm, capacity, file_dir, half)
    except Exception as exc:  # AdapterUnavailable included: every rank learns it below
        store, error = None, f"{type(exc).__name__}: {exc}"
    errors = comm.allgather(error)
    if any(errors):
        if store is not None:
            store.close()
        return None, next(e for e in errors if e)
    return store, ""


def _measure(comm, name: str, mine, warm, theirs, args, shared_dir: str) -> dict[str, Any]:
    """Collective. Put rounds each on a fresh store (no reliance on ``clear``), then local
    and (Cascade) cross-rank get rounds on the last one."""
    from mpi4py import MPI

    rank, size = comm.Get_rank(), comm.Get_size()
    half = args.block_bytes // 2
    capacity = 2 * (args.blocks + args.warmup) * args.block_bytes  # per rank, the same for every system
    outs = common.aligned_pair(half)
    nbytes = len(mine) * args.block_bytes * size
    put_s, get_s, xget_s, misses = [], [], [], 0
    store = None
    try:
        for r in range(args.rounds):
            if store is not None:
                _barrier(comm)
                store.close()
            file_dir = os.path.join(shared_dir, f"round{r}") if name in CASCADE else \
                os.path.join(shared_dir, f"round{r}_rank{rank:03d}")
            store, error = _open(comm, name, capacity, file_dir, half)
            if store is None:
                kind = "skipped" if "Unavailable" in error else "failed"
                return {"problem": {"system": name, "ranks": size, "status": kind, "reason": error}}
            for b in warm:
                store.put(b)
            store.flush()
            _, slow = _timed(comm, lambda: ([store.put(b) for b in mine], store.flush()))
            put_s.append(slow)
        for b in warm:
            store.get_into(b, outs)
        for _ in range(args.rounds):
            hit: list[bool] = []
            _, slow = _timed(comm, lambda: hit.extend(store.get_into(b, outs) for b in mine))
            misses += hit.count(False)
            get_s.append(slow)
        if store.cross and size > 1:
            for _ in range(args.rounds):
                hit = []
                _, slow = _timed(comm, lambda: hit.extend(store.get_into(b, outs) for b in theirs))
                misses += hit.count(False)
                xget_s.append(slow)
            b = theirs[-1]
            ok = store.get_into(b, outs) and np.array_equal(outs[0], b.key) and np.array_equal(outs[1], b.value)
            if not comm.allreduce(ok, op=MPI.LAND):
                raise RuntimeError("a cross-rank get returned wrong bytes")
        versions = store.versions
    finally:
        if store is not None:
            _barrier(comm)
            store.close()
    misses = comm.allreduce(misses, op=MPI.SUM)
    from cascade.distributed.window_chunks import node_ids

    hosts = len(set(comm.allgather(os.uname().nodename)))
    nodes = len(set(node_ids(comm)))  # MPI's node split, which the store's read paths follow
    row = {"system": name, "ranks": size, "nodes": nodes, "hosts": hosts, "block_bytes": args.block_bytes, "blocks_per_rank": len(mine),
           "capacity_bytes_per_rank": capacity,
           "put_gbps": gbps(nbytes, float(np.median(put_s))), "get_gbps": gbps(nbytes, float(np.median(get_s))),
           "cross_get_gbps": gbps(nbytes, float(np.median(xget_s))) if xget_s else None,
           "samples": {"put_round_s": put_s, "get_round_s": get_s, "cross_get_round_s": xget_s},
           "misses": misses, "versions": versions, "fresh_instance_per_put_round": True,
           "mode": "one cluster-wide store" if name in CASCADE else "one private instance per rank"}
    if name not in CASCADE:
        row["cross_get_note"] = "no cross-rank get: each rank's instance is private"
    elif xget_s:
        row["cross_get_path"] = _cross_path(name, nodes) + (
            f" ({nodes} nodes emulated on one host by MPICH's MPIR_CVAR_NUM_CLIQUES)" if nodes > hosts else "")
    return {"row": row}


def _cross_path(name: str, nodes: int) -> str:
    """How a get of a block another rank put reaches the bytes."""
    if nodes > 1:
        return ("mixed: peers on this node through shared memory/files, other nodes through MPI "
                "(SHM slab or REMOTE windows; file records when file_dir is shared)")
    if CASCADE[name] == "shm":
        return "node-shared /dev/shm slab (one node: a memcpy from the peer's slab, no MPI transfer)"
    return "the peer's aggregated files on the shared file system (one node; no MPI transfer)"


def worker(argv: list[str]) -> None:
    """Entry point of every rank (collective over ``COMM_WORLD``)."""
    from mpi4py import MPI

    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true")
    p.add_argument("--out", required=True)
    p.add_argument("--systems", required=True)
    p.add_argument("--block-bytes", type=int, required=True)
    p.add_argument("--blocks", type=int, required=True)
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--file-dir", required=True)
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    per = args.blocks + args.warmup
    base = None
    if rank == 0:
        os.makedirs(args.file_dir, exist_ok=True)
        base = tempfile.mkdtemp(prefix=f"scaling_{size}r_", dir=args.file_dir)
    base = comm.bcast(base, root=0)
    limits: dict[str, Any] = {"memcpy_aggregate_gbps": memcpy_aggregate(comm, args.block_bytes)["aggregate_gbps"]}
    if size > 1:
        mpi = mpi_get_limits(comm, [args.block_bytes])["rows"][0]
        limits.update(mpi_get_pair_gbps=mpi["pair_gbps"], mpi_get_aggregate_gbps=mpi["aggregate_gbps"])
    rows, problems = [], []
    with BlockData(args.data_dir) as data:
        all_blocks = data.blocks(args.block_bytes, size * per)
        prefault(all_blocks)
        mine_all = all_blocks[rank * per:(rank + 1) * per]
        nxt = (rank + 1) % size
        theirs = all_blocks[nxt * per + args.warmup:(nxt + 1) * per]
        for name in args.systems.split(","):
            shared = os.path.join(base, name)
            if rank == 0:
                os.makedirs(shared, exist_ok=True)
            _barrier(comm)
            got = _measure(comm, name, mine_all[args.warmup:], mine_all[:args.warmup], theirs, args, shared)
            (rows.append(got["row"]) if "row" in got else problems.append(got["problem"]))
    _barrier(comm)
    if rank == 0:
        shutil.rmtree(base, ignore_errors=True)
        with open(args.out, "w") as f:
            json.dump({"limits": limits, "rows": rows, "problems": problems}, f)


if __name__ == "__main__":
    worker(sys.argv[1:])
