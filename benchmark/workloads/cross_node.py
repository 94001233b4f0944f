"""cross_node: one cache across (emulated) nodes, beside raw MPI between the same ranks.

Run it with the ranks split into nodes, e.g. two emulated nodes on one machine:
``MPIR_CVAR_NUM_CLIQUES=2 mpiexec -n 4 python -m mpi4py -m benchmark.workloads.cross_node --save``
(the result records the node split MPI reported, so a run that was not split says so).
Every figure is a same-run ratio; rank 0 reads, the last rank (on the other node when
there are two) holds. Collective throughout.

* ``get``: ``CascadeStore.get_into`` of blocks held in the holder's SHM tier (the slab
  window path when the holder is on another node, the holder's /dev/shm file on one
  node) vs raw ``Get`` + ``Flush_local`` of as many bytes from a ``Win.Allocate`` window
  on the holder (as many distinct blocks, so neither reads cache-hot), alternating.
  Median GB/s.
* ``lookup``: directory ``lookup`` of ids whose shard is on the holder vs one raw
  ``Fetch_and_op`` + ``Flush`` to it and one raw ``Get`` of one directory bucket
  (656 bytes), alternating; p50/p99.
* ``busy_owner``: the holder (also the directory owner of its blocks) computes for 1 s in
  pure Python while the reader does ``contains`` + ``get`` of its blocks; latency
  p50/p99/max; with 2 MiB and again with 128 KiB blocks.
* ``busy_owner_atomics``: the same busy holder, while the reader does what takes atomics
  on its directory shard: ``publish`` (``insert_if_absent`` of a fresh id, as a put's
  publish does: 5 round trips, all CAS/Fetch_and_op or Accumulate) and ``pin_unpin``
  (``store.pin`` + ``store.unpin`` of a block it holds); latency p50/p90/p99/max of each.
  Again as ``busy_owner_atomics_progress_thread`` with a
  :class:`~cascade.distributed.progress_thread.ProgressThread` (1 ms) on every rank, and
  ``busy_owner_atomics_progress_thread_switch_1ms`` with the same thread and the GIL's
  switch interval lowered to 1 ms, and ``..._switch_02ms`` (thread every 0.2 ms, switch
  interval 0.2 ms); ``holder_work_vs_no_thread`` is the holder's pure-Python work in its
  busy second relative to the run without a thread. Whether MPICH's own progress thread was on
  (``MPIR_CVAR_ASYNC_PROGRESS``) is recorded in ``mpich_async_progress``.
* ``round_trips``: RMA round trips (flushes, by window) per put (new block), per put of a
  block another rank holds (dedup), per cross-rank get, per miss; mean over the ops.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from typing import Any

import numpy as np

from cascade import CascadeStore, Config
from cascade.distributed.directory import DirectoryEntry, ShardedDirectory
from cascade.distributed.progress_thread import ProgressThread
from cascade.distributed.rma import RoundTrips
from cascade.distributed.window_chunks import node_ids
from cascade.identity import id_owner

from ..timing import gbps, summarize

MODEL = "llama3-8b"  # 2 MiB blocks at 16 tokens


def _idle(comm) -> None:
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(1e-3)


def _block(spec, seed: int):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(spec.shape).astype(spec.dtype),
            rng.standard_normal(spec.shape).astype(spec.dtype))


def _us(s: dict[str, float]) -> dict[str, float]:
    return {k: (v * 1e6 if k != "n" else v) for k, v in s.items()}


def _store(comm, tmp: str, blocks: int, block_tokens: int = 16) -> CascadeStore:
    spec_bytes = 2 * block_tokens * 32 * 8 * 128 * 2
    return CascadeStore(Config(model=MODEL, block_tokens=block_tokens, shm_bytes=(blocks + 4) * spec_bytes,
                               remote_bytes=0, file_bytes=0, file_dir=tmp, directory_slots=1 << 14), comm=comm)


def _holder_ids(store, comm, holder: int, n: int, seed: int, owned: bool) -> list[str]:
    """Ids of ``n`` blocks the holder puts (with ``owned``: whose directory shard is the
    holder's too), broadcast to all."""
    ids = []
    if comm.Get_rank() == holder:
        s = seed
        while len(ids) < n:
            kv = _block(store.spec, s)
            s += 1
            from cascade import block_id
            bid = block_id(*kv)
            if owned and id_owner(bid, comm.Get_size()) != holder:
                continue
            ids.append(store.put(*kv, block_id=bid))
    return comm.bcast(ids, root=holder)


def get_vs_raw(comm, store, holder: int, reader: int, n: int = 16, repeats: int = 5) -> dict[str, Any]:
    from mpi4py import MPI

    ids = _holder_ids(store, comm, holder, n, 1000, owned=False)
    nbytes = store.spec.block_bytes
    # as many distinct blocks as the store reads, so neither side reads cache-hot bytes
    raw = MPI.Win.Allocate(n * nbytes if comm.Get_rank() == holder else 0, 1, comm=comm)
    raw.Lock_all()
    comm.Barrier()
    row: dict[str, Any] = {}
    if comm.Get_rank() == reader:
        k = np.empty(store.spec.shape, store.spec.dtype)
        v = np.empty_like(k)
        flat = np.empty(nbytes, np.uint8)
        store_s, raw_s = [], []
        for r in range(repeats + 1):
            for i, bid in enumerate(ids):
                t0 = time.perf_counter()
                ok = store.get_into(bid, k, v)
                t1 = time.perf_counter()
                raw.Get([flat, MPI.BYTE], holder, (i * nbytes, nbytes, MPI.BYTE))
                raw.Flush_local(holder)
                t2 = time.perf_counter()
                assert ok, "cross-node get missed a cached block"
                if r:
                    store_s.append(t1 - t0)
                    raw_s.append(t2 - t1)
        assert np.array_equal(k, _block(store.spec, 1000 + n - 1)[0]), "wrong bytes"
        row = {"block_bytes": nbytes, "gets": len(store_s),
               "store_get_gbps": gbps(nbytes, summarize(store_s)["median"]),
               "raw_get_gbps": gbps(nbytes, summarize(raw_s)["median"]),
               "store_get_us": _us(summarize(store_s)), "raw_get_us": _us(summarize(raw_s)),
               "window_reads": store.cluster.window_reads, "same_node_reads": store.cluster.same_node_reads}
        row["ratio"] = row["store_get_gbps"] / row["raw_get_gbps"]
    _idle(comm)
    raw.Unlock_all()
    raw.Free()
    return comm.bcast(row, root=reader)


def lookup_vs_raw(comm, holder: int, reader: int, n: int = 2000) -> dict[str, Any]:
    from mpi4py import MPI

    from cascade.distributed import DirectoryEntry
    from cascade.distributed import layout as L

    rank, size = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(7)
    ids = []
    while len(ids) < n:
        bid = rng.bytes(16).hex()
        if id_owner(bid, size) == holder:
            ids.append(bid)
    row: dict[str, Any] = {}
    with ShardedDirectory(comm, slots_per_rank=4 * n) as directory:
        if rank == holder:
            for k, bid in enumerate(ids):
                directory.insert_if_absent("bench/x", bid, DirectoryEntry(1, holder, k, 1 << 20))
        raw = MPI.Win.Allocate(L.BUCKET_BYTES if rank == holder else 0, 8, comm=comm)
        raw.Lock_all()
        comm.Barrier()
        if rank == reader:
            one, got = np.ones(1, np.uint64), np.zeros(1, np.uint64)
            bucket = np.empty(L.BUCKET_WORDS, np.uint64)
            lk, fop, get = [], [], []
            for i, bid in enumerate(ids):
                t0 = time.perf_counter()
                entry = directory.lookup("bench/x", bid)
                t1 = time.perf_counter()
                raw.Fetch_and_op(one, got, holder, 0, MPI.SUM)
                raw.Flush(holder)
                t2 = time.perf_counter()
                raw.Get(bucket, holder, 0)
                raw.Flush_local(holder)
                t3 = time.perf_counter()
                assert entry is not None
                if i >= 100:
                    lk.append(t1 - t0)
                    fop.append(t2 - t1)
                    get.append(t3 - t2)
            a, b, c = summarize(lk), summarize(fop), summarize(get)
            row = {"lookup_us": _us(a), "raw_fetch_and_op_us": _us(b), "raw_bucket_get_us": _us(c),
                   "lookup_p50_over_raw_fetch_and_op": a["p50"] / b["p50"],
                   "lookup_p50_over_raw_bucket_get": a["p50"] / c["p50"],
                   "note": "the holder waits in Ibarrier+sleep (enters MPI every ms); between "
                           "emulated nodes MPICH runs Fetch_and_op as an active message served by "
                           "the target's progress, a Get is served without it"}
        _idle(comm)
        raw.Unlock_all()
        raw.Free()
    return comm.bcast(row, root=reader)


def busy_owner(comm, store, holder: int, reader: int, n: int = 16, busy_s: float = 1.0) -> dict[str, Any]:
    ids = _holder_ids(store, comm, holder, n, 5000, owned=True)
    comm.Barrier()
    row: dict[str, Any] = {}
    if comm.Get_rank() == holder:
        end = time.perf_counter() + busy_s
        while time.perf_counter() < end:  # pure Python: never enters MPI
            pass
    elif comm.Get_rank() == reader:
        k = np.empty(store.spec.shape, store.spec.dtype)
        v = np.empty_like(k)
        lat, misses = [], 0
        end = time.perf_counter() + 0.8 * busy_s
        while time.perf_counter() < end:
            for bid in ids:
                t0 = time.perf_counter()
                ok = store.contains(bid) and store.get_into(bid, k, v)
                lat.append(time.perf_counter() - t0)
                misses += not ok
        s = summarize(lat)
        row = {"busy_seconds": busy_s, "ops": len(lat), "misses": misses, "lookup_plus_get_ms":
               {q: s[q] * 1e3 for q in ("p50", "p90", "p99", "max")}, "target_p99_ms": 10.0,
               "met": s["p99"] * 1e3 <= 10.0 and misses == 0}
    comm.Barrier()
    return comm.bcast(row, root=reader)


def busy_owner_atomics(comm, store, holder: int, reader: int, n: int = 16, busy_s: float = 1.0,
                       progress: dict[str, float] | None = None) -> dict[str, Any]:
    """Directory atomics on a busy owner's shard (see the module docstring); with
    ``progress``, a :class:`ProgressThread` of those keyword arguments runs on every rank."""
    held = _holder_ids(store, comm, holder, n, 7000, owned=True)
    directory = store.cluster.directory
    rank, size = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(11 + rank)
    fresh: list[str] = []
    while rank == reader and len(fresh) < 20000:
        bid = rng.bytes(16).hex()
        if id_owner(bid, size) == holder:
            fresh.append(bid)
    thread = ProgressThread(comm, **progress).start() if progress is not None else None
    row: dict[str, Any] = {}
    try:
        if rank == reader:  # warm-up (connections), while the holder waits in the barrier
            for k in range(4):
                directory.insert_if_absent("bench/atomics", fresh.pop(), DirectoryEntry(1, reader, k, 4096))
                store.pin(held[k])
                store.unpin(held[k])
        comm.Barrier()
        spins = 0
        if rank == holder:
            end = time.perf_counter() + busy_s
            while time.perf_counter() < end:  # pure Python: never enters MPI
                spins += 1
        elif rank == reader:
            publish, pin = [], []
            time.sleep(0.05)  # the holder is computing by now (not still leaving the barrier)
            end = time.perf_counter() + 0.75 * busy_s
            k = 0
            while time.perf_counter() < end and fresh:
                t0 = time.perf_counter()
                directory.insert_if_absent("bench/atomics", fresh.pop(), DirectoryEntry(1, reader, k, 4096))
                t1 = time.perf_counter()
                store.pin(held[k % n])
                store.unpin(held[k % n])
                pin.append(time.perf_counter() - t1)
                publish.append(t1 - t0)
                k += 1
            ms = {name: {q: v * 1e3 for q, v in summarize(lat).items() if q in ("p50", "p90", "p99", "max")}
                  for name, lat in (("publish_ms", publish), ("pin_unpin_ms", pin))}
            worst = max(ms["publish_ms"]["p99"], ms["pin_unpin_ms"]["p99"])
            row = {"busy_seconds": busy_s, "ops": len(publish), **ms, "progress_thread": progress,
                   "target_p99_ms": 10.0, "met": worst <= 10.0}
        _idle(comm)  # ranks not measuring sleep: on few cores a rank spinning in Barrier steals the holder's
    finally:
        if thread is not None:
            thread.stop()
    row = comm.bcast(row, root=reader)
    # the holder's pure-Python work done meanwhile: what the progress thread costs it
    row["holder_loop_iterations"] = comm.bcast(spins, root=holder)
    return row


def round_trips(comm, store, holder: int, reader: int, n: int = 20) -> dict[str, Any]:
    """Mean RMA round trips per operation, by window, measured on the reader."""
    rank = comm.Get_rank()
    held = _holder_ids(store, comm, holder, n, 9000, owned=False)
    comm.Barrier()
    out: dict[str, Any] = {}
    if rank == reader:
        k = np.empty(store.spec.shape, store.spec.dtype)
        v = np.empty_like(k)

        def per_op(fn, items):
            before = RoundTrips.snapshot()
            for item in items:
                fn(item)
            got = RoundTrips.since(before)
            return {"by_window": {w: c / len(items) for w, c in got.items()},
                    "total": sum(got.values()) / len(items)}

        out["put_new"] = per_op(lambda s: store.put(*_block(store.spec, s)), range(20000, 20000 + n))
        out["put_dedup_onto_other_rank"] = per_op(
            lambda s: store.put(*_block(store.spec, s)), range(9000, 9000 + n))
        store.clear()
        out["get_cross_rank"] = per_op(lambda bid: store.get_into(bid, k, v), held)
        out["get_miss"] = per_op(lambda s: store.get_into(f"{s:032x}", k, v), range(n))
    comm.Barrier()
    return comm.bcast(out, root=reader)


ATOMICS_VARIANTS = (("busy_owner_atomics", None),
                    ("busy_owner_atomics_progress_thread", {"interval": 1e-3}),
                    ("busy_owner_atomics_progress_thread_switch_1ms", {"interval": 1e-3, "switch_interval": 1e-3}),
                    ("busy_owner_atomics_progress_thread_switch_02ms", {"interval": 2e-4, "switch_interval": 2e-4}))


def run(comm=None, atomics_only: bool = False) -> dict[str, Any]:
    from mpi4py import MPI

    comm = comm or MPI.COMM_WORLD
    nodes = node_ids(comm)
    size = comm.Get_size()
    reader, holder = 0, size - 1
    tmp = comm.bcast(tempfile.mkdtemp(prefix="cascade-xnode-") if comm.Get_rank() == 0 else None)
    result: dict[str, Any] = {"ranks": size, "nodes": len(set(nodes)), "node_of_rank": nodes,
                              "reader": reader, "holder": holder,
                              "reader_and_holder_on_different_nodes": nodes[reader] != nodes[holder],
                              "mpich_num_cliques": os.environ.get("MPIR_CVAR_NUM_CLIQUES"),
                              "mpich_async_progress": os.environ.get("MPIR_CVAR_ASYNC_PROGRESS")}
    store = _store(comm, tmp, 80)
    try:
        result["atomics_progress_without_target"] = store.cluster.atomics_progress
        if not atomics_only:
            result["get"] = get_vs_raw(comm, store, holder, reader)
            result["busy_owner"] = busy_owner(comm, store, holder, reader)
        for name, progress in ATOMICS_VARIANTS:
            result[name] = busy_owner_atomics(comm, store, holder, reader, progress=progress)
            result[name]["holder_work_vs_no_thread"] = (result[name]["holder_loop_iterations"]
                                                       / result[ATOMICS_VARIANTS[0][0]]["holder_loop_iterations"])
        if not atomics_only:
            result["round_trips"] = round_trips(comm, store, holder, reader)
    finally:
        store.close()
    if atomics_only:
        _remove(comm, tmp)
        return result
    # the same with 128 KiB blocks (1 token): the lookups' share of the latency, not the bytes'
    store = _store(comm, tmp, 80, block_tokens=1)
    try:
        result["busy_owner_128k_blocks"] = busy_owner(comm, store, holder, reader)
    finally:
        store.close()
    result["lookup"] = lookup_vs_raw(comm, holder, reader)
    _remove(comm, tmp)
    return result


def _remove(comm, tmp: str) -> None:
    if comm.Get_rank() == 0:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str]) -> None:
    import argparse

    from mpi4py import MPI

    p = argparse.ArgumentParser(prog="mpiexec -n 4 python -m mpi4py -m benchmark.workloads.cross_node",
                                description=__doc__.splitlines()[0])
    p.add_argument("--save", action="store_true", help="write benchmark/results/cascade_cross_node_*.json")
    p.add_argument("--out", help="results directory (implies --save)")
    p.add_argument("--atomics-only", action="store_true",
                   help="only the busy_owner_atomics* rows (printed; not saved: the suite reads full results)")
    args = p.parse_args(argv)
    if args.atomics_only and (args.save or args.out):
        p.error("--atomics-only results are not saved (the suite and paper read full results)")
    comm = MPI.COMM_WORLD
    result = run(comm, atomics_only=args.atomics_only)
    if comm.Get_rank() == 0:
        if args.save or args.out:
            from ..results import write_results
            result["results_file"] = str(write_results("cascade", "cross_node", result, nodes=result["nodes"],
                                                       ranks=result["ranks"], directory=args.out,
                                                       config={"model": MODEL}))
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
