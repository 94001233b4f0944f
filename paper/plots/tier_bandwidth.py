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
from ..macros import pct, sig, size
from ..results import ResultsFile
from .common import default_block_bytes, reference_row

TIERS = ("gpu", "shm", "lustre")
RATIOS = ("shm_get_vs_memcpy", "store_put_hashed_vs_memcpy", "lustre_cold_get_vs_raw_odirect_read",
          "lustre_put_vs_raw_write")

CAPTION = (r"Put (left) and get (right) bandwidth of each Cascade tier against block size, beside "
           r"this machine's limits measured in the same run (grey): memcpy of the same size, and a raw "
           r"file of the same blocks on the file tier's file system, written buffered with one "
           r"\texttt{fsync} and read back with \texttt{O\_DIRECT}. LUSTRE-tier gets are cold "
           r"\texttt{O\_DIRECT} reads with checksum verification. The GPU tier runs its code with numpy as "
           r"array module (host memory: no GPU here). ``store put + BLAKE3'' is a whole "
           r"\texttt{CascadeStore.put} including content hashing. Medians of per-block times; points are "
           r"medians over the \SuiteReps repetitions of the suite run, vertical bars their minimum and maximum.")

MACROS = ("TbwRefBlock", "TbwSmallBlock", "TbwLargeBlock", "TbwMemcpyGBps", "TbwRawReadGBps", "TbwRawWriteGBps",
          "TbwShmPutGBps", "TbwShmGetGBps", "TbwShmGetPctMemcpy", "TbwShmGetSmallGBps", "TbwShmGetSmallPctMemcpy",
          "TbwLustrePutGBps", "TbwLustreGetGBps", "TbwLustreGetPctRaw", "TbwLustrePutPctRaw",
          "TbwHashedPutGBps", "TbwHashedPutPctMemcpy", "TbwMemOverheadPct", "TbwMemOverheadBlock")

TABLE_CAPTION = (r"Tier bandwidth in GB/s per block size (medians of per-block times; median and range over the "
                 r"repetitions), the machine's limits measured in the same runs (raw file: buffered write for puts, "
                 r"\texttt{O\_DIRECT} read for gets), and the ratios each run reports (LUSTRE/raw: put over raw "
                 r"write, cold get over raw read).")


def _rows(rf: ResultsFile) -> list[dict]:
    rows = rf.seq("rows")
    for i, row in enumerate(rows):
        rf.num("block_bytes", within=row, prefix=("rows", i))
        rf.num("memcpy", "gbps", within=row, prefix=("rows", i))
        rf.num("raw_file", "read_gbps", within=row, prefix=("rows", i))
        rf.num("raw_file", "write_gbps", within=row, prefix=("rows", i))
        for tier in TIERS:
            rf.num(tier, "put_gbps", within=row, prefix=("rows", i))
            rf.num(tier, "get_gbps", within=row, prefix=("rows", i))
        rf.num("store_put_hashed", "put_gbps", within=row, prefix=("rows", i))
        for ratio in RATIOS:
            rf.num("ratios", ratio, within=row, prefix=("rows", i))
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
        raw = "write_gbps" if op == "put" else "read_gbps"
        ys = [r["raw_file"][raw] for r in rows]
        ax.plot(sizes, ys, color=style.LIMIT_COLOR, ls=":", lw=1.1)
        style.whiskers(ax, sizes, ys, style.LIMIT_COLOR)
        for tier in TIERS:
            _, color, marker = style.series(tier)
            ys = [r[tier][f"{op}_gbps"] for r in rows]
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
    ref = reference_row(rows, default_block_bytes())
    i = all_rows.index(ref)
    small, large = rows[0], rows[-1]
    i_small, i_large = all_rows.index(small), all_rows.index(large)
    m = ctx.macros
    m.add("TbwRefBlock", size(ref["block_bytes"]), rf.source("rows", i, "block_bytes")
          + " (smallest measured size >= the default block, paper/plots/common.py)")
    m.add("TbwSmallBlock", size(small["block_bytes"]), rf.source("rows", i_small, "block_bytes"))
    m.add("TbwLargeBlock", size(large["block_bytes"]), rf.source("rows", i_large, "block_bytes"))
    m.add("TbwMemcpyGBps", sig(rf.num("rows", i, "memcpy", "gbps")), rf.source("rows", i, "memcpy", "gbps"))
    m.add("TbwRawReadGBps", sig(rf.num("rows", i, "raw_file", "read_gbps")), rf.source("rows", i, "raw_file", "read_gbps"))
    m.add("TbwRawWriteGBps", sig(rf.num("rows", i, "raw_file", "write_gbps")),
          rf.source("rows", i, "raw_file", "write_gbps"))
    m.add("TbwShmPutGBps", sig(rf.num("rows", i, "shm", "put_gbps")), rf.source("rows", i, "shm", "put_gbps"))
    m.add("TbwShmGetGBps", sig(rf.num("rows", i, "shm", "get_gbps")), rf.source("rows", i, "shm", "get_gbps"))
    m.add("TbwShmGetPctMemcpy", pct(rf.num("rows", i, "ratios", "shm_get_vs_memcpy"), 0),
          rf.source("rows", i, "ratios", "shm_get_vs_memcpy"))
    m.add("TbwShmGetSmallGBps", sig(rf.num("rows", i_small, "shm", "get_gbps")),
          rf.source("rows", i_small, "shm", "get_gbps"))
    m.add("TbwShmGetSmallPctMemcpy", pct(rf.num("rows", i_small, "ratios", "shm_get_vs_memcpy"), 0),
          rf.source("rows", i_small, "ratios", "shm_get_vs_memcpy"))
    m.add("TbwLustrePutGBps", sig(rf.num("rows", i, "lustre", "put_gbps")), rf.source("rows", i, "lustre", "put_gbps"))
    m.add("TbwLustreGetGBps", sig(rf.num("rows", i, "lustre", "get_gbps")), rf.source("rows", i, "lustre", "get_gbps"))
    m.add("TbwLustreGetPctRaw", pct(rf.num("rows", i, "ratios", "lustre_cold_get_vs_raw_odirect_read"), 0),
          rf.source("rows", i, "ratios", "lustre_cold_get_vs_raw_odirect_read"))
    m.add("TbwLustrePutPctRaw", pct(rf.num("rows", i, "ratios", "lustre_put_vs_raw_write"), 0),
          rf.source("rows", i, "ratios", "lustre_put_vs_raw_write"))
    m.add("TbwHashedPutGBps", sig(rf.num("rows", i, "store_put_hashed", "put_gbps")),
          rf.source("rows", i, "store_put_hashed", "put_gbps"))
    m.add("TbwHashedPutPctMemcpy", pct(rf.num("rows", i, "ratios", "store_put_hashed_vs_memcpy"), 0),
          rf.source("rows", i, "ratios", "store_put_hashed_vs_memcpy"))
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
        t.add("", "get", "", sig(r["raw_file"]["read_gbps"]), *(sig(r[tier]["get_gbps"]) for tier in TIERS), "--",
              sig(r["ratios"]["shm_get_vs_memcpy"], 2), sig(r["ratios"]["lustre_cold_get_vs_raw_odirect_read"], 2))
    ctx.put(t)


SPEC = FigureSpec("tier_bandwidth", CAPTION, "tier_bandwidth results", build, macros=MACROS,
                  tables={"tier_bandwidth": TABLE_CAPTION}, wide_tables=("tier_bandwidth",))
