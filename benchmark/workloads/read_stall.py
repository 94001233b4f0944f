"""read_stall: whether a cold file-tier scan, or a compaction, holds up the other calls of
the same store.

One store, an SHM tier and a file tier, as an engine's rank runs it: a few hot blocks in
the SHM tier (what a decoding step reads) and ``blocks`` blocks of each size (default
64 KiB; 256 MiB of them) in the file tier alone. A ``prober`` thread gets the hot blocks
one at a time (``get_into``, one every :data:`PROBE_GAP_S`) and times each get. Per
round it runs while nothing else happens (``alone``); beside a cold scan of the file
tier by another thread (its files dropped from the page cache first), ``get_into`` one
by one (``beside_loop``); beside a cold batch scan (``get_many_into`` of :data:`BATCH`
blocks a call, ``beside_batch``); and last beside the deletes of every other scanned
block, which leave the files they were written to (by a store opened before: none is
the active file) half dead, and so compacted (``beside_compaction``; ``compactions``:
how many ran, the fewest over the rounds). The scans read the blocks in a shuffled order
(seeded per round), not the order they were written in, as requests read the blocks of
their prefixes: a scan in written order is mostly served by the kernel's readahead,
ahead of the reads.

Each row gives the prober's p50, p99 and max per setting in microseconds (``probe_us``;
in the row, medians over rounds, with the p99's range beside each other thread's work)
and the scans' rates (``scan_gbps``). The interpreter lock, which the threads share, is
part of what a probe measures; probes alone can run slower than beside a scan (a core
idle between probes wakes up slower). A call that waits for the disk while it holds the
store's lock (which every get and put takes) shows as probes of milliseconds: until
session 34 a file-tier get of a record in the page cache read it in the store's locked
step with ``RWF_NOWAIT``, and such reads waited for the kernel's readahead they set off.
Until session 35 compaction copied a file's live records and fsynced them under the
store's lock (146 ms probes in the suite at 7ecac1b); now a thread of its own copies them
outside it, and ``beside_compaction`` runs until the compactions end (``flush()``). Every block a scan or the prober read is
checked byte-exact (``wrong``), and the row says whether every scanned block came from
the file tier (``*_scan_from_file_tier``).
"""
from __future__ import annotations

import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from cascade import CascadeStore, Config
from cascade.models import BlockSpec

from ..machine import drop_page_cache, files_under, settle_reads
from .blockio import size_label

DEFAULT_SIZES = [64 << 10]
BYTES_PER_SIZE = 256 << 20
HOT_BLOCKS = 8
PROBE_GAP_S = 200e-6  # between two probes: an engine's step does more than read
BATCH = 64
SETTINGS = ("alone", "beside_loop", "beside_batch", "beside_compaction")
SCANS = ("beside_loop", "beside_batch")


def _blocks(spec: BlockSpec, count: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, 255, spec.shape, dtype=np.uint8), rng.integers(0, 255, spec.shape, dtype=np.uint8))
            for _ in range(count)]


def _same(out: tuple[np.ndarray, np.ndarray], block: tuple[np.ndarray, np.ndarray]) -> bool:
    return np.array_equal(out[0], block[0]) and np.array_equal(out[1], block[1])


def _wrong(outs: list[tuple[np.ndarray, np.ndarray]], blocks: list[tuple[np.ndarray, np.ndarray]]) -> int:
    return sum(not _same(o, b) for o, b in zip(outs, blocks))


class Prober:
    """Gets of the hot blocks one at a time, each timed, until stopped."""

    def __init__(self, store: CascadeStore, ids: list[str], blocks: list[tuple[np.ndarray, np.ndarray]]) -> None:
        self.store, self.ids, self.blocks = store, ids, blocks
        self.outs = [(np.empty_like(k), np.empty_like(v)) for k, v in blocks]
        self.wrong = 0

    def during(self, work: Callable[[], None] | None, seconds: float) -> list[float]:
        """Probe while ``work`` runs in this thread (or for ``seconds`` when None):
        each get's time in microseconds."""
        times: list[float] = []
        stop = threading.Event()
        probing = threading.Thread(target=self._probe, args=(stop, times), name="read_stall-prober")
        probing.start()
        try:
            if work is None:
                time.sleep(seconds)
            else:
                work()
        finally:
            stop.set()
            probing.join()
        return times

    def _probe(self, stop: threading.Event, times: list[float]) -> None:
        i = 0
        while not (i and stop.is_set()):  # one probe at least
            k = i % len(self.ids)
            started = time.perf_counter()
            hit = self.store.get_into(self.ids[k], *self.outs[k])
            times.append((time.perf_counter() - started) * 1e6)
            if not hit or not _same(self.outs[k], self.blocks[k]):
                self.wrong += 1
            i += 1
            time.sleep(PROBE_GAP_S)


def _quantiles(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {"p50": statistics.median(ordered), "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            "max": ordered[-1], "probes": len(ordered)}


def _round(spec: BlockSpec, count: int, seed: int, workdir: str) -> dict[str, Any]:
    cold = _blocks(spec, count, seed)
    hot = _blocks(spec, HOT_BLOCKS, seed + 10**6)
    outs = [(np.empty_like(k), np.empty_like(v)) for k, v in cold]
    file_dir = tempfile.mkdtemp(prefix="stall-", dir=workdir)
    cfg = Config(shm_bytes=2 * HOT_BLOCKS * spec.block_bytes + (8 << 20), remote_bytes=0,
                 file_bytes=2 * count * (spec.block_bytes + 8192) + (64 << 20), file_dir=file_dir,
                 promote_on_hit=False, shm_prefault=True)
    cold_ids = [f"{seed:08x}{i:024x}" for i in range(count)]
    hot_ids = [f"{seed + 1:08x}{i:024x}" for i in range(HOT_BLOCKS)]
    gb = count * spec.block_bytes / 1e9
    row: dict[str, Any] = {"probe_us": {}, "scan_gbps": {}, "scan_file_tier_hits": {}, "wrong": 0}
    try:
        with CascadeStore(cfg.replace(shm_bytes=0), block_spec=spec) as writer:  # the scanned blocks: file tier alone
            writer.put_many(cold, block_ids=cold_ids)
            writer.flush()
        with CascadeStore(cfg, block_spec=spec) as store:  # reopened: they stay there; the hot ones go to SHM
            store.put_many(hot, block_ids=hot_ids)
            prober = Prober(store, hot_ids, hot)
            files = files_under(file_dir)

            order = [int(i) for i in np.random.default_rng(seed).permutation(count)]  # not the order written
            ids_in_order, outs_in_order = [cold_ids[i] for i in order], [outs[i] for i in order]

            def loop() -> None:
                for block_id, pair in zip(ids_in_order, outs_in_order):
                    store.get_into(block_id, *pair)

            def batch() -> None:
                for lo in range(0, count, BATCH):
                    store.get_many_into(ids_in_order[lo:lo + BATCH], outs_in_order[lo:lo + BATCH])

            def deletes() -> None:  # every other scanned block: their files half dead, compacted
                for block_id in cold_ids[::2]:
                    store.delete(block_id)
                store.flush()  # until the background compactions end

            for setting, work in zip(SETTINGS, (None, loop, batch, deletes)):
                for pair in outs:
                    pair[0].fill(0)
                    pair[1].fill(0)
                if work in (loop, batch):
                    settle_reads(files)
                    drop_page_cache(files)
                file_hits = store.stats()["tiers"]["file"]["hits"]
                started = time.perf_counter()
                times = prober.during(work, seconds=0.5)
                if work in (loop, batch):
                    row["scan_gbps"][setting] = gb / (time.perf_counter() - started)
                    row["scan_file_tier_hits"][setting] = store.stats()["tiers"]["file"]["hits"] - file_hits
                    row["wrong"] += _wrong(outs, cold)
                row["probe_us"][setting] = _quantiles(times)
            row["compactions"] = store.stats()["tiers"]["file"]["compactions"]
            row["probes_from_shm"] = store.stats()["tiers"]["shm"]["hits"]
            row["wrong"] += prober.wrong
    finally:
        shutil.rmtree(file_dir, ignore_errors=True)
    return row


def run(options: dict[str, Any]) -> dict[str, Any]:
    """Options: ``sizes`` (default 64 KiB), ``blocks`` per size (default 256 MiB of them),
    ``rounds`` (default 3), ``file_dir`` (default the temp directory), ``seed``."""
    sizes = options.get("sizes") or DEFAULT_SIZES
    rounds = options.get("rounds") or 3
    workdir = options.get("file_dir") or tempfile.gettempdir()
    seed = options.get("seed") or 0
    rows = []
    for nbytes in sizes:
        spec = BlockSpec.flat(nbytes)
        count = options.get("blocks") or max(16, BYTES_PER_SIZE // spec.block_bytes)
        samples = [_round(spec, count, seed + r, workdir) for r in range(rounds)]
        row: dict[str, Any] = {"size": nbytes, "size_label": size_label(nbytes), "blocks": count, "rounds": rounds,
                               "wrong": sum(s["wrong"] for s in samples), "samples": samples}
        for setting in SETTINGS:
            for q in ("p50", "p99", "max"):
                row[f"{setting}_{q}_us"] = statistics.median(s["probe_us"][setting][q] for s in samples)
        for setting in SETTINGS[1:]:
            row[f"{setting}_p99_us_range"] = [min(s["probe_us"][setting]["p99"] for s in samples),
                                              max(s["probe_us"][setting]["p99"] for s in samples)]
        for setting in SCANS:
            row[f"{setting}_scan_gbps"] = statistics.median(s["scan_gbps"][setting] for s in samples)
            row[f"{setting}_scan_from_file_tier"] = all(s["scan_file_tier_hits"][setting] == count for s in samples)
        row["compactions"] = min(s["compactions"] for s in samples)
        rows.append(row)
    return {"workload": "read_stall", "rows": rows, "probe_gap_s": PROBE_GAP_S, "batch": BATCH,
            "hot_blocks": HOT_BLOCKS}


def table(result: dict[str, Any]) -> str:
    lines = ["size      probe p50 / p99 / max us: alone | beside a cold loop | beside a cold batch | "
             "beside compactions    scan GB/s (loop, batch)  wrong"]
    for r in result["rows"]:
        cells = " | ".join(f"{r[f'{s}_p50_us']:.0f} / {r[f'{s}_p99_us']:.0f} / {r[f'{s}_max_us']:.0f}"
                           for s in SETTINGS)
        lines.append(f"{r['size_label']:9s} {cells}    {r['beside_loop_scan_gbps']:.2f}, "
                     f"{r['beside_batch_scan_gbps']:.2f}    {r['wrong']}")
    return "\n".join(lines)
