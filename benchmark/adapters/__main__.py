"""``python -m benchmark.adapters``: which peers run here, and a quick put/get check.

    python -m benchmark.adapters                 # cheap availability report
    python -m benchmark.adapters --start         # really start and stop each system
    python -m benchmark.adapters --quick redis hdf5 --block-mib 2 --blocks 256

``--quick`` is a sanity check of an install (one rank, sequential, blocks of
``--block-mib`` split into equal key and value halves, warm-up excluded), not a
benchmark result: the benchmark runner writes those. It prints GB/s of put (ending with
``flush``), of ``get_into`` into preallocated buffers and of ``get``, and a memcpy
figure of the same size for scale.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

import numpy as np

from cascade import block_id

from . import ADAPTER_NAMES, AdapterUnavailable, available_adapters, load_adapter


def _quick(name: str, block_bytes: int, blocks: int, warmup: int, data_dir: str,
           options: dict) -> dict[str, object]:
    half = block_bytes // 2
    rng = np.random.default_rng(0)
    # Distinct content per block without generating GBs of random numbers.
    base = rng.integers(0, 256, 2 * half, dtype=np.uint8)
    total = blocks + warmup
    capacity = max(2 * total * block_bytes, 256 << 20)
    store = load_adapter(name, **options)
    try:
        store.initialize(capacity, data_dir)
        store.prepare(2 * half)
    except AdapterUnavailable as exc:
        store.close()
        return {"name": name, "ok": False, "reason": str(exc)}
    try:
        keys = [np.roll(base[:half], i) for i in range(total)]
        vals = [np.roll(base[half:], i) for i in range(total)]
        # content ids, as every real caller has them (Cascade's put verifies the id)
        ids = [block_id(k, v) for k, v in zip(keys, vals)]
        for i in range(warmup):
            store.put(ids[i], keys[i], vals[i])
        store.flush()
        t0 = time.perf_counter()
        for i in range(warmup, total):
            store.put(ids[i], keys[i], vals[i])
        store.flush()
        t_put = time.perf_counter() - t0
        kout, vout = np.empty(half, np.uint8), np.empty(half, np.uint8)
        for i in range(warmup):
            store.get_into(ids[i], kout, vout)
        t0 = time.perf_counter()
        misses = 0
        for i in range(warmup, total):
            misses += not store.get_into(ids[i], kout, vout)
        t_get_into = time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(warmup, total):
            store.get(ids[i])
        t_get = time.perf_counter() - t0
        ok = store.get(ids[-1]) == (keys[-1].tobytes(), vals[-1].tobytes())
        nbytes = blocks * 2 * half
        return {"name": name, "ok": ok, "blocks": blocks, "block_bytes": 2 * half,
                "put_GBps": nbytes / t_put / 1e9, "get_into_GBps": nbytes / t_get_into / 1e9,
                "get_GBps": nbytes / t_get / 1e9, "misses": misses,
                "versions": store.versions(), "options": options}
    finally:
        store.close()


def _memcpy_gbps(nbytes: int, repeats: int = 50) -> float:
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    dst[:] = src
    t0 = time.perf_counter()
    for _ in range(repeats):
        dst[:] = src
    return repeats * nbytes / (time.perf_counter() - t0) / 1e9


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmark.adapters", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--start", action="store_true", help="start and stop each system")
    p.add_argument("--quick", nargs="*", metavar="NAME",
                   help="quick put/get check of these adapters (none given: all)")
    p.add_argument("--block-mib", type=float, default=2.0)
    p.add_argument("--blocks", type=int, default=256)
    p.add_argument("--warmup", type=int, default=16)
    p.add_argument("--data-dir", default=None, help="default: a temporary directory")
    p.add_argument("--option", action="append", default=[], metavar="NAME:KEY=VALUE",
                   help="adapter option, e.g. mooncake:transfer=tcp (JSON values allowed)")
    p.add_argument("--json", action="store_true", help="print JSON lines")
    args = p.parse_args(argv)
    unknown = [n for n in args.quick or [] if n not in ADAPTER_NAMES]
    if unknown:
        p.error(f"unknown adapters {unknown}; choose from {', '.join(ADAPTER_NAMES)}")
    if args.blocks < 1:
        p.error(f"--blocks must be >= 1, got {args.blocks}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    if int(args.block_mib * (1 << 20)) < 2:
        p.error(f"--block-mib must give a block of 2 bytes or more, got {args.block_mib}")

    if args.quick is None:
        for name, ok, reason in available_adapters(start=args.start):
            print(f"{name:18s} {'ok' if ok else 'unavailable'}{'' if ok else ': ' + reason}")
        return 0

    options: dict[str, dict] = {}
    for item in args.option:
        name, _, kv = item.partition(":")
        key, _, value = kv.partition("=")
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        options.setdefault(name, {})[key] = parsed
    names = args.quick or [n for n in ADAPTER_NAMES]
    block_bytes = int(args.block_mib * (1 << 20))
    print(f"memcpy {block_bytes >> 10} KiB: {_memcpy_gbps(block_bytes):.2f} GB/s", flush=True)
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"quick_{name}_", dir=args.data_dir) as tmp:
            row = _quick(name, block_bytes, args.blocks, args.warmup, tmp, options.get(name, {}))
        if args.json:
            print(json.dumps(row), flush=True)
        elif "reason" in row:
            print(f"{name:18s} unavailable: {row['reason']}", flush=True)
        else:
            print(f"{name:18s} put {row['put_GBps']:6.2f}  get_into {row['get_into_GBps']:6.2f}  "
                  f"get {row['get_GBps']:6.2f} GB/s  misses {row['misses']}  "
                  f"exact {row['ok']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
