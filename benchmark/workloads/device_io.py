"""device_io: Cascade with GPU buffers beside the raw copies of the same GPU, in one run.

Per block size (key + value; default 64 KiB, 2 MiB, 16 MiB), single calls and batches of
64, median over rounds, cupy device arrays as the caller's buffers:

* limits: device-to-device ``cudaMemcpyAsync`` (``raw_d2d``), host<->device from pinned
  memory (``raw_pinned_h2d`` / ``raw_pinned_d2h``) and from pageable numpy memory
  (``raw_pageable_h2d`` / ``raw_pageable_d2h``), each timed to a stream synchronize;
* Cascade: ``put`` and ``get_into`` within the GPU tier (``gpu_put``, ``gpu_get``; vs
  raw_d2d), a hit in the SHM tier read into GPU memory (``shm_get_into_gpu``; vs
  raw_pinned_h2d), a put from GPU memory into the SHM tier (``shm_put_from_gpu``; vs
  raw_pinned_d2h), and the batch forms (``put_many`` / ``get_many_into`` of 64 blocks)
  with their CPU time per block (``cpu_us_per_block``: process time, target <= 20 us);
  the zero-copy ``view`` of a block in the GPU tier and in the SHM tier (``gpu_view``,
  ``shm_view``: microseconds per view taken and given back, over at least
  :data:`~benchmark.timing.VIEWS_TIMED` views timed in one go,
  :func:`~benchmark.timing.time_views`; issue 20: it should not grow with the size).

Targets (issue 24): GPU tier put/get >= 0.8x raw_d2d; SHM hit into GPU >= 0.8x pinned
H2D; put from GPU into SHM >= 0.8x pinned D2H. The result names the GPU, its driver and
runtime versions. Without a usable GPU (cupy missing or no device) the workload returns
``{"skipped": reason, "not_run": [...]}`` and measures nothing: nothing here is simulated.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from cascade import CascadeStore, Config, buffers
from cascade.models import BlockSpec

from ..timing import time_views

DEFAULT_SIZES = [64 << 10, 2 << 20, 16 << 20]
BATCH = 64
TARGET = 0.8


def gpu_or_reason() -> tuple[Any, str | None]:
    """(cupy, None) when a GPU is usable, else (None, why not)."""
    try:
        import cupy
    except ImportError as exc:
        return None, f"cupy is not installed ({exc}): install the gpu extra on a machine with a GPU"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None, "cupy sees no GPU"
    except Exception as exc:  # CUDARuntimeError without a driver
        return None, f"cupy sees no usable GPU ({exc})"
    return cupy, None


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def _timed(cp: Any, fn, nbytes: int, rounds: int, reset=None) -> dict[str, float]:
    """GB/s (median over rounds) and CPU microseconds of one call of ``fn``; ``reset``
    runs untimed before the warm-up and each round (a put must find its ids absent, or
    it measures the content-addressed "already there" path, not a copy)."""
    stream = cp.cuda.get_current_stream()
    if reset:
        reset()
    fn()  # warm-up
    stream.synchronize()
    rates, cpu = [], []
    for _ in range(rounds):
        if reset:
            reset()
            stream.synchronize()
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        stream.synchronize()
        t1, c1 = time.perf_counter(), time.process_time()
        rates.append(_gbps(nbytes, t1 - t0))
        cpu.append((c1 - c0) * 1e6)
    return {"gbps": statistics.median(rates), "cpu_us": statistics.median(cpu)}


def _limits(cp: Any, nbytes: int, count: int, rounds: int) -> dict[str, dict[str, float]]:
    dev_a = [cp.empty(nbytes, dtype=cp.uint8) for _ in range(count)]
    dev_b = [cp.empty(nbytes, dtype=cp.uint8) for _ in range(count)]
    pinned_mem = cp.cuda.alloc_pinned_memory(nbytes * count)
    pinned = np.frombuffer(pinned_mem, dtype=np.uint8, count=nbytes * count).reshape(count, nbytes)
    pageable = np.ones((count, nbytes), dtype=np.uint8)
    total = nbytes * count

    def each(copy) -> None:
        for i in range(count):
            copy(i)

    return {
        "raw_d2d": _timed(cp, lambda: each(lambda i: dev_b[i].data.copy_from_device_async(dev_a[i].data, nbytes)),
                          total, rounds),
        "raw_pinned_h2d": _timed(cp, lambda: each(lambda i: dev_a[i].set(pinned[i])), total, rounds),
        "raw_pinned_d2h": _timed(cp, lambda: each(lambda i: dev_a[i].get(out=pinned[i])), total, rounds),
        "raw_pageable_h2d": _timed(cp, lambda: each(lambda i: dev_a[i].set(pageable[i])), total, rounds),
        "raw_pageable_d2h": _timed(cp, lambda: each(lambda i: dev_a[i].get(out=pageable[i])), total, rounds),
    }


def _cascade(cp: Any, nbytes: int, count: int, rounds: int) -> dict[str, dict[str, float]]:
    spec = BlockSpec.flat(nbytes)
    half = spec.half_bytes
    keys = [cp.full(half, i % 251, dtype=cp.uint8) for i in range(count)]
    values = [cp.full(half, (i + 7) % 251, dtype=cp.uint8) for i in range(count)]
    outs = [(cp.empty(half, dtype=cp.uint8), cp.empty(half, dtype=cp.uint8)) for _ in range(count)]
    ids = [f"{i:032x}" for i in range(count)]
    total = nbytes * count
    room = 2 * count * (nbytes + 4096) + (16 << 20)
    rows: dict[str, dict[str, float]] = {}
    views: dict[str, dict[str, float]] = {}
    wrong = 0
    # The SHM slab in its default place, /dev/shm, as deployed: on the H200 machine the CUDA
    # driver refused (cudaErrorInvalidValue) to register a slab mapped from a file in /tmp,
    # and copies of an unregistered slab go through the staging arena.
    for tier, config in (("gpu", Config(gpu_bytes=room, shm_bytes=0, file_bytes=0)),
                         ("shm", Config(gpu_bytes=0, shm_bytes=room, file_bytes=0))):
        put, get = ("gpu_put", "gpu_get") if tier == "gpu" else ("shm_put_from_gpu", "shm_get_into_gpu")
        for out in outs:  # what the previous tier wrote must not pass for this one's reads
            out[0].fill(0)
            out[1].fill(0)
        with CascadeStore(config, block_spec=spec) as store:
            def absent() -> None:
                for b in ids:
                    if store.contains(b):
                        store.delete(b)

            rows[put] = _timed(cp, lambda: [store.put(k, v, block_id=b) for k, v, b in zip(keys, values, ids)],
                               total, rounds, absent)
            rows[get] = _timed(cp, lambda: [store.get_into(b, *o) for b, o in zip(ids, outs)], total, rounds)
            rows[put + "_batch"] = _timed(cp, lambda: store.put_many(list(zip(keys, values)), block_ids=ids),
                                          total, rounds, absent)
            rows[get + "_batch"] = _timed(cp, lambda: store.get_many_into(ids, outs), total, rounds)
            us, missed = time_views(store, ids)
            views[f"{tier}_view"] = {"us": us}
            wrong += missed
        wrong += sum(not (bool((o[0] == k).all()) and bool((o[1] == v).all())) for o, k, v in zip(outs, keys, values))
    for row in rows.values():
        row["cpu_us_per_block"] = row.pop("cpu_us") / count
    rows.update(views)
    rows["wrong_blocks"] = {"count": float(wrong)}
    return rows


def run(options: dict[str, Any]) -> dict[str, Any]:
    cp, reason = gpu_or_reason()
    if cp is None:
        return {"skipped": reason, "not_run": [{"system": "cascade", "reason": reason}]}
    sizes = options.get("sizes") or DEFAULT_SIZES
    rounds = options.get("rounds") or 5
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    rows = []
    for nbytes in sizes:
        for count in (1, BATCH):
            limits = _limits(cp, nbytes, count, rounds)
            cascade = _cascade(cp, nbytes, count, rounds)
            ratios = {
                "gpu_put_vs_d2d": cascade["gpu_put"]["gbps"] / limits["raw_d2d"]["gbps"],
                "gpu_get_vs_d2d": cascade["gpu_get"]["gbps"] / limits["raw_d2d"]["gbps"],
                "shm_get_into_gpu_vs_pinned_h2d": cascade["shm_get_into_gpu"]["gbps"] / limits["raw_pinned_h2d"]["gbps"],
                "shm_put_from_gpu_vs_pinned_d2h": cascade["shm_put_from_gpu"]["gbps"] / limits["raw_pinned_d2h"]["gbps"],
            }
            rows.append({"size": nbytes, "blocks": count, "limits": limits, "cascade": cascade, "ratios": ratios,
                         "targets": {k: v >= TARGET for k, v in ratios.items()}})
    return {"gpu": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
            "driver_version": cp.cuda.runtime.driverGetVersion(),
            "runtime_version": cp.cuda.runtime.runtimeGetVersion(), "rows": rows,
            "pinned_staging": {"arena_bytes": buffers.staging_arena().nbytes, **buffers.staging_arena().stats}}


def table(result: dict[str, Any]) -> str:
    if "skipped" in result:
        return f"device_io skipped: {result['skipped']}"
    lines = [f"{result['gpu']} (driver {result['driver_version']})",
             "size       blocks  d2d GB/s  gpu put/get x d2d   pinned h2d/d2h   shm->gpu x h2d   gpu->shm x d2h"
             "   view us gpu/shm"]
    for r in result["rows"]:
        lim, rat = r["limits"], r["ratios"]
        lines.append(f"{r['size']:>9}  {r['blocks']:>6}  {lim['raw_d2d']['gbps']:8.1f}  "
                     f"{rat['gpu_put_vs_d2d']:.2f} / {rat['gpu_get_vs_d2d']:.2f}       "
                     f"{lim['raw_pinned_h2d']['gbps']:.1f} / {lim['raw_pinned_d2h']['gbps']:.1f}      "
                     f"{rat['shm_get_into_gpu_vs_pinned_h2d']:.2f}             {rat['shm_put_from_gpu_vs_pinned_d2h']:.2f}"
                     f"           {r['cascade']['gpu_view']['us']:.1f} / {r['cascade']['shm_view']['us']:.1f}")
    return "\n".join(lines)
