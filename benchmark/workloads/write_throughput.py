"""write_throughput: put GB/s of every system, 2 MiB and 16 MiB blocks from the shared data.

Each round starts the system afresh (no reliance on each system's ``clear``: LMCache
0.5.6's disk backend does not give the capacity of removed blocks back), puts the warm-up
blocks (untimed, then ``flush``), then times putting the measured blocks *and* the final
``flush`` (write-behind systems finish their writes inside the timed region), checks that
every block is stored and reads a few back byte for byte. Rounds are interleaved across
systems (:mod:`.blockio`). ``put_gbps`` is the median round's bytes / seconds. Cascade's
put takes the id as precomputed (a token-prefix id in an engine, like LMCache's chunk
hash) and does no KV hashing. See
``benchmark/README.md`` for the fields.
"""
from __future__ import annotations

from typing import Any

from . import blockio, common


class Measure(blockio.Measure):
    """Put rounds, each on a fresh instance of the system."""

    def start(self) -> None:
        self.round_s: list[float] = []
        self.flush_s: list[float] = []
        self.op_s: list[list[float]] = []
        self.stored_after: list[int] = []
        self.checked = 0

    def round(self, r: int) -> None:
        with self.open_system() as adapter:
            blockio.put_all(adapter, self.warm)
            total, samples, flush = blockio.put_all(adapter, self.meas)
            self.round_s.append(total)
            self.flush_s.append(flush)
            self.op_s.append(samples)
            self.stored_after.append(blockio.stored(adapter, self.meas))
            self.checked += blockio.check_bytes(adapter, self.meas, self.ctx.outs, seed=r)

    def finish(self) -> list[dict[str, Any]]:
        nbytes = sum(b.nbytes for b in self.meas)
        return [{
            "mode": "put",
            "put_gbps": blockio.median_gbps(nbytes, self.round_s),
            "put_gbps_rounds": [nbytes / s / 1e9 for s in self.round_s],
            "round_s": self.round_s, "flush_s": self.flush_s,
            "put_op_s": blockio.summary([s for r in self.op_s for s in r]),
            "samples": {"put_op_s": self.op_s},
            "stored_after_put": min(self.stored_after), "bytes_checked_blocks": self.checked,
            "fresh_instance_per_round": True,
        }]


def run(options: dict[str, Any]) -> dict[str, Any]:
    """Options: ``system`` (name, comma list or all), ``sizes``, ``blocks``, ``warmup``,
    ``rounds`` (default 3), ``data_dir``, ``file_dir``, ``seed``, ``ranks``."""
    result = blockio.run(options, "write_throughput", Measure, vs_metric="put_gbps", rounds=3)
    rows = result["rows"]
    result["targets"] = [
        common.target("cascade put (precomputed prefix ids) >= 1.0x lmcache_cpu put", rows, "put_gbps",
                      "cascade", "lmcache_cpu", 1.0, block_bytes=s) for s in result["block_sizes"]]
    return result


def table(result: dict[str, Any]) -> str:
    return blockio.format_table(result, [
        ("put GB/s", 9, lambda r: f"{r['put_gbps']:.2f}"),
        ("p50 ms", 8, lambda r: f"{r['put_op_s']['p50'] * 1e3:.2f}"),
        ("p99 ms", 8, lambda r: f"{r['put_op_s']['p99'] * 1e3:.2f}"),
        ("/memcpy", 8, lambda r: f"{r['vs_limit']['memcpy']:.2f}"),
        ("/rawwr", 7, lambda r: f"{r['vs_limit']['raw_write']:.2f}"),
        ("cascade/this", 12, lambda r: "1.00" if r["system"] == "cascade" else
         (f"{1 / r['vs_systems']['cascade']:.2f}" if "cascade" in r["vs_systems"] else "-")),
        ("stored", 6, lambda r: str(r["stored_after_put"])),
    ])
