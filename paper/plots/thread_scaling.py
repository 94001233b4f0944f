"""Table: one store's aggregate get GB/s with 1..N threads, beside the raw limits at the same depth.

Source: the suite's ``thread_scaling`` results (schema ``cascade-bench/thread_scaling/1``
in ``benchmark/README.md``): per block size, thread count and configuration (tier, file
read mode, cache state, form) or limit, ``get_gbps``, ``speedup_vs_1_thread`` and, for
Cascade rows, ``vs_limit`` -- ratios of the same round, so the table never divides medians.
A row or limit that only some repetitions measured is kept over those (the merge); one that
none measured (its ``not_run``) is shown as ``--``.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core import Context, FigureSpec, absent
from ..macros import and_list, integer, pct, per_size, quoted_sizes, sig, size
from ..results import ResultsError, ResultsFile
from ..tables import escape
from .common import default_block_bytes, reference_row

#: Cascade configurations (tier, file read mode, cache), in table order.
CONFIGS = (("shm", None, "dram"), ("file", "auto", "cold"), ("file", "direct", "cold"), ("file", "auto", "hot"))
FORMS = ("threads", "batch")
LIMITS = {"memcpy": "memcpy", "raw_odirect_read": r"raw \texttt{O\_DIRECT} read",
          "raw_buffered_cold_read": "raw buffered read, cold", "raw_buffered_hot_read": "raw buffered read, hot"}
#: per cache state: the ``vs_limit`` ratio shown, and the limit rows it is computed from
SHOWN = {"dram": ("memcpy", ("memcpy",)),
         "cold": (None, ()),  # the raw cold read of the mode the row read in: :func:`_cold_limit`
         "hot": ("raw_buffered_hot_read", ("raw_buffered_hot_read",))}

TABLE_CAPTION = (
    r"Aggregate get throughput of one store in GB/s with $N$ threads ($N$ in the column heads; median and range "
    r"over the \SuiteReps repetitions, each the median of its rounds), beside this machine's limits at the same "
    r"depth, measured in the same runs: $N$ threads copying the same bytes into the same buffers (memcpy), or "
    r"reading them from a plain file beside the file tier's with \texttt{O\_DIRECT} or buffered, cold (after "
    r"dropping it from the page cache) or hot. Form \emph{threads}: $N$ threads, each calling "
    r"\texttt{get\_into} on its share of the blocks; \emph{batch}: one \texttt{get\_many\_into} with $N$ "
    r"workers. File tier alone, read mode \texttt{auto} (what it chose here in parentheses) or \texttt{direct}. "
    r"``ratio'': Cascade over the limit that bounds the row at the same depth, taken within each round (DRAM: "
    r"memcpy; cold: the raw cold read of the mode the file tier read in, buffered or \texttt{O\_DIRECT}; hot: the raw buffered hot read); last column: the "
    r"speed-up from one thread to the most. --: not measured.")

MACROS = ("ThrBlock", "ThrTop", "ThrMemcpyOneGBps", "ThrMemcpyTopGBps", "ThrMemcpySpeedup", "ThrShmTopGBps",
          "ThrShmPctMemcpy", "ThrShmBatchPctMemcpy", "ThrShmSpeedup", "ThrColdAutoPctRaw", "ThrColdDirectPctRaw",
          "ThrColdDirectBatchPctRaw", "ThrColdAutoSpeedup", "ThrColdDirectSpeedup", "ThrRawDirectSpeedup",
          "ThrRawColdSpeedup", "ThrHotPctRaw", "ThrHotSpeedup", "ThrRawHotSpeedup", "ThrAutoMode")

Config = tuple[Any, ...]  # ("limit", name) or (tier, file read mode, cache, form)
Index = dict[tuple[int, int, Config], tuple[int, dict[str, Any]]]


def _config(rf: ResultsFile, i: int, row: dict[str, Any]) -> Config:
    p = ("rows", i)
    if rf.get("system", within=row, prefix=p) == "limit":
        return ("limit", rf.get("limit", within=row, prefix=p))
    return (rf.get("tier", within=row, prefix=p), row.get("file_read_mode"), rf.get("cache", within=row, prefix=p),
            rf.get("form", within=row, prefix=p))


def _index(rf: ResultsFile) -> Index:
    """Every row by (block bytes, threads, configuration), its fields checked."""
    out: Index = {}
    for i, row in enumerate(rf.seq("rows")):
        p = ("rows", i)
        key = (int(rf.num("block_bytes", within=row, prefix=p)), int(rf.num("threads", within=row, prefix=p)),
               _config(rf, i, row))
        rf.num("get_gbps", within=row, prefix=p)
        out[key] = (i, row)
    return out


def _at(rf: ResultsFile, index: Index, block: int, n: int, config: Config) -> tuple[int, dict[str, Any]]:
    """The row a quoted number needs: :class:`ResultsError` when the suite lacks it."""
    if (block, n, config) not in index:
        raise ResultsError(rf.path, f"rows[block_bytes={block}, threads={n}, {'/'.join(map(str, config))}]",
                           "is missing (not measured)")
    return index[(block, n, config)]


def _ratio(rf: ResultsFile, index: Index, block: int, n: int, config: Config) -> float | None:
    """The row's ratio to its limit at the same depth; None when the row or the limit
    was not measured."""
    if (block, n, config) not in index:
        return None
    i, row = index[(block, n, config)]
    name, limits = SHOWN[config[2]]
    if config[2] == "cold":
        name = _cold_limit(row)
        limits = (name,)
    if any((block, n, ("limit", lim)) not in index for lim in limits):
        return None
    return rf.num("vs_limit", name, within=row, prefix=("rows", i))


def _cold_limit(row: dict[str, Any]) -> str:
    """The raw cold read a cold row is compared with: the mode its file tier read in."""
    return "raw_odirect_read" if row.get("effective_read_mode") == "direct" else "raw_buffered_cold_read"


def _speedup(rf: ResultsFile, index: Index, block: int, n: int, config: Config) -> float | None:
    if (block, n, config) not in index or (block, 1, config) not in index:
        return None
    i, row = index[(block, n, config)]
    return rf.num("speedup_vs_1_thread", within=row, prefix=("rows", i))


def build(ctx: Context) -> list[ResultsFile]:
    rf = ctx.results.newest("thread_scaling")
    if rf is None:
        raise absent("thread_scaling")
    index = _index(rf)
    counts = sorted(int(rf.num("thread_counts", k)) for k in range(len(rf.seq("thread_counts"))))
    blocks = sorted(int(rf.num("block_sizes", k)) for k in range(len(rf.seq("block_sizes"))))
    _macros(ctx, rf, index, blocks, counts)
    _table(ctx, rf, index, blocks, counts)
    return [rf]


def _times(v: float) -> str:
    return sig(v, 2)


def _pct(v: float) -> str:
    return pct(v, 0)


def _macros(ctx: Context, rf: ResultsFile, index: Index, blocks: list[int], counts: list[int]) -> None:
    ref = reference_row([{"block_bytes": b} for b in blocks], default_block_bytes())["block_bytes"]
    quoted = quoted_sizes(blocks, ref)
    top = counts[-1]
    m = ctx.macros
    m.add("ThrBlock", and_list([size(b) for b in quoted]),
          rf.source("block_sizes") + " (2 and 16 MiB where measured, else the smallest >= the default block)")
    m.add("ThrTop", integer(top), rf.source("thread_counts") + " (the most)")

    def field(name: str, n: int, config: Config, *keys: str, fmt: Callable[[float], str] = _times,
              unit: str = "") -> None:
        values, sources = [], []
        for block in quoted:
            i, row = _at(rf, index, block, n, config)
            got = [_cold_limit(row) if k == "raw_read_same_mode" else k for k in keys]
            values.append((block, fmt(rf.num(*got, within=row, prefix=("rows", i)))))
            sources.append(rf.source("rows", i, *got))
        m.add(name, per_size(values, unit), "; ".join(sources))

    gbps, pc, x = (sig, r"\,GB/s"), (_pct, r"\,\%"), r"$\times$"
    field("ThrMemcpyOneGBps", 1, ("limit", "memcpy"), "get_gbps", fmt=gbps[0], unit=gbps[1])
    field("ThrMemcpyTopGBps", top, ("limit", "memcpy"), "get_gbps", fmt=gbps[0], unit=gbps[1])
    field("ThrMemcpySpeedup", top, ("limit", "memcpy"), "speedup_vs_1_thread", unit=x)
    field("ThrRawDirectSpeedup", top, ("limit", "raw_odirect_read"), "speedup_vs_1_thread", unit=x)
    field("ThrRawColdSpeedup", top, ("limit", "raw_buffered_cold_read"), "speedup_vs_1_thread", unit=x)
    field("ThrRawHotSpeedup", top, ("limit", "raw_buffered_hot_read"), "speedup_vs_1_thread", unit=x)
    shm, auto_cold = ("shm", None, "dram", "threads"), ("file", "auto", "cold", "threads")
    direct_cold, hot = ("file", "direct", "cold", "threads"), ("file", "auto", "hot", "threads")
    field("ThrShmTopGBps", top, shm, "get_gbps", fmt=gbps[0], unit=gbps[1])
    field("ThrShmPctMemcpy", top, shm, "vs_limit", "memcpy", fmt=pc[0], unit=pc[1])
    field("ThrShmBatchPctMemcpy", top, ("shm", None, "dram", "batch"), "vs_limit", "memcpy", fmt=pc[0], unit=pc[1])
    field("ThrShmSpeedup", top, shm, "speedup_vs_1_thread", unit=x)
    field("ThrColdAutoPctRaw", top, auto_cold, "vs_limit", "raw_read_same_mode", fmt=pc[0], unit=pc[1])
    field("ThrColdDirectPctRaw", top, direct_cold, "vs_limit", "raw_read_same_mode", fmt=pc[0], unit=pc[1])
    field("ThrColdDirectBatchPctRaw", top, ("file", "direct", "cold", "batch"), "vs_limit", "raw_read_same_mode",
          fmt=pc[0], unit=pc[1])
    field("ThrColdAutoSpeedup", top, auto_cold, "speedup_vs_1_thread", unit=x)
    field("ThrColdDirectSpeedup", top, direct_cold, "speedup_vs_1_thread", unit=x)
    field("ThrHotPctRaw", top, hot, "vs_limit", "raw_buffered_hot_read", fmt=pc[0], unit=pc[1])
    field("ThrHotSpeedup", top, hot, "speedup_vs_1_thread", unit=x)
    i, row = _at(rf, index, quoted[0], top, auto_cold)
    m.add("ThrAutoMode", escape(str(rf.get("effective_read_mode", within=row, prefix=("rows", i)))),
          rf.source("rows", i, "effective_read_mode"))


def _cells(rf: ResultsFile, index: Index, block: int, counts: list[int], config: Config) -> list[str]:
    """GB/s and ratio (Cascade rows) per thread count, then the speed-up at the most threads."""
    cells = []
    for n in counts:
        got = index.get((block, n, config))
        ratio = None if config[0] == "limit" else _ratio(rf, index, block, n, config)
        cells += [sig(got[1]["get_gbps"]) if got else "--",
                  "" if config[0] == "limit" else "--" if ratio is None else _times(ratio)]
    speedup = _speedup(rf, index, block, counts[-1], config)
    return cells + ["--" if speedup is None else _times(speedup)]


def _label(rf: ResultsFile, index: Index, block: int, config: Config) -> str:
    """``SHM, DRAM`` or ``file, auto (buffered), cold``: for ``auto``, the mode the file
    tier chose (``effective_read_mode``) in parentheses."""
    tier, mode, cache, _ = config
    if tier == "shm":
        return "SHM, DRAM"
    chose = ""
    if mode == "auto":
        i, row = next((i, row) for (b, _, c), (i, row) in index.items() if b == block and c == config)
        chose = f" ({escape(rf.get('effective_read_mode', within=row, prefix=('rows', i)))})"
    return rf"{escape(tier)}, \texttt{{{escape(mode)}}}{chose}, {escape(cache)}"


def _table(ctx: Context, rf: ResultsFile, index: Index, blocks: list[int], counts: list[int]) -> None:
    cols = [("block", "r"), ("configuration", "l"), ("form", "l")]
    for n in counts:
        cols += [(f"GB/s ({n})", "r"), (f"ratio ({n})", "r")]
    cols.append((rf"$\times$ ({counts[-1]}/1)", "r"))
    t = ctx.table("thread_scaling", cols, [rf])
    present = {(b, c) for b, _, c in index}
    for k, block in enumerate(blocks):
        if k:
            t.rule()
        first = size(block)
        for name, label in LIMITS.items():
            if (block, ("limit", name)) in present:
                t.add(first, rf"\emph{{{label}}}", "", *_cells(rf, index, block, counts, ("limit", name)))
                first = ""
        for tier, mode, cache in CONFIGS:
            label = None
            for form in FORMS:
                config = (tier, mode, cache, form)
                if (block, config) in present:
                    label = "" if label is not None else _label(rf, index, block, config)
                    t.add(first, label, rf"\emph{{{form}}}", *_cells(rf, index, block, counts, config))
                    first = ""
    ctx.put(t)


SPEC = FigureSpec("thread_scaling", "", "thread_scaling results", build, macros=MACROS,
                  tables={"thread_scaling": TABLE_CAPTION}, wide_tables=("thread_scaling",), figure=False)
