"""small_blocks: per-block cost of Cascade's calls against the plainest in-process store,
and batch calls against the same calls in a loop, 4 KiB to 16 MiB.

Per block size (key + value; default 4, 8, 16 and 64 KiB, 2 and 16 MiB: the issue's range
with the sizes between 4 and 64 KiB, where until session 48 the suite did not look) and
round, in one process and one run:

* ``dict``: the floor of any in-process cache: ``d[id] = (k.copy(), v.copy())`` for a put,
  ``k, v = d[id]`` then two ``np.copyto`` into preallocated outputs for a get. Outputs
  are faulted in before any pass, and every hot read form runs once untimed first. The
  dict is at steady state, as the store is (its slab prefaulted): it holds as many other
  blocks, filled untimed, one of which is deleted (untimed) before each insert, so every
  insert's copies reuse memory just freed. Filled from empty instead, its inserts paid,
  or not, for fresh pages as malloc grew the heap, by the heap's state: 4 KiB dict puts
  interleaved with the store's (below), 8 rounds a run, medians of five runs each 2.98-3.53
  us without torch imported and 3.79-4.31 with it; at steady state (two runs each)
  2.37-2.52 and 2.93-3.03.
* Cascade, SHM tier in ``/dev/shm`` (hot), its pages backed at open (``shm_prefault``, as
  in a store past its first fill, as the dict is at steady state):
  ``put(k, v, block_id=)`` one by one (``loop``) and
  ``put_many(pairs, block_ids=)`` (``batch``); ``get_into`` one by one and
  ``get_many_into`` of the same ids into the same outputs; ``view`` (a zero-copy lease
  taken and given back: its cost should not grow with the block size), at least
  :data:`~benchmark.timing.VIEWS_TIMED` views timed in one go at every size
  (:func:`~benchmark.timing.time_views`).
* The same store, CPU torch tensors over the same bytes (``torch.from_numpy``, when torch
  is installed): ``put`` and ``get_into`` one by one (``torch_put_us``, ``torch_get_us``;
  the store reads them through numpy arrays over their memory,
  :func:`cascade.buffers.host_array`).
* Cascade, SHM tier not prefaulted: the same loop of puts into pages never touched
  (``put_fresh_pages``: each put also backs its pages, a first fill's cost).
* Cascade, file tier only (``cold``: before every timed pass, the files read through
  once, untimed, then dropped from the page cache, as in ``file_read_mode``): ``get_into``
  loop and ``get_many_into`` batch, default read mode. Without any such read, whichever
  form ran first read the bytes just written, and ran slower: in the suite at b165b2b,
  2 MiB cold batch/loop was 0.51-0.97 with the loop first and 1.09-1.61 with the batch
  first. Until session 39 the files were read through once per round, before its first
  pass only, and the first pass of a round still ran apart from the others: at 16 MiB
  (one pass per form a round) the rounds whose batch went first gave the suite at
  1402798 batch/loop ratios of 2.31, 1.64, 0.94; 2.29, 1.13, 2.79; 1.16, 0.97, 1.08,
  the loop-first rounds 0.47-1.07, and a median of 1.04. Five runs of 6 rounds
  (``--sizes 8K,16M`` once, ``16M`` twice, the default sizes twice), each alternated
  with one the old way in one sitting: 16 MiB cold batch/loop 0.95, 0.96, 0.99, 0.99,
  1.03 with a read before every pass against 1.01, 1.05, 1.05, 1.06, 1.12 with one a
  round; 4 KiB 0.77, 0.77 against 0.81, 0.82; 8 KiB 1.03 against 1.06; 64 KiB 0.63,
  0.63 against 0.62, 0.62; 2 MiB 0.91, 0.96 against 0.88, 0.97.

Reported per row: microseconds per block (median over rounds) and the ratios the issue
sets targets for, each with its range over rounds (``*_range``): ``get_vs_dict`` and
``put_vs_dict`` (hot; target <= 3 at 4 KiB), ``batch_vs_loop`` (every size, hot and
cold; target <= 1). Every read pass writes into zeroed outputs and is compared with the
sources right after (wrong bytes would void the row).

The forms are timed side by side (:func:`_interleaved_us`): the dict's puts, the store's
puts one by one and its batch puts run chunk by chunk in turn (:data:`CHUNKS` chunks of
whole batches from 4 to 64 KiB; one chunk, the whole pass, at 2 and 16 MiB, whose 32 and
16 blocks make one batch: finer chunks would time smaller batches), the form that goes
first rotating from chunk to chunk and round to round; the three hot get forms likewise,
and the two cold ones (the page cache dropped before each pass over a chunk). Each ratio
is the median over rounds of each round's own ratio. On this VM one core's speed drifts
by up to 2x within seconds (the same pure-Python loop: 183-428 ms within a minute, CPU
time equal to wall time), and whole passes timed one after the other compared the
machine's moments as much as the code: 4 KiB put/dict, 8 rounds in one process, whole
passes 3.14 [2.44-3.50], interleaved chunks 3.25 [3.11-3.44].

The hot gets, which leave the store as they find it, go over their blocks again where
the blocks make fewer than :data:`CHUNKS` chunks (:func:`_read_repeats`: 16 times at 2
and 16 MiB, once from 4 to 64 KiB), so that every size's hot ratio rests on as many
timed passes per form. A single pass of 32 blocks of 2 MiB takes about 3 ms, and one
such pass per form and round gave the suite at efc645b per-round hot batch/loop ratios
of 0.56-1.75 at 2 MiB (loop passes of 75-247 us a block) and 0.78-1.36 at 16 MiB. Two
runs each, alternated in one sitting (``--sizes 2M,16M``, 6 rounds): 2 MiB rounds
0.92-1.07 (medians 1.019, 0.986) against 0.62-1.16 (0.993, 0.948) with one pass;
16 MiB 0.87-1.00 (0.972, 0.917) against 0.80-1.32 (1.044, 0.960). Puts are not
repeated (a second put of an id is another call), nor the cold gets (every pass pays a
settling read and a drop of the whole set).

Each timed pass (over a chunk or whole) starts with ``gc.collect()``: it then pays for
the collections of its own garbage only. Without it, the full collection that the
long-lived objects of the passes before it trigger (11-50 ms here, 3-12 us per block at
4 KiB) fell, from the second round on, in whichever put form ran second into the shared
store (measured with ``gc.callbacks``; 3 rounds at 4 KiB, two runs each):
``put_batch_vs_loop`` was 1.08 and 2.05 with the loop first, 0.74 and 0.80 with the
batch first, for the same code.

The passes of each form run with the heap frozen (:func:`~benchmark.timing.frozen_heap`):
the objects alive before them (torch's and LMCache's among them: 214k) are out of the
collector's reach, so each pass's ``gc.collect()`` walks only what the passes made. Until
session 44 every such collection walked them all (0.14 s) and evicted the CPU's caches
right before each timed chunk, so every chunk started cold, the dict's as much as the
store's. Two runs each way, alternated in one sitting (``results/issue20/frozen_heap_ab_20261207/``):
a 64 KiB dict get 3.87-4.15 us frozen against 5.66-5.92, the store's 6.07-6.50 against
7.62-7.64; 4 KiB put vs dict 3.20-3.32 against 2.86-2.91 (the dict gained more); hot get
batch/loop at 64 KiB 0.89-0.90 against 0.97-0.99, at 16 MiB 0.91-0.94 against 0.97-1.01,
at 2 MiB 0.92-1.02 against 1.05-1.10.

Before they were interleaved, the loop and the batch of each pair took turns at going
first, round by round: with the loop always first, the suite at 63a2571 gave 2 MiB puts
a batch/loop ratio of 1.08 [1.00-1.17] over 3 rounds; the same puts alternated in one
process (10 rounds, a fresh store each, 32 blocks of 2 MiB) gave 0.995 [0.93-1.07]: the
second pass into a store, not the batch, was paying more.
"""
from __future__ import annotations

import gc
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from cascade import CascadeStore, Config
from cascade.models import BlockSpec

try:
    import torch
except ImportError:  # no torch rows
    torch = None

from ..machine import drop_page_cache, files_under, settle_reads
from ..timing import VIEWS_TIMED, frozen_heap, time_views
from .blockio import size_label

DEFAULT_SIZES = [4 << 10, 8 << 10, 16 << 10, 64 << 10, 2 << 20, 16 << 20]
BYTES_PER_PASS = 64 << 20  # blocks per pass: this much data, at least 16 and at most 4096 blocks
BATCH = 64
CHUNKS = 16  # chunks of each interleaved pass (_interleaved_us), at most
GET_TARGET, PUT_TARGET = 3.0, 3.0
#: The ratios reported (medians over rounds of each round's ratio): name -> (numerator, denominator).
RATIOS = {"get_vs_dict": ("get_loop_us", "dict_get_us"), "put_vs_dict": ("put_loop_us", "dict_put_us"),
          "put_fresh_pages_vs_dict": ("put_fresh_pages_us", "dict_put_us"),
          "hot_get_batch_vs_loop": ("get_batch_us", "get_loop_us"), "put_batch_vs_loop": ("put_batch_us", "put_loop_us"),
          "cold_get_batch_vs_loop": ("cold_get_batch_us", "cold_get_loop_us")}


def _blocks(spec: BlockSpec, count: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, 255, spec.shape, dtype=np.uint8), rng.integers(0, 255, spec.shape, dtype=np.uint8))
            for _ in range(count)]


def _ids(count: int, salt: int) -> list[str]:
    return [f"{salt:08x}{i:024x}" for i in range(count)]


def _per_block_us(fn, count: int) -> float:
    gc.collect()  # no pass pays for the garbage of the ones before it (module docstring)
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) / count * 1e6


def _chunk_blocks(count: int) -> int:
    """Blocks per chunk of the interleaved passes: about :data:`CHUNKS` chunks of whole
    batches (one chunk, the whole pass, when there are fewer blocks)."""
    return BATCH * max(1, count // (BATCH * CHUNKS))


def _chunk_count(count: int) -> int:
    """Chunks (:func:`_chunk_blocks` each, the last maybe shorter) that ``count`` blocks make."""
    return -(-count // _chunk_blocks(count))


def _read_repeats(count: int) -> int:
    """How many times the hot reads go over their blocks in a round: enough that each form
    is timed over :data:`CHUNKS` chunk passes (one, where the blocks make that many chunks
    already; 16 at 2 and 16 MiB, whose blocks make one chunk: module docstring)."""
    return max(1, CHUNKS // _chunk_count(count))


def _interleaved_us(forms: dict[str, Callable[[slice], None]], count: int, rnd: int,
                    before: Callable[[str, slice], None] | None = None,
                    after: Callable[[str, slice], None] | None = None, *, repeat: int = 1) -> dict[str, float]:
    """Microseconds per block of each form, its passes cut into chunks timed in turn:
    every form runs over chunk 1, then every form over chunk 2, and so on, the form that
    goes first rotating from chunk to chunk (and round ``rnd`` to round); with ``repeat``,
    the chunks are gone over that many times (forms that leave the store as they found
    it: reads). ``before`` runs untimed before each form's pass over a chunk, ``after``
    untimed after it (the checks). Each pass over a chunk starts with ``gc.collect()``, as
    each whole pass did (module docstring)."""
    names = list(forms)
    seconds = dict.fromkeys(names, 0.0)
    chunk = _chunk_blocks(count)
    with frozen_heap():  # each pass's gc.collect() walks only what the passes made (module docstring)
        for i, start in enumerate(list(range(0, count, chunk)) * repeat):
            part = slice(start, start + chunk)
            turn = (i + rnd) % len(names)
            for name in names[turn:] + names[:turn]:
                if before is not None:
                    before(name, part)
                gc.collect()
                started = time.perf_counter()
                forms[name](part)
                seconds[name] += time.perf_counter() - started
                if after is not None:
                    after(name, part)
    return {name: s / (count * repeat) * 1e6 for name, s in seconds.items()}


def _batched(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _read_forms(store: CascadeStore, ids: list[str], outs: list[tuple[np.ndarray, np.ndarray]]
                ) -> tuple[Callable[[slice], None], Callable[[slice], None]]:
    """The two read forms over a chunk of ``ids`` into the same chunk of ``outs``:
    ``get_into`` one by one (loop), and ``get_many_into`` of :data:`BATCH` blocks a call."""
    def loop(part: slice) -> None:
        for b, (ko, vo) in zip(ids[part], outs[part]):
            store.get_into(b, ko, vo)

    def batch(part: slice) -> None:
        for b, o in zip(_batched(ids[part], BATCH), _batched(outs[part], BATCH)):
            store.get_many_into(b, o)

    return loop, batch


def _torch_passes(store: CascadeStore, blocks: list, outs: list, ids: list[str]) -> dict[str, float]:
    """Puts and hot gets of CPU torch tensors over the bytes of ``blocks`` and ``outs``."""
    tensors = [(torch.from_numpy(k), torch.from_numpy(v)) for k, v in blocks]
    touts = [(torch.from_numpy(k), torch.from_numpy(v)) for k, v in outs]
    for key_out, value_out in outs:
        key_out.fill(0)
        value_out.fill(0)
    row = {"torch_put_us": _per_block_us(lambda: [store.put(k, v, block_id=b) for b, (k, v) in zip(ids, tensors)],
                                          len(ids))}

    def get_loop() -> None:
        for b, (ko, vo) in zip(ids, touts):
            store.get_into(b, ko, vo)

    get_loop()
    row["torch_get_us"] = _per_block_us(get_loop, len(ids))
    row["torch_wrong"] = sum(not (np.array_equal(o[0], b[0]) and np.array_equal(o[1], b[1]))
                             for o, b in zip(outs, blocks))
    return row


def _one_round(nbytes: int, count: int, rnd: int, workdir: str) -> dict[str, float]:
    spec = BlockSpec.flat(nbytes)
    blocks = _blocks(spec, count, rnd)
    outs = [spec.empty() for _ in range(count)]
    for key_out, value_out in outs:  # fault the outputs in: no pass pays first-touch faults for another
        key_out.fill(0)
        value_out.fill(0)
    row: dict[str, float] = {"chunks": float(_chunk_count(count))}
    ids = _ids(count, 2 * rnd)
    # A dict at steady state, as the store is (its slab prefaulted): filled untimed with
    # as many other blocks, one of which is deleted (untimed) before each insert, so that
    # every insert's copies reuse memory freed just before (module docstring).
    evicted = _ids(count, 2 * rnd + 4 * 10**6)
    table = {b: (k.copy(), v.copy()) for b, (k, v) in zip(evicted, blocks)}

    wrong = {"hot": 0, "cold": 0}  # blocks a timed read pass got wrong (each is checked right after)

    def zero(name: str, part: slice) -> None:  # every read pass writes into zeros: none is masked by the one before
        for key_out, value_out in outs[part]:
            key_out.fill(0)
            value_out.fill(0)

    def checker(side: str) -> Callable[[str, slice], None]:
        def check(name: str, part: slice) -> None:
            wrong[side] += sum(not (np.array_equal(o[0], b[0]) and np.array_equal(o[1], b[1]))
                               for o, b in zip(outs[part], blocks[part]))
        return check

    # The SHM tier in its real place (/dev/shm), not in the file tier's directory: a slab
    # mapped from a disk file pays write faults on dirty-page tracking at every put. Its
    # pages are backed at open (shm_prefault), as in a store past its first fill, whose
    # puts reuse the room of evicted blocks (as the dict's do, above). A put into pages
    # never touched is timed apart.
    shm_bytes = 4 * count * (nbytes + 4096) + (8 << 20)
    fresh = Config(shm_bytes=shm_bytes, file_bytes=0, remote_bytes=0)
    with CascadeStore(fresh, block_spec=spec) as store:
        fresh_ids = _ids(count, 2 * rnd)
        row["put_fresh_pages_us"] = _per_block_us(
            lambda: [store.put(k, v, block_id=b) for b, (k, v) in zip(fresh_ids, blocks)], count)
    shm = Config(shm_bytes=shm_bytes, file_bytes=0, remote_bytes=0, promote_on_hit=True, shm_prefault=True)
    with CascadeStore(shm, block_spec=spec) as store:
        loop_ids, batch_ids = ids, _ids(count, 2 * rnd + 1)

        def dict_put(part: slice) -> None:
            for bid, (k, v) in zip(ids[part], blocks[part]):
                table[bid] = (k.copy(), v.copy())

        def put_loop(part: slice) -> None:
            for b, (k, v) in zip(loop_ids[part], blocks[part]):
                store.put(k, v, block_id=b)

        def put_batch(part: slice) -> None:
            for pairs, b in zip(_batched(blocks[part], BATCH), _batched(batch_ids[part], BATCH)):
                store.put_many(pairs, block_ids=b)

        def evict(name: str, part: slice) -> None:
            if name == "dict_put_us":
                for b in evicted[part]:
                    del table[b]

        row.update(_interleaved_us({"dict_put_us": dict_put, "put_loop_us": put_loop, "put_batch_us": put_batch},
                                   count, rnd, before=evict))

        def dict_get(part: slice) -> None:
            for bid, (ko, vo) in zip(ids[part], outs[part]):
                k, v = table[bid]
                np.copyto(ko, k)
                np.copyto(vo, v)

        get_loop, get_batch = _read_forms(store, loop_ids, outs)
        everything = slice(0, count)
        for warm in (dict_get, get_loop, get_batch):  # every hot read form runs once untimed first
            warm(everything)
        repeat = _read_repeats(count)
        row["hot_read_repeats"] = float(repeat)
        row.update(_interleaved_us({"dict_get_us": dict_get, "get_loop_us": get_loop, "get_batch_us": get_batch},
                                   count, rnd, before=zero, after=checker("hot"), repeat=repeat))
        row["view_us"], missed_views = time_views(store, loop_ids, VIEWS_TIMED)
        row["hot_wrong"] = missed_views + wrong["hot"]
        if torch is not None:
            row.update(_torch_passes(store, blocks, outs, _ids(count, 2 * rnd + 2 * 10**6)))

    file_dir = tempfile.mkdtemp(prefix="small-", dir=workdir)
    try:
        cold = Config(shm_bytes=0, remote_bytes=0, file_bytes=2 * count * (nbytes + 8192) + (64 << 20),
                      file_dir=file_dir, promote_on_hit=False)
        with CascadeStore(cold, block_spec=spec) as store:
            cold_ids = _ids(count, 2 * rnd)
            store.put_many(blocks, block_ids=cold_ids)
            store.flush()
            files = files_under(file_dir)
            cold_loop, cold_batch = _read_forms(store, cold_ids, outs)

            def make_cold(name: str, part: slice) -> None:  # every pass: the same settling read, then the drop
                zero(name, part)
                settle_reads(files)
                drop_page_cache(files)

            row.update(_interleaved_us({"cold_get_loop_us": cold_loop, "cold_get_batch_us": cold_batch},
                                       count, rnd, before=make_cold, after=checker("cold")))
            row["cold_wrong"] = wrong["cold"]
            row["cold_read_mode"] = store.tiers[0].read_mode
    finally:
        shutil.rmtree(file_dir, ignore_errors=True)
    return row


def run(options: dict[str, Any]) -> dict[str, Any]:
    sizes = options.get("sizes") or DEFAULT_SIZES
    rounds = options.get("rounds") or 6  # a multiple of 2 and 3: each form goes first as often (_interleaved_us)
    workdir = options.get("file_dir") or tempfile.gettempdir()
    rows = []
    for nbytes in sizes:
        count = options.get("blocks") or max(16, min(4096, BYTES_PER_PASS // nbytes))
        passes = [_one_round(nbytes, count, r, workdir) for r in range(rounds)]
        med = {k: statistics.median(p[k] for p in passes) for k in passes[0] if k.endswith("_us")}
        row = {"size": nbytes, "size_label": size_label(nbytes), "blocks": count, "rounds": rounds,
               "batch": BATCH, **{k: round(v, 3) for k, v in med.items()},
               "cold_read_mode": passes[0]["cold_read_mode"],
               "wrong": sum(p["hot_wrong"] + p["cold_wrong"] + p.get("torch_wrong", 0) for p in passes),
               "samples": passes}
        for name, (num, den) in RATIOS.items():  # each round's own ratio: its passes ran side by side
            per_round = [p[num] / p[den] for p in passes]
            row[name] = statistics.median(per_round)
            row[f"{name}_range"] = [min(per_round), max(per_round)]
        row["targets"] = {
            "get_vs_dict_le_3": row["get_vs_dict"] <= GET_TARGET if nbytes == 4 << 10 else None,
            "put_vs_dict_le_3": row["put_vs_dict"] <= PUT_TARGET if nbytes == 4 << 10 else None,
            "batch_never_slower": max(row["hot_get_batch_vs_loop"], row["put_batch_vs_loop"],
                                      row["cold_get_batch_vs_loop"]) <= 1.0}
        rows.append(row)
    return {"rows": rows, "load_average": os.getloadavg()}


def table(result: dict[str, Any]) -> str:
    lines = ["size     dict get/put us   cascade get/put us (x dict)     batch/loop hot get, put, cold get   "
             "put, fresh pages   CPU torch get/put us",
             "-------  ---------------   -----------------------------   ---------------------------------   "
             "----------------   --------------------"]
    for r in result["rows"]:
        torch_us = f"{r['torch_get_us']:7.1f} /{r['torch_put_us']:7.1f}" if "torch_get_us" in r else "    (no torch)"
        lines.append(
            f"{r['size_label']:<8} {r['dict_get_us']:6.1f} /{r['dict_put_us']:6.1f}   "
            f"{r['get_loop_us']:7.1f} ({r['get_vs_dict']:4.1f}x) /{r['put_loop_us']:7.1f} ({r['put_vs_dict']:4.1f}x)   "
            f"{r['hot_get_batch_vs_loop']:.2f}, {r['put_batch_vs_loop']:.2f}, {r['cold_get_batch_vs_loop']:.2f}"
            f"{'':21}{r['put_fresh_pages_us']:7.1f} ({r['put_fresh_pages_vs_dict']:4.1f}x)   {torch_us}"
            f"{'' if not r['wrong'] else '  WRONG BYTES: ' + str(r['wrong'])}")
    return "\n".join(lines)
