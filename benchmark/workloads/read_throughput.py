"""read_throughput: get GB/s of every system, hot and cold, 2 MiB and 16 MiB blocks.

Per system and size: start it, put the measured blocks, then the warm-up blocks (untimed;
warm-up blocks go last so that in files they sit after the measured ones and reading them
cannot read ahead into a measured block), ``flush``. Every system stays up while the
rounds run interleaved across systems (:mod:`.blockio`); each round has

* ``hot``: get the warm-up blocks (untimed), then time ``get_into`` of every measured
  block into the same page-aligned buffers (the data was just written: in DRAM, or in
  the page cache for file-backed systems);
* ``cold`` (file-backed systems: cascade_file, lmcache_disk, hdf5 and their variants): get
  the warm-up blocks (untimed), then empty the system's in-process cache
  (``drop_process_cache``: HDF5 reopens its file, so its chunk cache starts empty), then
  evict the system's own files from the page cache (``sync`` + ``posix_fadvise(DONTNEED)`` on every
  file under its directory; as root ``drop_caches`` too if pages stayed), checked with
  ``mincore``, then time the measured gets as hot. Nothing runs between the drop and the
  timed gets (a warm-up get after it would bring back what shares its HDF5 chunk or
  readahead window with measured blocks), so the drop's ``resident_fraction_after`` is
  the residency the timed pass starts from. ``cold_method`` and the resident fractions
  are in the row.

In-memory systems have no cold read; lmcache_cpu_disk serves every block from its CPU
tier. Both are listed in ``not_applicable`` with the reason. See ``benchmark/README.md``.
"""
from __future__ import annotations

from typing import Any

from ..adapters import StorageAdapter
from ..data import Block
from ..machine import drop_page_cache, files_under
from . import blockio, common


def drop(adapter: StorageAdapter) -> dict[str, Any]:
    """Empty the system's own in-process cache (HDF5's chunk cache), then evict every
    file under its directory from the page cache."""
    adapter.drop_process_cache()
    return drop_page_cache(files_under(adapter.data_dir))


def prepare_pass(adapter: StorageAdapter, warm: list[Block], outs, cold: bool) -> dict[str, Any] | None:
    """The untimed steps before a timed pass: the warm-up gets, then for a cold pass the
    drop (:func:`drop`), last, so the timed gets start from what the drop left; returns
    the drop's record (``None`` for a hot pass)."""
    blockio.get_all(adapter, warm, outs)
    return drop(adapter) if cold else None


def load(adapter: StorageAdapter, warm: list[Block], meas: list[Block]) -> int:
    """Put measured then warm-up blocks, flush; returns how many measured blocks are stored."""
    blockio.put_all(adapter, meas)
    blockio.put_all(adapter, warm)
    held = blockio.stored(adapter, meas)
    if held != len(meas):
        raise RuntimeError(f"{adapter.name} holds {held} of {len(meas)} blocks after the put phase")
    return held


class Measure(blockio.Measure):
    """One loaded instance; per round a hot pass and (file-backed) a cold pass."""

    def start(self) -> None:
        self.adapter = self.stack.enter_context(self.open_system())
        self.held = load(self.adapter, self.warm, self.meas)
        self.modes = ["hot"] + (["cold"] if common.file_backed(self.name) else [])
        self.round_s = {m: [] for m in self.modes}
        self.op_s = {m: [] for m in self.modes}
        self.misses = {m: 0 for m in self.modes}
        self.drops: list[dict[str, Any]] = []

    def round(self, r: int) -> None:
        for mode in self.modes:
            dropped = prepare_pass(self.adapter, self.warm, self.ctx.outs, cold=mode == "cold")
            if dropped is not None:
                self.drops.append(dropped)
            total, samples, miss = blockio.get_all(self.adapter, self.meas, self.ctx.outs)
            self.round_s[mode].append(total)
            self.op_s[mode].append(samples)
            self.misses[mode] += miss

    def finish(self) -> list[dict[str, Any]]:
        nbytes = sum(b.nbytes for b in self.meas)
        checked = blockio.check_bytes(self.adapter, self.meas, self.ctx.outs)
        rows = []
        for mode in self.modes:
            rs = self.round_s[mode]
            row = {"mode": mode, "get_gbps": blockio.median_gbps(nbytes, rs),
                   "get_gbps_rounds": [nbytes / s / 1e9 for s in rs], "round_s": rs,
                   "get_op_s": blockio.summary([s for r in self.op_s[mode] for s in r]), "misses": self.misses[mode],
                   "samples": {"get_op_s": self.op_s[mode]}, "stored_after_put": self.held,
                   "bytes_checked_blocks": checked}
            if mode == "cold":
                row.update(cold_method=self.drops[0]["method"], page_cache_drops=self.drops,
                           resident_fraction_after_drop=max(d["resident_fraction_after"] for d in self.drops))
            rows.append(row)
        return rows


def not_applicable(systems: list[str]) -> list[dict[str, Any]]:
    out = []
    for name in systems:
        if name in common.DRAM_FRONTED:
            out.append({"system": name, "mode": "cold", "reason": common.DRAM_FRONTED[name]})
        elif not common.file_backed(name):
            out.append({"system": name, "mode": "cold", "reason": "in-memory system: nothing to read cold"})
    return out


def run(options: dict[str, Any]) -> dict[str, Any]:
    """Options as :func:`benchmark.workloads.write_throughput.run` (``rounds`` default 5)."""
    result = blockio.run(options, "read_throughput", Measure, vs_metric="get_gbps", rounds=5)
    result["not_applicable"] = not_applicable(result["systems"])
    rows = result["rows"]
    targets = []
    for s in result["block_sizes"]:
        targets.append(common.target("cascade hot get >= 1.2x lmcache_cpu get", rows, "get_gbps", "cascade",
                                     "lmcache_cpu", 1.2, block_bytes=s, mode="hot"))
        for other in ("lmcache_disk", "hdf5"):
            targets.append(common.target(f"cascade_file cold get >= 2x {other} cold get", rows, "get_gbps",
                                         "cascade_file", other, 2.0, block_bytes=s, mode="cold"))
        for other in ("redis", "mooncake"):
            targets.append(common.target(f"cascade hot get >= 5x {other} get", rows, "get_gbps", "cascade",
                                         other, 5.0, block_bytes=s, mode="hot"))
    result["targets"] = targets
    return result


def table(result: dict[str, Any]) -> str:
    return blockio.format_table(result, [
        ("get GB/s", 9, lambda r: f"{r['get_gbps']:.2f}"),
        ("p50 ms", 8, lambda r: f"{r['get_op_s']['p50'] * 1e3:.2f}"),
        ("/memcpy", 8, lambda r: f"{r['vs_limit']['memcpy']:.2f}"),
        ("/rawOD", 7, lambda r: f"{r['vs_limit']['raw_odirect_read']:.2f}"),
        ("/rawbuf", 7, lambda r: f"{r['vs_limit']['raw_buffered_cold_read']:.2f}"),
        ("resident", 8, lambda r: f"{r['resident_fraction_after_drop']:.0%}" if "cold_method" in r else "-"),
        ("misses", 6, lambda r: str(r["misses"])),
    ])
