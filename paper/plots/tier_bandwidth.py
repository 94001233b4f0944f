"""Figure: put and get bandwidth of each tier against block size, with the machine's limits.

Source: the newest ``cascade_tier_bandwidth_*`` results file
(:mod:`benchmark.workloads.tier_bandwidth`); the REMOTE tier and the raw MPI ``Get`` are
added from the newest ``mpi_micro`` file when there is one.
"""
from __future__ import annotations

import math

from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator

from .. import style
from ..core import Context, FigureSpec, absent
from ..macros import and_list, pct, per_size, quoted_sizes, sig, size
from ..results import ResultsError, ResultsFile
from ..spread import pairwise
from .common import default_block_bytes, reference_row

TIERS = ("gpu", "shm", "lustre")
RATIOS = ("shm_get_vs_memcpy", "store_put_hashed_vs_memcpy", "lustre_put_vs_raw_write")
GBPS, PCT = r"\,GB/s", r"\,\%"

CAPTION = (r"Put (left) and get (right) bandwidth of each Cascade tier against block size, beside "
           r"this machine's limits measured in the same run (grey): memcpy of the same size (over buffers "
           r"larger than the last-level cache), and a raw file of the same blocks on the file tier's file "
           r"system, written buffered with one \texttt{fsync} and read back cold in the LUSTRE tier's read "
           r"mode (\TbwRawReadKind; the better of the measurements before and after the tiers). LUSTRE-tier "
           r"gets are cold reads (\TbwLustreReadMode) with checksum verification, all bytes over all get "
           r"time. The GPU tier runs its code with numpy as "
           r"array module (host memory: no GPU here). ``store put + BLAKE3'' is a whole "
           r"\texttt{CascadeStore.put} including content hashing. Other points: medians of per-block times; "
           r"points are medians over the \SuiteReps repetitions of the suite run, vertical bars their minimum "
           r"and maximum.")

MACROS = ("TbwQuotedBlocks", "TbwSmallBlock", "TbwLargeBlock", "TbwMemcpyGBps", "TbwRawReadGBps", "TbwRawReadKind",
          "TbwRawWriteGBps", "TbwShmPutGBps", "TbwShmGetGBps", "TbwShmGetPctMemcpy", "TbwShmGetSmallGBps",
          "TbwShmGetSmallPctMemcpy", "TbwLustrePutGBps", "TbwLustreGetGBps", "TbwLustreGetPctRaw",
          "TbwLustreReadMode", "TbwLustrePutPctRaw", "TbwHashedPutGBps", "TbwHashedPutPctMemcpy",
          "TbwMemOverheadPct", "TbwMemOverheadBlock")

TABLE_CAPTION = (r"Tier bandwidth in GB/s per block size (medians of per-block times, LUSTRE gets over a whole "
                 r"cold pass; median and range over the repetitions), the machine's limits measured in the same "
                 r"runs (raw file: buffered write for puts, for gets the better cold read of the LUSTRE tier's "
                 r"read mode), and the ratios (LUSTRE/raw: put over raw write, cold get over raw read of the "
                 r"same mode).")

#: How each read mode reads (the tier's ``read_mode`` as recorded, cascade/tiers/file_reads.py).
READ_MODES = {
    "buffered": (r"through the page cache (one \texttt{preadv} of header and payload per record; the tier's "
                 r"\texttt{auto} mode uses \texttt{O\_DIRECT} only on Lustre)",
                 r"raw buffered cold read (one request per block, page cache dropped)"),
    "direct": (r"with \texttt{O\_DIRECT} (the tier's request size and requests in flight)",
               r"raw \texttt{O\_DIRECT} read (the tier's request size and requests in flight)"),
}
_RAW_KEY = {"buffered": "buffered_cold_read_gbps", "direct": "read_gbps"}


def _rows(rf: ResultsFile) -> list[dict]:
    rows = rf.seq("rows")
    for i, row in enumerate(rows):
        p = ("rows", i)
        rf.num("block_bytes", within=row, prefix=p)
        rf.num("memcpy", "gbps", within=row, prefix=p)
        rf.num("raw_file", "write_gbps", within=row, prefix=p)
        for tier in TIERS:
            rf.num(tier, "put_gbps", within=row, prefix=p)
            rf.num(tier, "get_gbps", within=row, prefix=p)
        rf.num("lustre", "get_aggregate_gbps", within=row, prefix=p)
        mode = rf.get("lustre", "read_mode", within=row, prefix=p)
        if mode not in _RAW_KEY:
            raise ResultsError(rf.path, f"rows[{i}].lustre.read_mode", f"is {mode!r}, not buffered or direct")
        # the raw read of the mode the tier read in, the better of before and after
        row["_raw_read"] = pairwise(max, rf.num("raw_file", _RAW_KEY[mode], within=row, prefix=p),
                                    rf.num("raw_file_after", _RAW_KEY[mode], within=row, prefix=p))
        row["_lustre_vs_raw"] = row["lustre"]["get_aggregate_gbps"] / row["_raw_read"]
        rf.num("store_put_hashed", "put_gbps", within=row, prefix=p)
        for ratio in RATIOS:
            rf.num("ratios", ratio, within=row, prefix=p)
    return sorted(rows, key=lambda r: r["block_bytes"])


def _remote(ctx: Context) -> tuple[ResultsFile, list[dict]] | None:
    rf = ctx.results.newest("mpi_micro")
    if rf is None or not isinstance(rf.doc.get("remote_bandwidth"), dict) or "skipped" in rf.doc["remote_bandwidth"]:
        return None
    rows = rf.seq("remote_bandwidth", "rows")
    for i, row in enumerate(rows):
        for key in ("bytes", "tier_gbps", "raw_get_gbps"):
            rf.num(key, within=row, prefix=("remote_bandwidth", "rows", i))
    return rf, sorted(rows, key=lambda r: r["bytes"])


def build(ctx: Context) -> list[ResultsFile]:
    rf = ctx.results.newest("tier_bandwidth")
    if rf is None:
        raise absent("tier_bandwidth")
    rows = _rows(rf)
    remote = _remote(ctx)
    sources = [rf] + ([remote[0]] if remote else [])
    sizes = [int(r["block_bytes"]) for r in rows]

    fig, (ax_put, ax_get) = style.figure(2.65, ncols=2, sharey=True)
    for ax, op in ((ax_put, "put"), (ax_get, "get")):
        ys = [r["memcpy"]["gbps"] for r in rows]
        ax.plot(sizes, ys, color="black", ls="--", lw=0.9)
        style.whiskers(ax, sizes, ys, "black")
        ys = [r["raw_file"]["write_gbps"] if op == "put" else r["_raw_read"] for r in rows]
        ax.plot(sizes, ys, color=style.LIMIT_COLOR, ls=":", lw=1.1)
        style.whiskers(ax, sizes, ys, style.LIMIT_COLOR)
        for tier in TIERS:
            _, color, marker = style.series(tier)
            key = "get_aggregate_gbps" if (tier, op) == ("lustre", "get") else f"{op}_gbps"
            ys = [r[tier][key] for r in rows]
            ax.plot(sizes, ys, color=color, marker=marker)
            style.whiskers(ax, sizes, ys, color)
        style.bytes_axis(ax, sizes)
        ax.set_xlabel("block size (bytes)")
        ax.set_title(op, pad=2)
    _, color, marker = style.series("store_put_hashed")
    ys = [r["store_put_hashed"]["put_gbps"] for r in rows]
    ax_put.plot(sizes, ys, color=color, marker=marker)
    style.whiskers(ax_put, sizes, ys, color)
    handles = [Line2D([], [], color="black", ls="--", lw=0.9, label="memcpy"),
               Line2D([], [], color=style.LIMIT_COLOR, ls=":", lw=1.1, label="raw file (put: write, get: read)")]
    extra = ""
    if remote:
        rrows = remote[1]
        rsizes = [int(r["bytes"]) for r in rrows]
        _, color, marker = style.series("remote")
        ys = [r["tier_gbps"] for r in rrows]
        ax_get.plot(rsizes, ys, color=color, marker=marker)
        style.whiskers(ax_get, rsizes, ys, color)
        ys = [r["raw_get_gbps"] for r in rrows]
        ax_get.plot(rsizes, ys, color=style.LIMIT_COLOR, ls="-.", lw=0.9)
        style.whiskers(ax_get, rsizes, ys, style.LIMIT_COLOR)
        handles.append(Line2D([], [], color=style.LIMIT_COLOR, ls="-.", lw=0.9, label="raw MPI Get"))
        extra = (r"REMOTE-tier gets (\texttt{RemoteTier.read\_into} from another rank's window) and raw "
                 r"MPI \texttt{Get}\,+\,\texttt{Flush} come from the same node's \texttt{mpi\_micro} run.")
    for name in ("gpu", "shm", *(("remote",) if remote else ()), "lustre", "store_put_hashed"):
        lbl, color, marker = style.series(name)
        handles.append(Line2D([], [], color=color, marker=marker, label=lbl))
    ax_put.set_ylabel("bandwidth (GB/s)")
    ax_put.set_yscale("log")
    plotted = [v for ax in (ax_put, ax_get) for line in ax.get_lines() for v in line.get_ydata()]
    ax_put.set_ylim(10 ** math.floor(math.log10(min(plotted))), 10 ** math.ceil(math.log10(max(plotted))))
    ax_put.yaxis.set_major_locator(LogLocator(base=10))
    ax_put.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    for ax in (ax_put, ax_get):
        ax.tick_params(axis="x", labelrotation=45)
    bottom = style.legend_below(fig, handles, axis_room_in=0.62)  # slanted size labels
    fig.subplots_adjust(left=0.14, right=0.98, top=0.93, bottom=bottom, wspace=0.08)
    ctx.save(fig, sources, caption_extra=extra)

    _macros(ctx, rf, rows)
    _table(ctx, rf, rows)
    return sources


def _macros(ctx: Context, rf: ResultsFile, rows: list[dict]) -> None:
    all_rows = rf.seq("rows")
    sizes = [int(r["block_bytes"]) for r in rows]
    ref = reference_row(rows, default_block_bytes())["block_bytes"]
    quoted = [(s, all_rows.index(next(r for r in rows if r["block_bytes"] == s))) for s in quoted_sizes(sizes, ref)]
    small, large = rows[0], rows[-1]
    i_small, i_large = all_rows.index(small), all_rows.index(large)
    m = ctx.macros

    def each(name: str, fmt, unit: str, *keys: str) -> None:
        """One macro quoting ``keys`` of every quoted size's row."""
        m.add(name, per_size([(s, fmt(rf.num("rows", i, *keys))) for s, i in quoted], unit),
              "; ".join(rf.source("rows", i, *keys) for _, i in quoted))

    def derived(name: str, fmt, unit: str, key: str, how: str) -> None:
        """One macro of a figure computed here per repetition (``key`` of the parsed rows)."""
        m.add(name, per_size([(s, fmt(all_rows[i][key])) for s, i in quoted], unit),
              "; ".join(rf.source("rows", i) for _, i in quoted) + f": {how}")

    m.add("TbwQuotedBlocks", and_list([size(s) for s, _ in quoted]),
          "; ".join(rf.source("rows", i, "block_bytes") for _, i in quoted) + " (2 and 16 MiB where measured, "
          "else the smallest size >= the default block)")
    m.add("TbwSmallBlock", size(small["block_bytes"]), rf.source("rows", i_small, "block_bytes"))
    m.add("TbwLargeBlock", size(large["block_bytes"]), rf.source("rows", i_large, "block_bytes"))
    each("TbwMemcpyGBps", sig, GBPS, "memcpy", "gbps")
    each("TbwRawWriteGBps", sig, GBPS, "raw_file", "write_gbps")
    each("TbwShmPutGBps", sig, GBPS, "shm", "put_gbps")
    each("TbwShmGetGBps", sig, GBPS, "shm", "get_gbps")
    each("TbwShmGetPctMemcpy", lambda v: pct(v, 0), PCT, "ratios", "shm_get_vs_memcpy")
    m.add("TbwShmGetSmallGBps", sig(rf.num("rows", i_small, "shm", "get_gbps")),
          rf.source("rows", i_small, "shm", "get_gbps"))
    m.add("TbwShmGetSmallPctMemcpy", pct(rf.num("rows", i_small, "ratios", "shm_get_vs_memcpy"), 0),
          rf.source("rows", i_small, "ratios", "shm_get_vs_memcpy"))
    each("TbwLustrePutGBps", sig, GBPS, "lustre", "put_gbps")
    each("TbwLustrePutPctRaw", lambda v: pct(v, 0), PCT, "ratios", "lustre_put_vs_raw_write")
    each("TbwLustreGetGBps", sig, GBPS, "lustre", "get_aggregate_gbps")
    derived("TbwRawReadGBps", sig, GBPS, "_raw_read",
            "raw_file / raw_file_after, the read of lustre.read_mode, the better of the two per repetition")
    derived("TbwLustreGetPctRaw", lambda v: pct(v, 0), PCT, "_lustre_vs_raw",
            "lustre.get_aggregate_gbps over that raw read, per repetition")
    modes = {str(all_rows[i]["lustre"]["read_mode"]) for _, i in quoted}
    mode = sorted(modes)[0]
    where = "; ".join(rf.source("rows", i, "lustre", "read_mode") for _, i in quoted)
    m.add("TbwLustreReadMode", READ_MODES[mode][0] if len(modes) == 1 else "in modes that differ by size ("
          + ", ".join(sorted(modes)) + ")", where)
    m.add("TbwRawReadKind", READ_MODES[mode][1] if len(modes) == 1 else "raw read of each size's mode", where)
    each("TbwHashedPutGBps", sig, GBPS, "store_put_hashed", "put_gbps")
    each("TbwHashedPutPctMemcpy", lambda v: pct(v, 0), PCT, "ratios", "store_put_hashed_vs_memcpy")
    m.add("TbwMemOverheadPct", pct(rf.num("memory_overhead", "overhead_fraction"), 2),
          rf.source("memory_overhead", "overhead_fraction"))
    m.add("TbwMemOverheadBlock", size(rf.num("memory_overhead", "block_bytes")),
          rf.source("memory_overhead", "block_bytes"))


def _table(ctx: Context, rf: ResultsFile, rows: list[dict]) -> None:
    cols = [("block", "r"), ("op", "l"), ("memcpy", "r"), ("raw file", "r"), ("GPU (numpy)", "r"), ("SHM", "r"),
            ("LUSTRE", "r"), ("store put+hash", "r"), ("SHM/memcpy", "r"), ("LUSTRE/raw", "r")]
    t = ctx.table("tier_bandwidth", cols, [rf])
    for k, r in enumerate(rows):
        if k:
            t.rule()
        t.add(size(r["block_bytes"]), "put", sig(r["memcpy"]["gbps"]), sig(r["raw_file"]["write_gbps"]),
              *(sig(r[tier]["put_gbps"]) for tier in TIERS), sig(r["store_put_hashed"]["put_gbps"]), "--",
              sig(r["ratios"]["lustre_put_vs_raw_write"], 2))
        t.add("", "get", "", sig(r["_raw_read"]),
              *(sig(r[tier]["get_aggregate_gbps" if tier == "lustre" else "get_gbps"]) for tier in TIERS), "--",
              sig(r["ratios"]["shm_get_vs_memcpy"], 2), sig(r["_lustre_vs_raw"], 2))
    ctx.put(t)


SPEC = FigureSpec("tier_bandwidth", CAPTION, "tier_bandwidth results", build, macros=MACROS,
                  tables={"tier_bandwidth": TABLE_CAPTION}, wide_tables=("tier_bandwidth",))
