"""write_throughput: put GB/s of every system, 2 MiB and 16 MiB blocks from the shared data.

Per system and size, ``rounds`` times: start the system afresh (no reliance on each
system's ``clear``: LMCache 0.5.6's disk backend does not give the capacity of removed
blocks back), put the warm-up blocks (untimed, then ``flush``), then time putting the
measured blocks *and* the final ``flush`` (write-behind systems finish their writes
inside the timed region). ``put_gbps`` is the median round's
bytes / seconds. Cascade's put includes BLAKE3 content hashing (the adapter verifies
every id). Rows carry per-put samples, ratios to memcpy and to the raw file write of
the same run, and to every other system (``vs_systems``). See ``benchmark/README.md``.
"""
from __future__ import annotations

from typing import Any

from ..data import Block
from . import blockio, common


def measure(open_system: blockio.Opener, name: str, warm: list[Block], meas: list[Block],
            ctx: blockio.Context) -> list[dict[str, Any]]:
    nbytes = sum(b.nbytes for b in meas)
    round_s, flush_s, op_s = [], [], []
    stored_after: list[int] = []
    checked = 0
    for _ in range(ctx.rounds):
        with open_system() as adapter:
            blockio.put_all(adapter, warm)
            total, samples, flush = blockio.put_all(adapter, meas)
            round_s.append(total)
            flush_s.append(flush)
            op_s.append(samples)
            stored_after.append(blockio.stored(adapter, meas))
            checked += blockio.check_bytes(adapter, meas, ctx.outs)
    flat = [s for r in op_s for s in r]
    return [{
        "mode": "put",
        "put_gbps": blockio.median_gbps(nbytes, round_s),
        "put_gbps_rounds": [nbytes / s / 1e9 for s in round_s],
        "round_s": round_s, "flush_s": flush_s,
        "put_op_s": blockio.summary(flat),
        "samples": {"put_op_s": op_s},
        "stored_after_put": min(stored_after), "bytes_checked_blocks": checked, "fresh_instance_per_round": True,
    }]


def run(options: dict[str, Any]) -> dict[str, Any]:
    """Options: ``system`` (name, comma list or all), ``sizes``, ``blocks``, ``warmup``,
    ``rounds``, ``data_dir``, ``file_dir``, ``seed``, ``ranks``."""
    result = blockio.run(options, "write_throughput", measure, vs_metric="put_gbps")
    rows = result["rows"]
    result["targets"] = [
        common.target("cascade put (BLAKE3 hashing) >= 1.0x lmcache_cpu put", rows, "put_gbps",
                      "cascade", "lmcache_cpu", 1.0, block_bytes=s) for s in result["block_sizes"]]
    return result


def table(result: dict[str, Any]) -> str:
    return blockio.format_table(result, [
        ("put GB/s", 9, lambda r: f"{r['put_gbps']:.2f}"),
        ("p50 ms", 8, lambda r: f"{r['put_op_s']['p50'] * 1e3:.2f}"),
        ("p99 ms", 8, lambda r: f"{r['put_op_s']['p99'] * 1e3:.2f}"),
        ("/memcpy", 8, lambda r: f"{r['vs_limit']['memcpy']:.2f}"),
        ("/rawwr", 7, lambda r: f"{r['vs_limit']['raw_write']:.2f}"),
        ("vs cascade", 10, lambda r: f"{r['vs_systems'].get('cascade', 1.0 if r['system'] == 'cascade' else float('nan')):.2f}"),
        ("stored", 6, lambda r: str(r["stored_after_put"])),
    ])
