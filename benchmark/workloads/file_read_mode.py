"""file_read_mode: cold file-tier reads in each read mode against the disk's raw cold reads,
the measurement behind the file tier's ``auto`` mode off Lustre.

Per block size (key + value; default 64 KiB, 2 MiB, 16 MiB) and round: one file tier is
written (``blocks`` blocks, flushed) and the same bytes in one plain file (the raw
file), then ten timed passes read them cold: one of the tier's records without the
store (below), one of batches in turn (below), and the tier in each mode (``buffered``,
``direct``; a store opened for the pass) and the raw file in each raw way, each in two
forms: ``loop`` (``get_into`` one by one, 1 request in flight) and ``batch``
(``get_many_into`` at the store's default depth, ``batch_workers`` in each row: up to
``io_threads`` = 4 workers, at most the spare cores, :func:`~cascade.core.pools.spare_cores`;
one on this 2-core machine, where the batch then runs inline). The raw reads give the
limits at the same depths: raw O_DIRECT ``preadv`` cut into the requests the tier uses,
and raw buffered cold ``preadv`` (kernel readahead on). Until this version the batch
forced 4 workers on both sides: on 2 cores four threads of Cascade's per-block Python
work fought over the interpreter lock and the cores (a depth the store never picks
here), and its 64 KiB batch ran at half its loop's rate (18 rounds at load 7-10: 0.20
vs 0.39 of the best raw read), while raw threads spend their time in ``preadv``.

The tenth pass (``buffered_batches``, the default read mode only) reads the same stream a
batch at a time: ``get_many_into`` calls of :data:`BATCH_CALL_BLOCKS` blocks in turn, as an
engine loading a long prefix does, against the raw reads at the batch's depth and, round by
round, against the buffered loop (``time_vs_loop``: a block's time in the batches over its
time in the loop; issue 20 wants it at most 1). Each call starts what the kernel is told of
its records afresh (:meth:`~cascade.tiers.file_tier.FileTier.will_read`), which the one-call
``batch`` pass never shows.

The ninth pass reads the tier's own records without the store (``records loop``): the
tier's read function (:func:`~cascade.tiers.record_io.read_hashed`, header page and
payload in one stream, hashed as they land, checked against each record's checksum)
record by record into the same outputs, from the paths and offsets the tier gives
(:meth:`~cascade.tiers.file_tier.FileTier.record_span`). ``records_loop.vs_best_raw``
is then what the format and its syscalls reach, and ``buffered_loop_vs_records`` what
the store's per-get path (lookup, lease, in-flight count, hit counting, each a Python
call) keeps of it: two separate causes of a gap to the raw reads.

The layouts differ only by Cascade's own format: the raw file holds the blocks back to
back in the order they are read; the tier's files hold them as records in the order
written (the order read, up to the few puts in flight at once), each behind a 4 KiB
header (read, not counted: 6 % more bytes at 64 KiB), in ``seal_bytes`` segments (here 2).

Raw and Cascade passes are treated alike:
- Cold means evicted from the page cache (:func:`~benchmark.machine.drop_page_cache`)
  right before every pass, raw or not: every file of the round, the raw file and the
  tier's, not only those the pass reads (:func:`_make_cold`); the output buffers are
  zeroed before every pass (untimed), so no pass pays their first touch. Until this
  version only the pass's own files were dropped, so a pass that followed one over the
  other side's file ran with that file's 256 MiB still in the page cache. The round
  orders are fixed per round index (:func:`_passes`), and in all three of the suite's
  rounds at 64 KiB Cascade's buffered batch came right after a raw pass: it ran at
  0.47-0.58 GB/s with 1.5 CPU s/GB, 57 % of its samples in the kernel's copy out of the
  page cache (``_copy_to_iter``, ``perf record`` of that pass alone), against 20 % for
  its loop. With every file dropped, in two runs of three rounds each (load 1-2): its
  batch 1.12 and 0.88 GB/s at 0.72 and 0.99 CPU s/GB, against 0.49 and 0.54 GB/s at 1.5
  in two runs without (alternated in one sitting); its loop and the raw reads moved
  within their spread.
- Every pass is preceded by one untimed buffered read through the files it reads
  (:func:`~benchmark.machine.settle_reads`), then the drop: that read leaves nothing
  in the page cache, but it sets up what is below it the same way for every pass.
  On this VM a buffered cold pass right after a buffered read of the same file ran
  much faster and with far less
  CPU than after anything else (shuffled rounds of the previous version, 18 rounds per
  size at load 7-10, medians: raw 64 KiB 0.83 vs 0.33 GB/s, 0.44 vs 1.43 CPU s/GB;
  Cascade 64 KiB 0.27 vs 0.15, 2 MiB 1.17 vs 0.37; O_DIRECT passes showed no such
  effect); the first cold read of freshly written bytes was slower still (11 fresh
  256 MiB writes, buffered loop at 2 MiB: first pass median 0.88 GB/s, second 1.28; a
  file tier of 2048 64 KiB records read one by one: 0.09 GB/s first, then 0.85-0.99).
  Earlier versions read each file through once per round and then ran each side's
  passes in a row, Cascade's before the raw file was even written: Cascade's buffered
  loop always came right after that read and its buffered batch right after its loop,
  while raw buffered passes always came after a raw O_DIRECT pass; that order favoured
  Cascade's buffered reads over the raw buffered limit, most at 64 KiB and 2 MiB.
  The settling read before each pass does not remove the machine's own spread: in 9
  rounds at load 6-9 the raw buffered read at depth 1 ran in both the loop and the
  batch slot of a round (one worker per batch here), and the two differed by 1.5x or
  more in 14 of 27 rounds (64 KiB: 0.29 vs 1.75 GB/s; 2 MiB: 0.45 vs 1.38; 16 MiB:
  0.42 vs 1.68), the slow one taking 0.9-2.2 CPU s/GB against 0.2-0.4: such passes
  are this VM's, raw or Cascade's alike.
- What slows such a pass is the kernel copying from the page cache, raw or Cascade's
  alike: under ``perf record -g`` of six raw buffered passes at 2 MiB (four of them slow,
  0.44-0.49 GB/s at 1.6-2.0 kernel CPU s/GB), 22 % of all samples sat in
  ``_copy_to_iter`` (``filemap_read`` <- ``preadv``), about 8x what the same bytes take at
  memory speed; ``/proc/stat`` showed no steal time, and the free-page-reporting
  counter (``/sys/module/page_reporting``) did not move during any pass. This VM both
  pages out cold memory in the background (a DAMON ``pageout`` scheme) and reports free
  memory to its host (:func:`~benchmark.machine.memory_giveback`, in every result's
  machine facts): the likeliest cause is the first guest use of page-cache pages that the
  host backs anew, not proven here. So each row also
  gives every read's fastest pass over the rounds (``fastest_gbps``) and
  ``fastest_vs_best_raw``: the fastest Cascade pass over the fastest raw pass of either
  way, every pass timed the same way: what each side reaches when the VM does not stall
  it. The medians stay the figures of record; the kernel CPU of each pass is kept
  (``sys_s_per_gb`` in each sample).
- The ten passes run in an order shuffled per round (``order`` in each sample), so
  neither side always runs in the same stretch of time or beside the same neighbours.
- The settling read is not what slowed the 16 MiB buffered batch of the suite at
  ccf2a27 (0.88-1.33 s/GB in 8 of 9 rounds, bisected to the change that added it): 18
  shuffled rounds (6 runs, load 7-10) gave it 0.23-0.31 s/GB (medians per run), like
  the loop.

Every ratio divides a whole-pass rate by the better raw cold read at the same depth
(``vs_best_raw``), in the same round; medians and min-max over rounds. Where the two raw
ways run at about the same rate, the better of two noisy readings in each round sits
above both ways' own rates: over the suites at 8238f48, d90e8ca, a642b43 and 9cffeee,
the median of the per-round better reading exceeded the better way's median rate by
0-13 % at 2 and 16 MiB (0 % at 64 KiB, where buffered leads clearly), and each ratio
above read low by about as much. So each cell also gives ``vs_better_raw``: the ratio, round by
round, to the one raw way (``better_raw``) whose median rate over the rounds is higher,
the limit the issue names (max of the two ways' rates), read without that bias.
``vs_best_raw`` stays the figure of record. Each pass also
gives the CPU seconds the process spent per GB read (``cpu_s_per_gb``, all threads,
kernel time included): a figure that other work on the machine disturbs far less than
wall time. Blocks are checked byte-exact.
"""
from __future__ import annotations

import os
import random
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from cascade import CascadeStore, Config
from cascade.core.pools import spare_cores
from cascade.identity import DEFAULT_NAMESPACE
from cascade.models import BlockSpec
from cascade.tiers.record_io import output_views, read_hashed
from cascade.tiers.records import HEADER_BYTES, key_seed

from ..machine import _aligned, drop_page_cache, files_under, raw_read_threads, settle_reads, write_file
from .blockio import size_label

DEFAULT_SIZES = [64 << 10, 2 << 20, 16 << 20]
BYTES_PER_SIZE = 256 << 20
MODES = ("buffered", "direct")
RAW_HOWS = ("odirect", "buffered_cold")
FORMS = ("loop", "batch")
#: Blocks per ``get_many_into`` call of the ``batches`` pass (as benchmark small_blocks' batches).
BATCH_CALL_BLOCKS = 64
TARGET = 0.9


def _aligned_pair(spec: BlockSpec) -> tuple[np.ndarray, np.ndarray]:
    half = spec.half_bytes
    buf = np.frombuffer(_aligned(2 * half), dtype=np.uint8)
    return buf[:half], buf[half:]


def _clear(outs: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """Zero every output buffer before a timed pass: no pass pays the first touch of the
    buffers' pages (the first one did, and it ran Cascade's buffered loop), and the
    byte-exact check sees only what that pass wrote."""
    for pair in outs:
        for out in pair:
            out.fill(0)


def _wrong(hits: list[bool], outs: list[tuple[np.ndarray, np.ndarray]], blocks: list[tuple[np.ndarray, np.ndarray]]) -> int:
    """Blocks a pass missed or read other bytes of."""
    return sum(not (h and np.array_equal(o[0], b[0]) and np.array_equal(o[1], b[1]))
               for h, o, b in zip(hits, outs, blocks))


def _make_cold(outs: list[tuple[np.ndarray, np.ndarray]], reads: list[str], every: list[str]) -> None:
    """Before a timed pass: ``outs`` zeroed, the files the pass ``reads`` settled
    (:func:`~benchmark.machine.settle_reads`), then ``every`` file of the round (raw and
    tier alike) dropped from the page cache, so no pass starts with the other side's
    file resident."""
    _clear(outs)
    settle_reads(reads)
    drop_page_cache(every)


def _tier_pass(row: dict[str, Any], name: str, gb: float, file_dir: str, every: list[str],
               outs: list[tuple[np.ndarray, np.ndarray]], read: Callable[[], list[bool]]) -> list[bool]:
    """One cold timed pass over the tier's files (:func:`_make_cold`, ``every``: all the
    round's files), then ``read()`` timed; its GB/s and CPU and kernel seconds per GB go
    into ``row`` as ``<name>_gbps`` and so on. What ``read`` returned."""
    _make_cold(outs, files_under(file_dir), every)
    started, cpu, sys_cpu = time.perf_counter(), time.process_time(), _kernel_seconds()
    hits = read()
    row[f"{name}_gbps"] = gb / (time.perf_counter() - started)
    row[f"{name}_cpu_s_per_gb"] = (time.process_time() - cpu) / gb
    row[f"{name}_sys_s_per_gb"] = (_kernel_seconds() - sys_cpu) / gb
    return hits


def _kernel_seconds() -> float:
    """CPU seconds this process (all its threads) has spent in the kernel."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def _passes(seed: int) -> list[tuple[str, str, str]]:
    """A round's timed passes, (side, how, form), in an order shuffled by ``seed``: no
    side or mode always runs first after the settling read, or beside the same
    neighbours (see the module docstring)."""
    passes = [(side, how, form) for form in FORMS
              for side, hows in (("cascade", MODES), ("raw", RAW_HOWS)) for how in hows]
    passes.append(("records", "buffered", "loop"))
    passes.append(("cascade", "buffered", "batches"))
    random.Random(seed).shuffle(passes)
    return passes


def _read_records(spans: list[tuple[str, int, int, int]], seeds: list[int],
                  outs: list[tuple[np.ndarray, np.ndarray]]) -> list[bool]:
    """The tier's own buffered read of each record (:func:`~cascade.tiers.record_io.read_hashed`:
    header page, payload, XXH3 as it lands) into ``outs``, one by one, without the store
    or the tier around it; whether each digest matched its record's checksum."""
    lead = memoryview(bytearray(HEADER_BYTES))
    fds: dict[str, int] = {}
    try:
        matched = []
        for (path, offset, length, digest), seed, pair in zip(spans, seeds, outs):
            if path not in fds:
                fds[path] = os.open(path, os.O_RDONLY)
            views, _ = output_views(pair)
            ok, got = read_hashed(fds[path], offset, length, views, seed, lead)
            matched.append(ok and got == digest)
        return matched
    finally:
        for fd in fds.values():
            os.close(fd)


def _reads(store: CascadeStore, form: str, ids: list[str], outs: list[tuple[np.ndarray, np.ndarray]]
           ) -> Callable[[], list[bool]]:
    """A Cascade pass over every block in ``form``: ``loop`` (``get_into`` one by one),
    ``batch`` (one ``get_many_into`` of them all, at the store's own depth) or ``batches``
    (``get_many_into`` calls of :data:`BATCH_CALL_BLOCKS` in turn: a stream read a batch
    at a time). Each returns a hit per block."""
    if form == "loop":
        return lambda: [store.get_into(b, *o) for b, o in zip(ids, outs)]
    if form == "batch":
        return lambda: store.get_many_into(ids, outs)
    step = BATCH_CALL_BLOCKS
    return lambda: [hit for i in range(0, len(ids), step) for hit in store.get_many_into(ids[i:i + step], outs[i:i + step])]


def batch_depth() -> int:
    """Workers the store's default gives a big batch here (:class:`~cascade.core.pools.Pools`)."""
    return min(Config().io_threads, spare_cores())


def _round(nbytes: int, count: int, seed: int, workdir: str) -> dict[str, Any]:
    spec = BlockSpec.flat(nbytes)
    gb = count * nbytes / 1e9  # read per pass
    rng = np.random.default_rng(seed)
    blocks = [(rng.integers(0, 255, spec.shape, dtype=np.uint8), rng.integers(0, 255, spec.shape, dtype=np.uint8))
              for _ in range(count)]
    ids = [f"{seed:08x}{i:024x}" for i in range(count)]
    outs = [_aligned_pair(spec) for _ in range(count)]
    work = tempfile.mkdtemp(prefix="readmode-", dir=workdir)
    row: dict[str, Any] = {}
    try:
        file_dir = os.path.join(work, "tier")
        base = dict(shm_bytes=0, remote_bytes=0, file_bytes=2 * count * (nbytes + 8192) + (64 << 20),
                    file_dir=file_dir, promote_on_hit=False)
        with CascadeStore(Config(**base), block_spec=spec) as store:
            store.put_many(blocks, block_ids=ids)
            store.flush()
            spans = [store.tiers[0].record_span((DEFAULT_NAMESPACE, b)) for b in ids]
        seeds = [key_seed(DEFAULT_NAMESPACE, b) for b in ids]
        raw = os.path.join(work, "raw.bin")
        write_file(raw, (part for pair in blocks for part in pair))
        os.sync()
        every = [*files_under(file_dir), raw]
        order = _passes(seed)
        row["order"] = [f"{side} {how} {form}" for side, how, form in order]
        for side, how, form in order:
            if side == "records":
                hits = _tier_pass(row, "records_loop", gb, file_dir, every, outs,
                                  lambda: _read_records(spans, seeds, outs))
                row["records_loop_wrong"] = _wrong(hits, outs, blocks)
                continue
            if side == "raw":
                _make_cold(outs, [raw], every)
                cpu, sys_cpu = time.process_time(), _kernel_seconds()
                depth = 1 if form == "loop" else batch_depth()
                row[f"raw_{how}_{form}_gbps"] = raw_read_threads(raw, outs, depth, how)["gbps"]
                row[f"raw_{how}_{form}_cpu_s_per_gb"] = (time.process_time() - cpu) / gb
                row[f"raw_{how}_{form}_sys_s_per_gb"] = (_kernel_seconds() - sys_cpu) / gb
                continue
            with CascadeStore(Config(**base, file_read_mode=how), block_spec=spec) as store:
                row[f"{how}_odirect_used"] = store.tiers[0].read_mode == "direct"
                hits = _tier_pass(row, f"{how}_{form}", gb, file_dir, every, outs, _reads(store, form, ids, outs))
            row[f"{how}_{form}_wrong"] = _wrong(hits, outs, blocks)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return row


def _better_raw(samples: list[dict[str, Any]], form: str) -> str:
    """The raw way (of :data:`RAW_HOWS`) whose median rate over ``samples`` is the higher
    in ``form``."""
    return max(RAW_HOWS, key=lambda how: statistics.median(s[f"raw_{how}_{form}_gbps"] for s in samples))


def _vs_better_raw(rates: list[float], samples: list[dict[str, Any]], form: str, how: str) -> dict[str, Any]:
    """``rates`` (one per round) over raw way ``how``'s rate in the same round: median,
    min-max and the way (the module docstring: the limit without the per-round bias)."""
    ratios = [r / s[f"raw_{how}_{form}_gbps"] for r, s in zip(rates, samples)]
    return {"vs_better_raw": statistics.median(ratios), "vs_better_raw_range": [min(ratios), max(ratios)],
            "better_raw": how}


def _cell(samples: list[dict[str, Any]], name: str, raw_form: str, better: str) -> dict[str, Any]:
    """The figures of Cascade's pass ``name`` over the rounds ``samples``, against the raw
    reads of ``raw_form`` (at the same depth): ``better`` is the raw way with the higher
    median rate there (:func:`_better_raw`)."""
    rates = [s[f"{name}_gbps"] for s in samples]
    ratios = [r / max(s[f"raw_odirect_{raw_form}_gbps"], s[f"raw_buffered_cold_{raw_form}_gbps"])
              for r, s in zip(rates, samples)]
    fastest = max(rates)
    fastest_raw = max(max(s[f"raw_odirect_{raw_form}_gbps"], s[f"raw_buffered_cold_{raw_form}_gbps"]) for s in samples)
    return {"gbps": statistics.median(rates),
            "vs_best_raw": statistics.median(ratios),
            "vs_best_raw_range": [min(ratios), max(ratios)],
            **_vs_better_raw(rates, samples, raw_form, better),
            "fastest_gbps": fastest,
            "fastest_vs_best_raw": fastest / fastest_raw,
            "cpu_s_per_gb": statistics.median(s[f"{name}_cpu_s_per_gb"] for s in samples),
            "wrong": sum(s[f"{name}_wrong"] for s in samples)}


def run(options: dict[str, Any]) -> dict[str, Any]:
    sizes = options.get("sizes") or DEFAULT_SIZES
    rounds = options.get("rounds") or 3
    workdir = options.get("file_dir") or tempfile.gettempdir()
    rows = []
    for nbytes in sizes:
        count = options.get("blocks") or max(16, BYTES_PER_SIZE // nbytes)
        samples = [_round(nbytes, count, r, workdir) for r in range(rounds)]
        row: dict[str, Any] = {"size": nbytes, "size_label": size_label(nbytes), "blocks": count, "rounds": rounds,
                               "samples": samples}
        better = {form: _better_raw(samples, form) for form in FORMS}
        for mode in MODES:
            for form in FORMS:
                row[f"{mode}_{form}"] = _cell(samples, f"{mode}_{form}", form, better[form])
        row["buffered_batches"] = _cell(samples, "buffered_batches", "batch", better["batch"])
        per_block = [s["buffered_loop_gbps"] / s["buffered_batches_gbps"] for s in samples]  # time a block, batches / loop
        row["buffered_batches"].update(time_vs_loop=statistics.median(per_block),
                                       time_vs_loop_range=[min(per_block), max(per_block)])
        for form in FORMS:
            for how in RAW_HOWS:
                row[f"raw_{how}_{form}_gbps"] = statistics.median(s[f"raw_{how}_{form}_gbps"] for s in samples)
                row[f"raw_{how}_{form}_cpu_s_per_gb"] = statistics.median(
                    s[f"raw_{how}_{form}_cpu_s_per_gb"] for s in samples)
                row[f"raw_{how}_{form}_fastest_gbps"] = max(s[f"raw_{how}_{form}_gbps"] for s in samples)
        records = [s["records_loop_gbps"] for s in samples]
        row["records_loop"] = {
            "gbps": statistics.median(records),
            "vs_best_raw": statistics.median(r / max(s["raw_odirect_loop_gbps"], s["raw_buffered_cold_loop_gbps"])
                                             for r, s in zip(records, samples)),
            **_vs_better_raw(records, samples, "loop", better["loop"]),
            "buffered_loop_vs_records": statistics.median(s["buffered_loop_gbps"] / r for r, s in zip(records, samples)),
            "fastest_gbps": max(records),
            "cpu_s_per_gb": statistics.median(s["records_loop_cpu_s_per_gb"] for s in samples),
            "wrong": sum(s["records_loop_wrong"] for s in samples)}
        row["odirect_available"] = all(s["direct_odirect_used"] for s in samples)
        row["batch_workers"] = batch_depth()
        rows.append(row)
    return {"rows": rows, "load_average": os.getloadavg(), "target_vs_best_raw": TARGET}


def table(result: dict[str, Any]) -> str:
    lines = ["size     form   raw odirect / buffered cold GB/s   buffered (x best raw, x better raw way)   direct (x best raw)"
             "   fastest passes, buffered / direct (x fastest raw)   CPU s/GB raw buffered / buffered / direct"]
    for r in result["rows"]:
        rec = r["records_loop"]
        lines.append(f"{r['size_label']:<8} the tier's records read without the store, loop: {rec['gbps']:.2f} GB/s "
                     f"({rec['vs_best_raw']:.2f}x best raw; buffered loop {rec['buffered_loop_vs_records']:.2f}x of it), "
                     f"CPU {rec['cpu_s_per_gb']:.3f} s/GB")
        for form in FORMS:
            b, d = r[f"buffered_{form}"], r[f"direct_{form}"]
            lines.append(f"{r['size_label']:<8} {form:<6} {r[f'raw_odirect_{form}_gbps']:8.2f} / "
                         f"{r[f'raw_buffered_cold_{form}_gbps']:5.2f}               "
                         f"{b['gbps']:5.2f} ({b['vs_best_raw']:.2f}, {b['vs_better_raw']:.2f} {b['better_raw']:<13})"
                         f"          {d['gbps']:5.2f} ({d['vs_best_raw']:.2f})"
                         f"          {b['fastest_gbps']:5.2f} ({b['fastest_vs_best_raw']:.2f}) / "
                         f"{d['fastest_gbps']:5.2f} ({d['fastest_vs_best_raw']:.2f})"
                         f"                     {r[f'raw_buffered_cold_{form}_cpu_s_per_gb']:.3f} / "
                         f"{b['cpu_s_per_gb']:.3f} / {d['cpu_s_per_gb']:.3f}")
        s = r["buffered_batches"]
        lines.append(f"{r['size_label']:<8} buffered, get_many_into of {BATCH_CALL_BLOCKS} blocks a call in turn: "
                     f"{s['gbps']:.2f} GB/s ({s['vs_best_raw']:.2f}x best raw batch read), a block's time "
                     f"{s['time_vs_loop']:.2f}x the loop's, CPU {s['cpu_s_per_gb']:.3f} s/GB")
    return "\n".join(lines)
