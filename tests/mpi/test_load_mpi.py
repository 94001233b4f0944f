"""Load: threads x ranks with a mixed workload for a bounded time; afterwards every
acknowledged block is readable byte-exact or was evicted, and the stats add up."""
from __future__ import annotations

import shutil
import tempfile
import threading
import time

import numpy as np

from cascade import BlockPinned, CascadeStore, Config, TierFull


def content(spec, seed: int):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(spec.shape).astype(spec.dtype), rng.standard_normal(spec.shape).astype(spec.dtype)


def test_threads_times_ranks_mixed_workload(comm, everywhere):
    path = comm.bcast(tempfile.mkdtemp(prefix="cascade-load-") if comm.rank == 0 else None)
    cfg = Config(model="tiny", shm_bytes=48 * 4096, remote_bytes=48 * 4096, file_bytes=256 * 8192,
                 file_dir=path, directory_slots=1 << 12)
    store = CascadeStore(cfg, comm=comm)
    acked: dict[str, int] = {}
    wrong: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(tid: int) -> None:
        rng = np.random.default_rng([comm.rank, tid])
        end = time.perf_counter() + 1.5
        try:
            while time.perf_counter() < end:
                seed = int(rng.integers(0, 400))  # shared across threads and ranks: dedup and races
                op = rng.random()
                if op < 0.45:
                    try:
                        bid = store.put(*content(store.spec, seed))
                    except TierFull:
                        continue
                    with lock:
                        acked[bid] = seed
                elif op < 0.9:
                    with lock:
                        if not acked:
                            continue
                        bid, s = list(acked.items())[int(rng.integers(0, len(acked)))]
                    got = store.get(bid)
                    if got is not None and not all(np.array_equal(a, b) for a, b in zip(got, content(store.spec, s))):
                        wrong.append(bid)
                else:
                    with lock:
                        if not acked:
                            continue
                        bid = list(acked)[int(rng.integers(0, len(acked)))]
                    try:
                        store.pin(bid)
                        store.unpin(bid)
                    except (KeyError, BlockPinned):
                        pass  # evicted meanwhile, or unpinned by a racing thread's pin pair
        except BaseException as exc:  # surfaced by the collective assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(3)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        comm.Barrier()
        assert everywhere(not errors), errors[:3]
        assert everywhere(not wrong)
        stats = store.stats()
        assert everywhere(stats["puts"] == stats["stored"] + stats["deduped"] + stats["rejected"])
        missing = {b for b in acked if not store.contains(b)}
        gone = sum(t["evictions"] for t in stats["tiers"].values()) + stats["deletes"] + stats["expired"]
        all_missing = set().union(*comm.allgather(missing))
        assert len(all_missing) <= comm.allreduce(gone)
        for bid in acked:  # what is still there is byte-exact
            got = store.get(bid)
            assert got is None or all(np.array_equal(a, b) for a, b in zip(got, content(store.spec, acked[bid])))
        assert comm.allreduce(stats["puts"]) > 100
        comm.Barrier()
    finally:
        store.close()
        if comm.rank == 0:  # close() is collective: every rank is done with the files
            shutil.rmtree(path, ignore_errors=True)
