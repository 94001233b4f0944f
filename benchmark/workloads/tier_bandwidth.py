"""tier_bandwidth: put / get_into GB/s of each Cascade tier for 64 KiB - 64 MiB blocks.

Measured in one run beside this machine's limits: memcpy at the same size (over buffers
larger than the cache), and raw sequential write, O_DIRECT read (requests cut as the file
tier cuts them) and cold buffered read of a file on the file tier's file system, before
and after the tiers (the better of the two is the limit, for every ratio to it). Reported:

- per tier (gpu with numpy as array module — no GPU here —, shm, lustre): ``put`` and
  ``get_into`` GB/s (median of per-block times; lustre puts include their share of one
  fsync at the end, like the raw write limit), and ratios to memcpy (DRAM tiers);
- lustre gets are cold reads (page cache dropped first) in the tier's ``read_mode``
  (``auto``: O_DIRECT only on Lustre, buffered elsewhere; recorded in the row). Their
  whole-pass GB/s (all bytes / all get time, ``get_aggregate_gbps``) is compared with the
  raw read of the same mode (``raw_read_same_mode``; ratio
  ``lustre_cold_aggregate_vs_raw_same_mode``), and with both raw reads;
- the store's ``put`` including BLAKE3 content hashing, ratio to memcpy;
- the store's resident memory beyond its data (RSS outside the SHM slab), 64 KiB and 1 MiB blocks.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import numpy as np
from tqdm import tqdm

from cascade import CascadeStore, Config
from cascade.models import BlockSpec
from cascade.tiers.file_tier import FileTier
from cascade.tiers.gpu import GpuTier
from cascade.tiers.shm import ShmTier

from ..machine import drop_page_cache, files_under, memcpy_gbps, raw_file_gbps
from ..timing import gbps, summarize
from .common import size_label

SIZES = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def _blocks_for(size: int, total: int) -> int:
    return max(4, total // size)


def _tier_round(tier, spec: BlockSpec, n: int) -> dict[str, Any]:
    """Put n distinct blocks into a tier, then read each back with read_parts_into."""
    import time

    key, value = spec.empty_aligned()
    key[...] = 1
    value[...] = 2
    keys = [("bench", f"{i:032x}") for i in range(n)]
    put_s, get_s = [], []
    for k in keys:
        t0 = time.perf_counter()
        tier.put(k, [key, value])
        put_s.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    tier.sync()  # on disk before the cold reads, as the raw limit's fsync; spread over the puts
    sync_share = (time.perf_counter() - t0) / len(keys)
    put_s = [s + sync_share for s in put_s]
    cold = None
    if isinstance(tier, FileTier):  # a cold read: nothing of the files in the page cache
        cold = drop_page_cache(files_under(tier.directory))
    out_k, out_v = spec.empty_aligned()
    for k in keys:
        t0 = time.perf_counter()
        tier.read_parts_into(k, [out_k, out_v])
        get_s.append(time.perf_counter() - t0)
    assert np.array_equal(out_v.view(np.uint8), value.view(np.uint8))
    hot_s = []
    if cold is not None:  # read again: what a hot file-tier read costs (page cache or not)
        for k in keys:
            t0 = time.perf_counter()
            tier.read_parts_into(k, [out_k, out_v])
            hot_s.append(time.perf_counter() - t0)
    for k in keys:
        del tier[k]
    ps, gs = summarize(put_s[1:] or put_s), summarize(get_s[1:] or get_s)
    row = {"blocks": n, "put_gbps": gbps(spec.block_bytes, ps["median"]), "get_gbps": gbps(spec.block_bytes, gs["median"]),
           # all blocks' bytes over all blocks' time: comparable to the raw sequential limits
           "get_aggregate_gbps": gbps(n * spec.block_bytes, sum(get_s)),
           "put_samples_s": put_s, "get_samples_s": get_s, "put": ps, "get": gs}
    if cold is not None:
        row.update(cold_method=cold["method"], read_mode=tier.read_mode,
                   hot_get_aggregate_gbps=gbps(n * spec.block_bytes, sum(hot_s)))
    return row


def _store_put_with_hashing(size: int, n: int, shm_dir: str) -> dict[str, Any]:
    """CascadeStore.put of n distinct blocks (ids computed by BLAKE3) into SHM."""
    import time

    spec = BlockSpec.flat(size)
    cfg = Config(shm_bytes=(n + 2) * size + (1 << 20), file_bytes=0, shm_dir=shm_dir)
    with CascadeStore(cfg, block_spec=spec) as store:
        key, value = spec.empty_aligned()
        key[...] = 3
        value[...] = 4
        samples = []
        for i in range(n):
            key[:8] = np.frombuffer(np.int64(i).tobytes(), dtype=np.uint8)  # distinct content
            t0 = time.perf_counter()
            store.put(key, value)
            samples.append(time.perf_counter() - t0)
        assert store.stats()["stored"] == n
    s = summarize(samples[1:])
    return {"blocks": n, "put_gbps": gbps(size, s["median"]), "put": s, "samples_s": samples}


def _rss_split(slab_path: str | None) -> tuple[int, int]:
    """(resident bytes outside the slab mapping, resident bytes of the slab) of this
    process, from /proc/self/smaps."""
    other = slab = 0
    current_is_slab = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if not head:
                continue
            if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):  # a mapping's header
                current_is_slab = slab_path is not None and len(head) >= 6 and head[5] == slab_path
            elif head[0] == "Rss:":
                kib = int(head[1]) << 10
                if current_is_slab:
                    slab += kib
                else:
                    other += kib
    return other, slab


def memory_overhead(sizes: tuple[int, ...] = (64 << 10, 1 << 20), data_bytes: int = 256 << 20,
                    shm_dir: str = "/dev/shm") -> dict[str, Any]:
    """Resident memory the store adds beyond its data (SHM tier): RSS outside the slab
    mapping after the puts minus before the store opened. The slab itself (sized by the
    user, 2x the data here) is reported apart, never counted as overhead or as data."""
    rows = []
    for block_bytes in sizes:
        spec = BlockSpec.flat(block_bytes)
        key, value = spec.empty()
        key[...] = 5
        value[...] = 6
        blocks = max(16, data_bytes // block_bytes)
        cfg = Config(shm_bytes=2 * blocks * block_bytes, file_bytes=0, shm_dir=shm_dir)
        before, _ = _rss_split(None)
        with CascadeStore(cfg, block_spec=spec) as store:
            path = getattr(store.tiers[0], "path", None)
            for i in range(blocks):
                key[:8] = np.frombuffer(np.int64(i).tobytes(), dtype=np.uint8)
                store.put(key, value)
            assert store.stats()["stored"] == blocks
            after, slab = _rss_split(path)
        data = blocks * block_bytes
        overhead = after - before
        rows.append({"block_bytes": block_bytes, "blocks": blocks, "data_bytes": data,
                     "slab_bytes": cfg.shm_bytes, "slab_resident_bytes": slab, "overhead_bytes": overhead,
                     "overhead_bytes_per_block": overhead / blocks, "overhead_fraction": overhead / data})
    # top level: the largest block size's row (the field names of the earlier single figure)
    return {**rows[-1], "method": "RSS outside the SHM slab mapping (smaps) after the puts minus before the store "
                                  "opened; slab capacity = 2 x data and reported separately",
            "rows": rows}


def run(options: dict[str, Any]) -> dict[str, Any]:
    """Run the sweep. Options: ``sizes`` (bytes), ``total_bytes`` per size and tier,
    ``file_dir`` (file-tier directory; a temp dir under it is used and removed)."""
    sizes = options.get("sizes") or SIZES
    total = int(options.get("total_bytes") or 256 << 20)
    base = options.get("file_dir") or Config().file_dir
    os.makedirs(base, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="tier_bw_", dir=base)
    rows = []
    try:
        for size in tqdm(sizes, desc="tier_bandwidth", unit="size"):
            spec = BlockSpec.flat(size)
            n = _blocks_for(size, total)
            capacity = n * (size + 2 * 4096) + (4 << 20)
            row: dict[str, Any] = {"block_bytes": size, "memcpy": memcpy_gbps(size),
                                   "raw_file": raw_file_gbps(workdir, size, n * size)}
            read_mode = options.get("file_read_mode") or "auto"
            tiers = {
                "gpu": GpuTier(capacity, np),
                "shm": ShmTier(capacity),
                "lustre": FileTier(capacity, os.path.join(workdir, "agg"), segment_bytes=max(1 << 30, 2 * size),
                                   read_mode=read_mode),
            }
            for name, tier in tiers.items():
                try:
                    row[name] = _tier_round(tier, spec, n)
                finally:
                    tier.close()
            row["store_put_hashed"] = _store_put_with_hashing(size, n, "/dev/shm")
            row["raw_file_after"] = raw_file_gbps(workdir, size, n * size)  # the disk is shared: bracket the tiers
            add_ratios(row)
            rows.append(row)
        overhead = memory_overhead(data_bytes=max(8 << 20, total))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {"rows": rows, "memory_overhead": overhead, "notes": [
        "gpu tier measured with numpy as its array module: no GPU on this machine",
        "lustre tier on the local file system (no Lustre here); gets are cold reads (page cache dropped "
        "first) in the tier's read_mode (auto: buffered off Lustre, one preadv of header and payload per "
        "record); lustre_cold_aggregate_vs_raw_same_mode compares whole-pass GB/s with the better of the "
        "two raw reads of that mode (before / after the tiers)",
    ]}


def add_ratios(row: dict[str, Any]) -> None:
    """Fill ``raw_read_same_mode`` and ``ratios`` of a measured row; every raw limit is the
    better of its measurements before and after the tiers (conservative ratios)."""
    def raw(key: str) -> float:
        return max(row["raw_file"][key], row["raw_file_after"][key])

    mem = row["memcpy"]["gbps"]
    raw_od, raw_buf = raw("read_gbps"), raw("buffered_cold_read_gbps")
    mode = row["lustre"]["read_mode"]
    same = raw_od if mode == "direct" else raw_buf
    row["raw_read_same_mode"] = {"read_mode": mode, "gbps": same,
                                 "limit": "raw_odirect_read" if mode == "direct" else "raw_buffered_cold_read"}
    cold = row["lustre"]["get_aggregate_gbps"]
    row["ratios"] = {
        "gpu_numpy_get_vs_memcpy": row["gpu"]["get_gbps"] / mem,
        "shm_get_vs_memcpy": row["shm"]["get_gbps"] / mem,
        "shm_put_vs_memcpy": row["shm"]["put_gbps"] / mem,
        **_vs_streamed(row),
        "store_put_hashed_vs_memcpy": row["store_put_hashed"]["put_gbps"] / mem,
        "lustre_put_vs_raw_write": row["lustre"]["put_gbps"] / raw("write_gbps"),
        # whole-pass GB/s against the better raw read of the same mode, and of each mode
        "lustre_cold_aggregate_vs_raw_same_mode": cold / same,
        "lustre_cold_aggregate_vs_raw_odirect_read": cold / raw_od,
        "lustre_cold_aggregate_vs_raw_buffered_cold_read": cold / raw_buf,
        "lustre_cold_aggregate_vs_best_raw_read": cold / max(raw_od, raw_buf),
    }


def _vs_streamed(row: dict[str, Any]) -> dict[str, float]:
    """SHM gets and puts against the streamed copy of the same size (the faster way to
    memory here: :func:`~benchmark.machine.memcpy_gbps`), where it was measured."""
    streamed = row["memcpy"].get("streamed_gbps")
    if not streamed:
        return {}
    return {"shm_get_vs_streamed_copy": row["shm"]["get_gbps"] / streamed,
            "shm_put_vs_streamed_copy": row["shm"]["put_gbps"] / streamed}


def table(result: dict[str, Any]) -> str:
    """A compact text table of the sweep."""
    lines = [f"{'block':>8} {'memcpy':>7} {'rawrd':>6} {'gpu p/g':>11} {'shm p/g':>11} {'lustre p/g':>11} {'put+hash':>8}  ratios shm_get/mem lustre_pass/raw_same_mode put+hash/mem"]
    for r in result["rows"]:
        lines.append(
            f"{r['block_bytes'] >> 10:>6}Ki {r['memcpy']['gbps']:>7.2f} {r['raw_file']['read_gbps']:>6.2f} "
            f"{r['gpu']['put_gbps']:>5.2f}/{r['gpu']['get_gbps']:<5.2f} {r['shm']['put_gbps']:>5.2f}/{r['shm']['get_gbps']:<5.2f} "
            f"{r['lustre']['put_gbps']:>5.2f}/{r['lustre']['get_gbps']:<5.2f} {r['store_put_hashed']['put_gbps']:>8.2f}  "
            f"{r['ratios']['shm_get_vs_memcpy']:.2f} {r['ratios']['lustre_cold_aggregate_vs_raw_same_mode']:.2f} "
            f"{r['ratios']['store_put_hashed_vs_memcpy']:.2f}")
    for r in result["rows"]:
        ratios = r["ratios"]
        lines.append(f"lustre cold {size_label(r['block_bytes'])} ({r['lustre'].get('read_mode', '?')}): "
                     f"{r['lustre']['get_aggregate_gbps']:.2f} GB/s whole pass = "
                     f"{ratios['lustre_cold_aggregate_vs_raw_same_mode']:.2f}x the raw read of that mode, "
                     f"{ratios['lustre_cold_aggregate_vs_raw_odirect_read']:.2f}x raw O_DIRECT, "
                     f"{ratios['lustre_cold_aggregate_vs_raw_buffered_cold_read']:.2f}x raw buffered cold, "
                     f"{ratios['lustre_cold_aggregate_vs_best_raw_read']:.2f}x the better; hot "
                     f"{r['lustre']['hot_get_aggregate_gbps']:.2f} GB/s")
    for m in result["memory_overhead"]["rows"]:
        lines.append(f"memory overhead at {m['block_bytes'] >> 10} KiB blocks: {m['overhead_bytes_per_block']:.0f} B/block "
                     f"({m['overhead_fraction']:.2%} of {m['data_bytes'] >> 20} MiB data; slab {m['slab_bytes'] >> 20} MiB apart)")
    return "\n".join(lines)
