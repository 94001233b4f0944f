"""Concurrency: readers racing evictions, demotions, promotions, file compaction, deletes,
re-puts, hints, pins, a corrupted record and close.

Written to catch a broken lock-free data path (copies and file I/O outside the store
lock, a block being read protected by a per-block reader pin / tier lease): the bytes of
block ``n`` are derived from its id (``content(n)``), and EVERY successful read must
return exactly them. A miss is always allowed; wrong bytes, a false corruption, an
unexpected exception, a hang or a crash never are. After each storm the store must be
quiescent and its accounting must add up (:func:`check_quiescent`).

What is asserted is deterministic (it does not depend on the interleaving): e.g. reads
of pinned blocks must hit, counters must balance, evictions and compactions must have
happened given how many blocks were put. No test measures speed; every thread does a
bounded amount of work (readers loop while producers still run, within a cap).

Tests that call ``get_many_into`` or ``put_many(block_ids=..., max_workers=...)`` need
the parallel batch API of the lock-free store; the rest run on any thread-safe store.
"""
from __future__ import annotations

import functools
import sys
import threading

import numpy as np
import pytest

from cascade import BlockNotFound, BlockPinned, BlockSpec, CascadeStore, Config, TierFull
from cascade.errors import StoreClosed
from cascade.tiers.file_tier import FileTier
from cascade.tiers.record_io import decode_location
from cascade.tiers.records import HEADER_BYTES, pad
from cascade.tiers.slab import SlabAllocator

BLOCK = 8192  # key and value of 4096 bytes each: page multiples (O_DIRECT without a bounce when aligned)
SPEC = BlockSpec.flat(BLOCK)
RECORD = HEADER_BYTES + pad(BLOCK)  # file-tier bytes per block
BIG = 64 << 10  # blocks of the file-tier-only storms: 15 records per 1 MiB file, so files seal and compact often
BIG_RECORD = HEADER_BYTES + pad(BIG)
HANG = 120.0  # seconds: only a guard against deadlocks, never a speed limit
MAX_ROUNDS = 3000  # readers' cap (they stop earlier, once the producers are done)
MIN_ROUNDS = 20
SWITCH_INTERVAL = 1e-5  # seconds: threads switch far more often than by default (5 ms): more interleavings


# -- blocks whose bytes follow from their ids ---------------------------------------------
def bid(n: int) -> str:
    return f"{n:032x}"


@functools.lru_cache(maxsize=None)
def content(n: int, nbytes: int = BLOCK) -> np.ndarray:
    """Block ``n``'s bytes: pseudo-random, so any torn, stale or misplaced copy differs."""
    data = np.random.default_rng(n).integers(0, 256, nbytes, dtype=np.uint8)
    data.flags.writeable = False
    return data


def parts(n: int, nbytes: int = BLOCK) -> tuple[np.ndarray, np.ndarray]:
    data = content(n, nbytes)
    return data[:nbytes // 2], data[nbytes // 2:]


def check_block(block_id: str, key, value) -> None:
    key, value = np.asarray(key), np.asarray(value)
    want_key, want_value = parts(int(block_id, 16), key.nbytes + value.nbytes)
    if not (np.array_equal(key, want_key) and np.array_equal(value, want_value)):
        raise AssertionError(f"a read of block {block_id} returned wrong bytes")


def put(store: CascadeStore, n: int, **kw) -> str:
    return store.put(*parts(n, store.spec.block_bytes), block_id=bid(n), **kw)


POISON = 0xA5


def poison(*bufs) -> None:
    """Scribble caller buffers before a read: a hit that did not write them shows up."""
    for b in bufs:
        np.asarray(b).reshape(-1).view(np.uint8)[...] = POISON


def config(tmp_path, **kw) -> Config:
    base = dict(model="tiny", shm_bytes=8 * BLOCK, file_bytes=48 * RECORD, file_dir=str(tmp_path / "files"),
                file_segment_bytes=1 << 20, compact_dead_fraction=0.2, file_read_mode="buffered",
                demote_high=1.0)  # no background demoter: tests count where each block lands
    base.update(kw)
    return Config(**base)


def open_store(cfg: Config, spec: BlockSpec = SPEC, **kw) -> CascadeStore:
    return CascadeStore(cfg, block_spec=spec, **kw)


# -- threads --------------------------------------------------------------------------------
class Producers:
    """How many producer threads are still working: consumers loop while any is."""

    def __init__(self, count: int) -> None:
        self._left = count
        self._lock = threading.Lock()

    def done(self) -> None:
        with self._lock:
            self._left -= 1

    def running(self) -> bool:
        return self._left > 0

    def rounds(self):
        """Round numbers for a consumer: at least MIN_ROUNDS, then while producers run."""
        i = 0
        while i < MIN_ROUNDS or (self.running() and i < MAX_ROUNDS):
            yield i
            i += 1


def producer(producers: Producers, fn):
    def run():
        try:
            fn()
        finally:
            producers.done()
    return run


def run_threads(*workers) -> None:
    """Start ``workers`` together (a Barrier), wait for all, re-raise the first error."""
    barrier = threading.Barrier(len(workers))
    errors: list[BaseException] = []

    def wrap(fn):
        try:
            barrier.wait()
            fn()
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=wrap, args=(w,), daemon=True, name=f"storm-{i}")
               for i, w in enumerate(workers)]
    saved = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(HANG)
    finally:
        sys.setswitchinterval(saved)
    alive = [t.name for t in threads if t.is_alive()]
    if errors:
        if len(errors) > 1:
            errors[0].add_note(f"{len(errors) - 1} more thread(s) failed: {[repr(e) for e in errors[1:]]}")
        raise errors[0]
    assert not alive, f"threads still running after {HANG}s (deadlock?): {alive}"


# -- readers ----------------------------------------------------------------------------------
READ_MODES = ["get_into", "get", "get_many", "get_many_into"]


class Reader:
    """Reads batches of ids with one API and checks every hit byte for byte. ``aligned``
    gives page-aligned output buffers (O_DIRECT straight into them)."""

    def __init__(self, store: CascadeStore, mode: str, batch: int, *, aligned: bool = False,
                 max_workers: int | None = None) -> None:
        self.store, self.mode, self.max_workers = store, mode, max_workers
        make = store.spec.empty_aligned if aligned else store.spec.empty
        self.outs = [make() for _ in range(batch)]
        self.hits = self.misses = 0

    def read(self, ids: list[str]) -> list[bool]:
        """One batch; which ids hit. Wrong bytes raise AssertionError."""
        s = self.store
        if self.mode == "get_into":
            found = []
            for b in ids:
                k, v = self.outs[0]
                poison(k, v)
                hit = s.get_into(b, k, v)
                assert hit in (True, False)
                if hit:
                    check_block(b, k, v)
                found.append(hit)
        elif self.mode == "get":
            found = []
            for b in ids:
                got = s.get(b)
                if got is not None:
                    check_block(b, *got)
                found.append(got is not None)
        elif self.mode == "get_many":
            got = s.get_many(ids)  # no max_workers: also runs on the serial get_many
            assert len(got) == len(ids)
            for b, g in zip(ids, got):
                if g is not None:
                    check_block(b, *g)
            found = [g is not None for g in got]
        elif self.mode == "get_many_into":
            outs = self.outs[:len(ids)]
            for k, v in outs:
                poison(k, v)
            found = s.get_many_into(ids, outs, max_workers=self.max_workers)
            assert len(found) == len(ids) and all(f in (True, False) for f in found)
            for b, f, (k, v) in zip(ids, found, outs):
                if f:
                    check_block(b, k, v)
        else:
            raise ValueError(self.mode)
        n = sum(found)
        self.hits += n
        self.misses += len(found) - n
        return list(found)


# -- accounting ---------------------------------------------------------------------------------
def check_quiescent(store: CascadeStore, *, corruptions: int = 0) -> dict:
    """With no thread inside the store: counters balance, every tier's accounting matches
    its blocks, each block is in one tier and has the bytes of its id, and no slab or file
    space leaked. ``corruptions``: how many the store may have counted (none unless a
    test corrupted records). Waits for the store's background work first (flush)."""
    store.flush()
    c = store.counters
    nbytes = store.spec.block_bytes
    assert c.puts == c.stored + c.deduped + c.rejected, c
    assert c.gets == c.hits + c.misses, c
    stats = store.stats()
    seen: dict = {}
    for tier in store.tiers:
        keys = list(tier)
        assert len(keys) == len(set(keys)) == len(tier), tier.name
        for key in keys:
            assert key not in seen, f"block {key} is in tiers {seen[key]} and {tier.name}"
            seen[key] = tier.name
        lengths = [tier.length(k) for k in keys]
        assert all(n == nbytes for n in lengths), tier.name
        assert tier.used == sum(lengths), tier.name
        tstats = tier.stats()
        assert stats["tiers"][tier.name]["bytes"] == tier.used
        assert stats["tiers"][tier.name]["blocks"] == len(keys)
        if "allocated" in tstats:  # slab tiers (GPU, SHM): no leaked or double-freed range
            assert tstats["allocated"] == sum(SlabAllocator.footprint(n) for n in lengths), tier.name
        if isinstance(tier, FileTier):  # live records alone count against the capacity
            assert tier.free == tier.capacity - sum(HEADER_BYTES + pad(n) for n in lengths)
            assert tstats["dead_bytes"] >= 0
        for key in keys:
            out = np.empty(nbytes, np.uint8)
            tier.read_into(key, out)
            assert np.array_equal(out, content(int(key[1], 16), nbytes)), f"{tier.name} holds wrong bytes for {key}"
        assert tier.free >= 0, tier.name
    assert len(store) == len(seen) == stats["blocks"]
    by_ns: dict[str, list[str]] = {}
    for ns, b in seen:
        by_ns.setdefault(ns, []).append(b)
    for ns, ids in by_ns.items():  # the metadata names the same blocks as the tiers
        assert all(store.contains_many(ids, namespace=ns))
    assert stats["hinted_bytes"] >= 0
    found = sum(t["corruptions"] for t in stats["tiers"].values())
    assert found <= corruptions if corruptions else found == 0, f"{found} corruptions counted"
    return stats


def all_pinned_hit(found: list[bool], ids: list[str], pinned: set[str]) -> None:
    for b, f in zip(ids, found):
        if b in pinned:
            assert f, f"pinned block {b} missed"


# -- 1. readers vs evictions, demotions and file compaction -------------------------------------
def _evictions_storm(store: CascadeStore, mode: str, *, writer: str = "put", readers: int = 4,
                     writers: int = 2, per_writer: int = 200, aligned: bool = False) -> dict:
    """Pre-put 40 blocks and pin 6 of them; ``writers`` put new blocks (demotions, file
    evictions, compactions) while ``readers`` read old, new and pinned ids."""
    old = [put(store, n) for n in range(40)]
    pinned_list = old[:3] + old[-3:]  # some in the slowest tier, some in the fastest
    pinned = set(pinned_list)
    for b in pinned:
        store.pin(b)
    new = {w: [10_000 * (w + 1) + i for i in range(per_writer)] for w in range(writers)}
    universe = old + [bid(n) for ns in new.values() for n in ns]
    producers = Producers(writers)
    pinned_reads = [0] * readers

    def write(w):
        ns = new[w]
        if writer == "put":
            for n in ns:
                put(store, n)
        else:  # the parallel batch put
            for i in range(0, len(ns), 8):
                chunk = ns[i:i + 8]
                got = store.put_many([parts(n) for n in chunk], block_ids=[bid(n) for n in chunk], max_workers=2)
                assert got == [bid(n) for n in chunk]

    def read(r):
        rng = np.random.default_rng(r)
        reader = Reader(store, mode, 8, aligned=aligned and r % 2 == 0, max_workers=[None, 2][r % 2])
        for i in producers.rounds():
            ids = [universe[j] for j in rng.integers(0, len(universe), 6)]
            ids += [pinned_list[(r + i) % 6], pinned_list[(r + i + 1) % 6]]
            all_pinned_hit(reader.read(ids), ids, pinned)
            pinned_reads[r] += 2

    run_threads(*[producer(producers, functools.partial(write, w)) for w in range(writers)],
                *[functools.partial(read, r) for r in range(readers)])
    for b in pinned:
        assert store.contains(b)
        store.unpin(b)
    assert sum(pinned_reads) >= readers * MIN_ROUNDS * 2
    return check_quiescent(store)


@pytest.mark.parametrize("mode", READ_MODES)
def test_readers_vs_evictions_shm_over_file(tmp_path, mode):
    with open_store(config(tmp_path)) as store:
        stats = _evictions_storm(store, mode)
        tiers = stats["tiers"]
        # 440 distinct blocks through 8 + 48 slots: demotions and drops had to happen
        assert tiers["shm"]["demotions"] > 0 and tiers["file"]["evictions"] > 0
        assert stats["stored"] == 440


def test_readers_vs_evictions_gpu_shm_file(tmp_path):
    cfg = config(tmp_path, gpu_bytes=4 * BLOCK)
    with open_store(cfg, array_module=np) as store:
        assert [t.name for t in store.tiers] == ["gpu", "shm", "file"]
        stats = _evictions_storm(store, "get_into", readers=3)
        assert stats["tiers"]["gpu"]["demotions"] > 0 and stats["tiers"]["file"]["evictions"] > 0


def test_parallel_put_many_vs_readers(tmp_path):
    """Needs the new API: put_many(block_ids=..., max_workers=...)."""
    with open_store(config(tmp_path, io_threads=4)) as store:
        stats = _evictions_storm(store, "get_into", writer="put_many")
        assert stats["stored"] == 440 and stats["tiers"]["file"]["evictions"] > 0


def _file_only_storm(store: CascadeStore, mode: str) -> dict:
    """The file tier alone: writers append (evicting), a deleter deletes (tombstones),
    both kill records so sealed files get compacted, while readers (page-aligned outputs
    and not) read old, new and pinned ids."""
    old = [put(store, n) for n in range(30)]
    pinned = set(old[:4])
    for b in pinned:
        store.pin(b)
    new = [[20_000 * (w + 1) + i for i in range(200)] for w in range(2)]
    universe = old + [bid(n) for ns in new for n in ns]
    producers = Producers(3)
    deleted = {"ok": 0, "pinned": 0, "absent": 0}

    def write(w):
        for n in new[w]:
            put(store, n)

    def delete():
        rng = np.random.default_rng(99)
        for _ in range(80):
            b = universe[rng.integers(0, len(universe))]
            try:
                store.delete(b)
                deleted["ok"] += 1
            except BlockPinned:
                deleted["pinned"] += 1
            except BlockNotFound:
                deleted["absent"] += 1

    def read(r):
        rng = np.random.default_rng(r)
        reader = Reader(store, mode, 6, aligned=r % 2 == 0, max_workers=[None, 3][r % 2])
        for _ in producers.rounds():
            ids = [universe[i] for i in rng.integers(0, len(universe), 4)] + sorted(pinned)[r % 3:r % 3 + 2]
            all_pinned_hit(reader.read(ids), ids, pinned)

    run_threads(producer(producers, functools.partial(write, 0)), producer(producers, functools.partial(write, 1)),
                producer(producers, delete), *[functools.partial(read, r) for r in range(4)])
    for b in pinned:
        store.unpin(b)
    stats = check_quiescent(store)
    assert stats["deletes"] == deleted["ok"]
    assert sum(deleted.values()) == 80
    return stats


@pytest.mark.parametrize("mode", ["get_into", "get_many_into"])
@pytest.mark.parametrize("read_mode", ["buffered", "direct"])
def test_file_tier_alone_readers_vs_evictions_deletes_and_compaction(tmp_path, read_mode, mode):
    cfg = config(tmp_path, shm_bytes=0, file_bytes=40 * BIG_RECORD, file_read_mode=read_mode)
    with open_store(cfg, BlockSpec.flat(BIG)) as store:
        tier = store.tiers[0]
        assert isinstance(tier, FileTier) and len(store.tiers) == 1
        assert tier.read_mode == read_mode
        stats = _file_only_storm(store, mode)
        on_file = stats["tiers"]["file"]
        assert on_file["evictions"] > 0 and on_file["compactions"] > 0
        assert on_file["corrupt_reads"] == 0  # no read of a moving record looked corrupt


# -- 2. readers vs delete and re-put of the same ids --------------------------------------------
@pytest.mark.parametrize("mode", ["get_into", "get_many", "get_many_into"])
def test_readers_vs_delete_and_reput_of_the_same_ids(tmp_path, mode):
    """16 ids (twice the SHM tier) deleted and put again while others read them: slots
    are freed and reused for other ids all the time."""
    cfg = config(tmp_path, file_bytes=6 * RECORD)  # 14 slots for 16 ids: evictions too
    with open_store(cfg) as store:
        ids = [put(store, n) for n in range(16)]
        producers = Producers(5)
        outcome = {"deleted": 0, "pinned": 0, "absent": 0, "put": 0, "full": 0, "pins": 0, "pin_missed": 0}
        count_lock = threading.Lock()

        def bump(what):
            with count_lock:
                outcome[what] += 1

        def delete(seed):
            rng = np.random.default_rng(seed)
            for _ in range(300):
                try:
                    store.delete(ids[rng.integers(0, 16)])
                    bump("deleted")
                except BlockPinned:
                    bump("pinned")
                except BlockNotFound:
                    bump("absent")

        def reput(seed):
            rng = np.random.default_rng(seed)
            for _ in range(300):
                try:
                    put(store, int(rng.integers(0, 16)))
                    bump("put")
                except TierFull:
                    bump("full")

        def pin_and_read():
            rng = np.random.default_rng(7)
            k, v = SPEC.empty()
            for _ in range(200):
                b = ids[rng.integers(0, 16)]
                try:
                    store.pin(b)
                except BlockNotFound:  # deleted or dropped just now
                    bump("pin_missed")
                    continue
                try:
                    for _ in range(2):  # pinned: no delete, eviction or drop may take it
                        poison(k, v)
                        assert store.get_into(b, k, v), f"pinned block {b} missed"
                        check_block(b, k, v)
                finally:
                    store.unpin(b)
                bump("pins")

        def read(r):
            reader = Reader(store, mode, 6, max_workers=[None, 2][r % 2])
            rng = np.random.default_rng(100 + r)
            for _ in producers.rounds():
                reader.read([ids[i] for i in rng.integers(0, 16, 6)])

        run_threads(*[producer(producers, functools.partial(delete, s)) for s in (1, 2)],
                    *[producer(producers, functools.partial(reput, s)) for s in (3, 4)],
                    producer(producers, pin_and_read),
                    *[functools.partial(read, r) for r in range(3)])
        stats = check_quiescent(store)
        assert stats["deletes"] == outcome["deleted"]
        assert outcome["deleted"] + outcome["pinned"] + outcome["absent"] == 600
        assert outcome["put"] + outcome["full"] == 600 and stats["rejected"] == outcome["full"]
        assert outcome["pins"] + outcome["pin_missed"] == 200
        assert outcome["deleted"] > 0  # nothing pins most ids: some deletes had to succeed


# -- 3. promotions on hit while others read and evict ---------------------------------------------
def test_promotions_race_readers_hints_and_evictions(tmp_path):
    cfg = config(tmp_path, shm_bytes=6 * BLOCK, file_bytes=64 * RECORD, promote_on_hit=True, hint_fraction=0.5)
    with open_store(cfg) as store:
        old = [put(store, n) for n in range(40)]
        slow = store.tiers[-1]
        in_file = [b for b in old if ("default", b) in slow]
        assert len(in_file) >= 30
        pinned = set(in_file[:2])  # pinned in the file tier: promoted by the first read of them
        for b in pinned:
            store.pin(b)
        producers = Producers(2)

        def write():
            for n in range(30_000, 30_060):  # 100 blocks through 70 slots: file evictions too
                put(store, n)

        def hint():
            rng = np.random.default_rng(5)
            k, v = SPEC.empty()
            for _ in range(60):
                batch = [old[i] for i in rng.integers(0, 40, 2)]
                assert 0 <= store.hint(batch) <= 2
                for b in batch[:1]:  # read one (uses a hint up), withdraw the other
                    poison(k, v)
                    if store.get_into(b, k, v):
                        check_block(b, k, v)
                store.unhint(batch[1:])
                assert store.stats()["hinted_bytes"] >= 0

        def read(r):
            rng = np.random.default_rng(200 + r)
            reader = Reader(store, ["get_into", "get_many"][r % 2], 8)
            for i in producers.rounds():
                ids = [old[j] for j in rng.integers(0, 40, 5)] + sorted(pinned)
                all_pinned_hit(reader.read(ids), ids, pinned)

        run_threads(producer(producers, write), producer(producers, hint),
                    *[functools.partial(read, r) for r in range(4)])
        for b in pinned:
            store.unpin(b)
        while store.unhint(old):  # hints left over (a read of another thread used the one meant)
            pass
        stats = check_quiescent(store)
        assert stats["hinted_bytes"] == 0
        assert stats["tiers"]["file"]["promotions"] > 0 and stats["tiers"]["file"]["evictions"] > 0
        # promotion still works once the storm is over
        key = next(iter(slow))
        got = store.get(key[1])
        assert got is not None and key in store.tiers[0]
        check_block(key[1], *got)
        check_quiescent(store)


# -- 4. hints and pins under concurrency --------------------------------------------------------
def test_pinned_blocks_survive_and_hinted_bytes_balance(tmp_path):
    """SHM alone (eviction drops): a pinned block must stay readable however hard others
    churn; hinted bytes never go negative or past the cap, and are 0 once every hint is
    used up or withdrawn."""
    cfg = config(tmp_path, shm_bytes=16 * BLOCK, file_bytes=0, hint_fraction=0.5)
    cap = 0.5 * 16 * BLOCK
    with open_store(cfg) as store:
        old = [put(store, n) for n in range(12)]
        held = set(old[:3])  # pinned for the whole storm
        for b in held:
            store.pin(b)
        producers = Producers(6)
        samples = {"n": 0}

        def write(w):
            for n in range(40_000 + 1000 * w, 40_000 + 1000 * w + 200):
                try:
                    put(store, n)
                except TierFull:  # every block pinned or hinted at that moment: allowed
                    pass

        def pin_cycle(seed):
            rng = np.random.default_rng(seed)
            k, v = SPEC.empty()
            for _ in range(120):
                b = old[rng.integers(0, 12)]
                try:
                    store.pin(b)
                except BlockNotFound:
                    continue  # evicted already: pin refused
                try:
                    for _ in range(3):
                        poison(k, v)
                        assert store.get_into(b, k, v), f"pinned block {b} was evicted"
                        check_block(b, k, v)
                finally:
                    store.unpin(b)

        def hint_cycle(seed):
            rng = np.random.default_rng(seed)
            for _ in range(150):
                batch = [old[i] for i in rng.integers(0, 12, 3)]
                taken = store.hint(batch)
                assert 0 <= taken <= 3
                got = store.get_many(batch[:2])
                for b, g in zip(batch, got):
                    if g is not None:
                        check_block(b, *g)
                store.unhint(batch[2:])

        def sample():
            for _ in producers.rounds():
                hinted = store.stats()["hinted_bytes"]
                assert 0 <= hinted <= cap, hinted
                samples["n"] += 1

        def read_held():
            reader = Reader(store, "get_into", 3)
            for _ in producers.rounds():
                assert all(reader.read(sorted(held))), "a block pinned for the whole storm missed"

        def read_any():  # unprotected blocks too: their slots are freed and reused meanwhile
            reader = Reader(store, "get_into", 1)
            rng = np.random.default_rng(31)
            for _ in producers.rounds():
                reader.read([bid(int(n)) for n in rng.choice(universe, 4)])

        universe = list(range(12)) + list(range(40_000, 40_200)) + list(range(41_000, 41_200))
        run_threads(*[producer(producers, functools.partial(write, w)) for w in range(2)],
                    *[producer(producers, functools.partial(pin_cycle, s)) for s in (11, 12)],
                    *[producer(producers, functools.partial(hint_cycle, s)) for s in (21, 22)],
                    sample, read_held, read_any)
        assert all(store.contains_many(sorted(held)))
        assert store.stats()["tiers"]["shm"]["evictions"] > 0
        for b in held:
            store.unpin(b)
        while store.unhint(old):
            pass
        stats = check_quiescent(store)
        assert stats["hinted_bytes"] == 0
        assert samples["n"] >= MIN_ROUNDS
        with pytest.raises(BlockPinned):  # pins balanced: unpinned everywhere now
            store.unpin(old[0])


# -- 5. accounting after a storm, close and a warm restart -------------------------------------------
@pytest.mark.parametrize("read_mode", ["buffered", "direct"])
def test_storm_then_close_and_warm_restart_serve_exact_bytes(tmp_path, read_mode):
    cfg = config(tmp_path, file_read_mode=read_mode)
    with open_store(cfg) as store:
        _evictions_storm(store, "get_many", per_writer=80)
        ever = list(range(40)) + [10_000 * (w + 1) + i for w in range(2) for i in range(80)]
        file_blocks = len(store.tiers[-1])
    store.close()  # idempotent, and the with block closed it already
    with open_store(cfg) as again:
        assert len(again) >= file_blocks  # kept SHM blocks were moved to the file tier at close
        reader = Reader(again, "get_into", 1)
        for n in ever:
            reader.read([bid(n)])
        assert reader.hits == len(again)
        check_quiescent(again)


# -- 6. a corrupted record read by several threads at once ---------------------------------------------
@pytest.mark.parametrize("mode", ["get_into", "get_many_into"])
@pytest.mark.parametrize("read_mode", ["buffered", "direct"])
def test_corrupt_record_read_concurrently_is_a_miss_dropped_once(tmp_path, read_mode, mode):
    cfg = config(tmp_path, shm_bytes=0, file_bytes=64 * RECORD, file_read_mode=read_mode)
    with open_store(cfg) as store:
        ids = [put(store, n) for n in range(32)]
        store.flush()
        tier = store.tiers[0]
        bad = [ids[7], ids[20]]
        for b in bad:  # flip one payload byte of the record, on disk
            file_id, offset = decode_location(tier.location(("default", b)))
            path = tmp_path / "files" / f"agg_rank000_{file_id:06d}.bin"
            with open(path, "r+b") as f:
                f.seek(offset + HEADER_BYTES + 1234)
                byte = f.read(1)
                f.seek(offset + HEADER_BYTES + 1234)
                f.write(bytes([byte[0] ^ 0x40]))
        good = [b for b in ids if b not in bad]
        bad_reads = [0] * 6

        def read(r):
            reader = Reader(store, mode, 8, aligned=r % 2 == 0, max_workers=[None, 4][r % 2])
            for i in range(15):
                batch = bad + [good[(r + 3 * i + j) % 30] for j in range(4)]
                found = reader.read(batch)
                bad_reads[r] += 2
                assert found[:2] == [False, False], "a corrupted record was served"
                assert all(found[2:]), "a good block missed"

        run_threads(*[functools.partial(read, r) for r in range(6)])
        stats = check_quiescent(store, corruptions=sum(bad_reads))
        assert not any(store.contains_many(bad)) and len(store) == 30
        # each record was found bad and dropped: at least once each, never more than read
        assert 2 <= stats["tiers"]["file"]["corruptions"] <= sum(bad_reads)
        assert 2 <= stats["tiers"]["file"]["corrupt_reads"] <= sum(bad_reads)
        assert stats["misses"] == sum(bad_reads) and stats["hits"] == 6 * 15 * 4
        assert tier.used == 30 * BLOCK and tier.free == tier.capacity - 30 * RECORD
        # a re-put of a dropped id stores it afresh, with the right bytes
        put(store, 7)
        assert store.get(bid(7)) is not None
        check_quiescent(store, corruptions=sum(bad_reads))


# -- 7. close while other threads read ------------------------------------------------------------------
@pytest.mark.parametrize("mode", READ_MODES)
def test_close_while_reading(tmp_path, mode):
    """Reads racing close() hit with the right bytes, miss, or raise StoreClosed; after
    close every read raises StoreClosed. The kept blocks are intact on reopen."""
    cfg = config(tmp_path)
    store = open_store(cfg)
    ids = [put(store, n) for n in range(40)]  # 8 in SHM, 32 in the file tier
    warmed = threading.Barrier(5 + 1)
    ended = [None] * 5

    def read(r):
        reader = Reader(store, mode, 6, max_workers=[None, 2][r % 2])
        rng = np.random.default_rng(300 + r)
        try:
            for i in range(100_000):  # bounded: close() comes after the first rounds
                if i == MIN_ROUNDS:
                    warmed.wait()
                try:
                    reader.read([ids[j] for j in rng.integers(0, 40, 6)])
                except StoreClosed:
                    ended[r] = i
                    break
        except BaseException:
            warmed.abort()  # do not leave close() waiting
            raise
        # once closed, closed for good
        with pytest.raises(StoreClosed):
            reader.read([ids[0]])

    def close():
        warmed.wait()
        store.close()

    run_threads(*[functools.partial(read, r) for r in range(5)], close)
    assert all(e is not None and e >= MIN_ROUNDS for e in ended), ended
    store.close()  # idempotent
    with open_store(cfg) as again:
        reader = Reader(again, "get_into", 1)
        for b in ids:
            reader.read([b])
        assert reader.hits == len(again) > 0
        check_quiescent(again)


# -- 8. chosen interleavings: a read held inside its copy while others act --------------------------
# The storms above find races by chance. These hold one read at the start of its data copy
# (the SHM slab copy, the file tier's pread) while another thread deletes, evicts or
# re-puts the block, compacts its file or closes the store, then let it finish: a lease
# must keep what the copy reads alive. On a store that copies under its lock the other
# thread just waits (for at most WAIT, then the read goes on first): the same outcomes.
WAIT = 0.5  # seconds the held read waits for the other thread (never a speed limit)


class Hold:
    """Once armed, hold the next ``parties`` calls of ``owner.<names>`` until released."""

    def __init__(self, monkeypatch, owner, names: tuple[str, ...], parties: int = 1) -> None:
        self.parties, self.arrived, self.armed = parties, 0, False
        self.first, self.all_in, self.release = threading.Event(), threading.Event(), threading.Event()
        self._lock = threading.Lock()
        for name in names:
            monkeypatch.setattr(owner, name, self._wrap(getattr(owner, name)))

    def _wrap(self, original):
        def held(*args, **kwargs):
            with self._lock:
                hold = self.armed
                if hold:
                    self.arrived += 1
                    self.first.set()
                    if self.arrived == self.parties:
                        self.armed = False
                        self.all_in.set()
            if hold:
                self.release.wait(HANG)
            return original(*args, **kwargs)
        return held


def held_reads(hold: Hold, reads: list, interfere=None) -> None:
    """Run ``reads`` (threads) with ``hold`` armed; once they are held, run ``interfere``
    (for up to WAIT), then release them. Re-raises the first error of any thread."""
    errors: list[BaseException] = []

    def guard(fn):
        def run():
            try:
                fn()
            except BaseException as exc:
                errors.append(exc)
        return threading.Thread(target=run, daemon=True)

    hold.armed = True
    readers = [guard(r) for r in reads]
    for t in readers:
        t.start()
    while not hold.first.wait(0.01) and any(t.is_alive() for t in readers):
        pass
    try:
        assert hold.first.is_set(), "no read reached the held call: the hook no longer matches the store's copy path"
        hold.all_in.wait(WAIT)  # more parties: only a store reading outside its lock gets them all
        other = None
        if interfere is not None:
            other = guard(interfere)
            other.start()
            other.join(WAIT)  # a store copying under its lock blocks it until the read ends
    finally:
        hold.armed = False
        hold.release.set()
    for t in readers + ([other] if interfere is not None else []):
        t.join(HANG)
        assert not t.is_alive(), "a thread hung after the held read was released"
    if errors:
        raise errors[0]


def one_read(store: CascadeStore, block: str, outcome: dict, mode: str = "get_into"):
    def read():
        try:
            outcome["hit"] = Reader(store, mode, 1).read([block])[0]  # wrong bytes raise here
        except StoreClosed:
            outcome["closed"] = True
    return read


def file_read_hold(monkeypatch, parties: int = 1) -> Hold:
    """Holds a file-tier read in its syscall: ``os.preadv``/``pread``, or record_io's
    one-call read (buffered records up to 1 MiB, small O_DIRECT ones) and queued read."""
    import os

    from cascade.tiers import record_io
    hold = Hold(monkeypatch, os, ("preadv", "pread"), parties)
    for name in ("preadv_hashed", "submit"):
        monkeypatch.setattr(record_io, name, hold._wrap(getattr(record_io, name)))
    return hold


def shm_read_hold(monkeypatch) -> Hold:
    from cascade.tiers.shm import ShmTier
    return Hold(monkeypatch, ShmTier, ("_region", "read_hot"))  # read_hot: a small block's copy under the lock


@pytest.mark.parametrize("how", ["delete", "evict"])
@pytest.mark.parametrize("read_mode", ["buffered", "direct"])
def test_file_read_held_while_its_record_goes_and_its_file_is_compacted(tmp_path, monkeypatch, read_mode, how):
    """Held in its pread: the block is deleted (or evicted) and its file compacted away
    and unlinked, and new files are opened (a closed descriptor's number is reused)."""
    cfg = config(tmp_path, shm_bytes=0, file_bytes=16 * BIG_RECORD, file_read_mode=read_mode)
    with open_store(cfg, BlockSpec.flat(BIG)) as store:
        first = [put(store, n) for n in range(12)]  # all in the first file
        target, outcome, gone = first[0], {}, {}

        def interfere():
            if how == "delete":
                for b in first:
                    try:
                        store.delete(b)
                    except (BlockPinned, BlockNotFound) as exc:  # allowed for the block being read
                        gone[b] = exc
            for n in range(100, 130):  # rolls over several files; the first is compacted
                put(store, n)

        held_reads(file_read_hold(monkeypatch), [one_read(store, target, outcome)], interfere)
        assert outcome["hit"] in (True, False)  # and, if a hit, the right bytes (checked)
        for n in range(130, 135):  # a compaction put off while the record was being read happens now
            put(store, n)
        stats = check_quiescent(store)  # (in the background: its flush waits for it)
        assert stats["tiers"]["file"]["compactions"] > 0 and stats["tiers"]["file"]["corrupt_reads"] == 0
        assert set(gone) <= {target}
        if how == "delete" and not gone:
            assert not store.contains(target)


@pytest.mark.parametrize("how", ["delete", "evict", "reput"])
@pytest.mark.parametrize("mode", ["get_into", "get_many_into"])
def test_shm_read_held_while_its_slot_is_freed_and_reused(tmp_path, monkeypatch, mode, how):
    """Held before its slab copy: the block leaves SHM (deleted, or demoted by new puts),
    or is deleted and put again, and other blocks take its slot."""
    with open_store(config(tmp_path)) as store:
        first = [put(store, n) for n in range(8)]  # SHM full
        target, outcome = first[3], {}

        def interfere():
            if how in ("delete", "reput"):
                try:
                    store.delete(target)
                except (BlockPinned, BlockNotFound):
                    pass
            if how == "reput":
                put(store, 3)  # the same bytes again (a slot still being read is not reused for them)
            for n in range(200, 216):  # fill SHM twice over: the freed slot is reused
                put(store, n)

        held_reads(shm_read_hold(monkeypatch), [one_read(store, target, outcome, mode)], interfere)
        assert outcome["hit"] in (True, False)
        check_quiescent(store)
        if how == "reput":
            got = store.get(target)
            assert got is not None
            check_block(target, *got)


@pytest.mark.parametrize("tier", ["shm", "file"])
def test_read_held_while_the_store_closes(tmp_path, monkeypatch, tier):
    """close() while a read is inside its copy: the read hits with the right bytes, misses
    or raises StoreClosed; nothing crashes; the blocks kept are intact on reopen."""
    cfg = config(tmp_path)
    store = open_store(cfg)
    ids = [put(store, n) for n in range(20)]  # 0..11 in the file tier, 12..19 in SHM
    target = ids[15] if tier == "shm" else ids[2]
    outcome: dict = {}
    hold = shm_read_hold(monkeypatch) if tier == "shm" else file_read_hold(monkeypatch)
    held_reads(hold, [one_read(store, target, outcome)], store.close)
    assert ("hit" in outcome) != ("closed" in outcome), outcome
    store.close()
    with pytest.raises(StoreClosed):
        store.get(target)
    monkeypatch.undo()
    with open_store(cfg) as again:
        reader = Reader(again, "get_into", 1)
        for b in ids:
            reader.read([b])
        assert reader.hits == len(again) > 0
        check_quiescent(again)


@pytest.mark.parametrize("read_mode", ["buffered", "direct"])
def test_two_reads_held_on_one_corrupt_record_drop_it_once(tmp_path, monkeypatch, read_mode):
    """Two reads of a corrupted record both in its pread at once: both miss, and the
    record is dropped once (the file tier's and the store's accounting stay exact)."""
    cfg = config(tmp_path, shm_bytes=0, file_bytes=64 * RECORD, file_read_mode=read_mode)
    with open_store(cfg) as store:
        ids = [put(store, n) for n in range(10)]
        store.flush()
        tier, target = store.tiers[0], ids[4]
        file_id, offset = decode_location(tier.location(("default", target)))
        with open(tmp_path / "files" / f"agg_rank000_{file_id:06d}.bin", "r+b") as f:
            f.seek(offset + HEADER_BYTES + 77)
            byte = f.read(1)
            f.seek(offset + HEADER_BYTES + 77)
            f.write(bytes([byte[0] ^ 1]))
        outcomes = [{}, {}]
        held_reads(file_read_hold(monkeypatch, parties=2), [one_read(store, target, o) for o in outcomes])
        assert [o["hit"] for o in outcomes] == [False, False]
        stats = check_quiescent(store, corruptions=2)
        assert 1 <= stats["tiers"]["file"]["corruptions"] <= 2
        assert len(store) == 9 and not store.contains(target)
        assert tier.used == 9 * BLOCK and tier.free == tier.capacity - 9 * RECORD
