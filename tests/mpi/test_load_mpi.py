"""Load: threads x ranks with a mixed workload of a fixed number of operations;
afterwards every acknowledged block is readable byte-exact or was dropped (each missing
one is accounted for by a counted eviction), and the stats add up to what was issued."""
from __future__ import annotations

import shutil
import tempfile
import threading

import numpy as np

from cascade import BlockNotFound, CascadeStore, Config, TierFull

THREADS = 3
OPS_PER_THREAD = 150
SEEDS = 400  # contents shared across threads and ranks: dedup and races


def content(spec, seed: int):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(spec.shape).astype(spec.dtype), rng.standard_normal(spec.shape).astype(spec.dtype)


def same(got, expected) -> bool:
    return got is not None and all(np.array_equal(a, b) for a, b in zip(got, expected))


def test_threads_times_ranks_mixed_workload(comm, everywhere):
    path = comm.bcast(tempfile.mkdtemp(prefix="cascade-load-") if comm.rank == 0 else None)
    cfg = Config(model="tiny", shm_bytes=48 * 4096, remote_bytes=48 * 4096, file_bytes=256 * 8192,
                 file_dir=path, directory_slots=1 << 12)
    store = CascadeStore(cfg, comm=comm)
    acked: dict[str, int] = {}
    issued = {"put": 0, "rejected": 0, "get": 0, "hit": 0, "pin": 0}
    wrong: list[str] = []
    pin_missed: set[str] = set()  # pinned after a drop: BlockNotFound, the one expected error
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(tid: int) -> None:
        rng = np.random.default_rng([comm.rank, tid])
        try:
            for _ in range(OPS_PER_THREAD):
                seed = int(rng.integers(0, SEEDS))
                op = rng.random()
                with lock:
                    known = list(acked.items())
                if op < 0.45 or not known:
                    try:
                        bid = store.put(*content(store.spec, seed))
                    except TierFull:
                        with lock:
                            issued["put"] += 1
                            issued["rejected"] += 1
                        continue
                    with lock:
                        issued["put"] += 1
                        acked[bid] = seed
                elif op < 0.9:
                    bid, s = known[int(rng.integers(0, len(known)))]
                    got = store.get(bid)
                    with lock:
                        issued["get"] += 1
                        issued["hit"] += got is not None
                        if got is not None and not same(got, content(store.spec, s)):
                            wrong.append(bid)
                else:
                    bid, _ = known[int(rng.integers(0, len(known)))]
                    try:
                        store.pin(bid)
                    except BlockNotFound:
                        with lock:
                            pin_missed.add(bid)
                        continue
                    store.unpin(bid)  # this thread's own pin: releasing it must not fail
                    with lock:
                        issued["pin"] += 1
        except BaseException as exc:  # surfaced by the collective assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        comm.Barrier()
        assert everywhere(not errors, [repr(e) for e in errors[:3]])
        assert everywhere(not wrong, f"{len(wrong)} wrong reads during the run")
        stats = store.stats()
        # the counters match what this rank issued, exactly
        assert everywhere(stats["puts"] == issued["put"] == stats["stored"] + stats["deduped"] + stats["rejected"]
                          and stats["rejected"] == issued["rejected"], (stats["puts"], issued))
        assert everywhere((stats["gets"], stats["hits"]) == (issued["get"], issued["hit"]),
                          (stats["gets"], stats["hits"], issued))
        # afterwards: every acknowledged block reads back byte-exact, or it was dropped
        missing, wrong_after = set(), 0
        for bid, seed in acked.items():
            got = store.get(bid)
            if got is None:
                missing.add(bid)
            else:
                wrong_after += not same(got, content(store.spec, seed))
        comm.Barrier()
        stats = store.stats()
        dropped = sum(t["evictions"] for t in stats["tiers"].values()) + stats["deletes"] + stats["expired"]
        assert everywhere(wrong_after == 0, f"{wrong_after} wrong blocks read back")
        # each distinct id found missing (now, or by a pin) was dropped at least once somewhere
        unexplained = len(set().union(*comm.allgather(missing | pin_missed))) - comm.allreduce(dropped)
        assert everywhere(unexplained <= 0, f"{unexplained} more blocks missing than dropped")
        present = comm.allreduce(len(acked) - len(missing))
        assert present > 0 and comm.allreduce(issued["pin"]) > 0  # the checks above checked something
        comm.Barrier()
    finally:
        store.close()
        if comm.rank == 0:  # close() is collective: every rank is done with the files
            shutil.rmtree(path, ignore_errors=True)
