"""Figure: scaling over ranks (and over nodes, when multi-node results exist).

Sources:

* ranks: the newest ``scaling`` results file (schema ``cascade-bench/scaling/1`` in
  ``benchmark/README.md``): aggregate put and get GB/s per system and rank count, with the
  machine's aggregate memcpy and raw MPI ``Get`` limits per rank count;
* nodes: ``cascade_run_*.json`` files (``python -m cascade.app run``, as
  ``slurm/scaling.sbatch`` runs it) of at least two distinct node counts, the newest per
  node count: the exchange phase's aggregate put and cross-rank read GB/s (all ranks'
  bytes over the slowest rank's time).
"""
from __future__ import annotations

import math

from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from .. import style
from ..core import Context, FigureSpec, absent
from ..macros import MacroBook, integer, pct, sig, size
from ..results import ResultsFile
from ..tables import escape

ORDER = ("cascade", "cascade_file", "lmcache_cpu", "lmcache_disk", "lmcache_disk_odirect", "lmcache_cpu_disk", "redis",
         "redis_unix", "hdf5", "hdf5_nocache", "mooncake",
         "pdc")

CAPTION = (r"Weak scaling on one node: aggregate put (left) and get (right) throughput against the number of "
           r"ranks, each rank moving its own \ScaleBlocksPerRank blocks of \ScaleBlock (all ranks' bytes over "
           r"the slowest rank's time, median of rounds). Cascade is one cluster-wide store over all ranks; "
           r"every other system is one private instance per rank. The dashed line is this machine's "
           r"aggregate memcpy (all ranks copying at once) and the dash-dotted one raw MPI \texttt{Get} with "
           r"every rank reading from a neighbour, measured in the same run; ``Cascade, another rank's blocks'' "
           r"are gets of blocks put by a different rank, through the global directory; on one node they read the "
           r"peer's shared-memory slab or files directly, not over MPI. Points: medians over the "
           r"\SuiteReps repetitions of the suite run; vertical bars: their minimum and maximum.")
NODES_CAPTION = (r"Lower panel: the main job (\texttt{python -m cascade.app run}) on one to \ScaleMaxNodes nodes: "
                 r"aggregate put and cross-rank read throughput of its exchange phase.")

TABLE_CAPTION = (r"Scaling: aggregate put and get GB/s per system and number of ranks, speed-up over one rank, and "
                 r"the machine's aggregate limits of the same run.")

MACROS = ("ScaleBlocksPerRank", "ScaleBlock", "ScaleMaxRanks", "ScaleCascadeGetGBps", "ScaleCascadePutGBps",
          "ScaleCascadeGetSpeedup", "ScaleCascadePutSpeedup", "ScaleCascadeCrossGetGBps", "ScaleCrossPctLimit",
          "ScaleCrossLimit", "ScaleCrossPath",
          "ScaleMemcpyAggGBps", "ScaleMpiGetAggGBps", "ScaleGetPctMemcpyAgg", "ScaleMaxNodes", "ScaleNodeNote")


def _order(system: str) -> tuple[int, str]:
    return (ORDER.index(system) if system in ORDER else len(ORDER), system)


def _rows(rf: ResultsFile) -> list[tuple[int, dict]]:
    out = []
    for i, row in enumerate(rf.seq("rows")):
        p = ("rows", i)
        rf.get("system", within=row, prefix=p)
        rf.num("ranks", within=row, prefix=p)
        rf.num("put_gbps", within=row, prefix=p)
        rf.num("get_gbps", within=row, prefix=p)
        rf.get("cross_get_gbps", within=row, prefix=p)  # null where it does not apply
        out.append((i, row))
    return out


def node_runs(ctx: Context) -> list[tuple[ResultsFile, float, float]]:
    """Newest run file per node count, as (file, aggregate put GB/s, aggregate cross-rank
    read GB/s); empty unless there are at least two node counts."""
    by_nodes: dict[int, ResultsFile] = {}
    for f in ctx.results.of("run"):
        if "exchange" in f.doc and "per_rank_stats" in f.doc:
            by_nodes[f.nodes] = f  # of() is oldest first: the newest wins
    if len(by_nodes) < 2:
        return []
    out = []
    for nodes in sorted(by_nodes):
        f = by_nodes[nodes]
        block = f.num("per_rank_stats", 0, "block_bytes")
        ex = f.seq("exchange")
        put_b = sum(f.num("blocks_put", within=e, prefix=("exchange", k)) for k, e in enumerate(ex)) * block
        got_b = sum(f.num("blocks_read", within=e, prefix=("exchange", k)) for k, e in enumerate(ex)) * block
        put_s = max(f.num("put_s", within=e, prefix=("exchange", k)) for k, e in enumerate(ex))
        get_s = max(f.num("get_s", within=e, prefix=("exchange", k)) for k, e in enumerate(ex))
        out.append((f, put_b / put_s / 1e9, got_b / get_s / 1e9))
    return out


def build(ctx: Context) -> list[ResultsFile]:
    rf = ctx.results.newest("scaling")
    if rf is None:
        raise absent("scaling")
    rows = _rows(rf)
    counts = sorted({int(r["ranks"]) for _, r in rows})
    systems = sorted({str(r["system"]) for _, r in rows}, key=_order)
    limits = {int(k): v for k, v in rf.mapping("limits").items()}
    for n in counts:
        rf.num("limits", str(n), "memcpy_aggregate_gbps")
    nodes = node_runs(ctx)
    sources = [rf] + [f for f, _, _ in nodes]

    if nodes:
        fig, axes = style.figure(4.6, nrows=2, ncols=2, gridspec_kw={"height_ratios": [1.3, 1]})
        (ax_put, ax_get), (ax_nodes, ax_blank) = axes
        ax_nodes.remove()
        ax_blank.remove()
        ax_nodes = fig.add_subplot(2, 1, 2)
    else:
        fig, (ax_put, ax_get) = style.figure(2.9, ncols=2, sharey=True)
        ax_nodes = None
    for ax, metric in ((ax_put, "put_gbps"), (ax_get, "get_gbps")):
        ys = [limits[n]["memcpy_aggregate_gbps"] for n in counts]
        ax.plot(counts, ys, color="black", ls="--", lw=0.9)
        style.whiskers(ax, counts, ys, "black")
        for system in systems:
            mine = sorted((r for _, r in rows if r["system"] == system), key=lambda r: r["ranks"])
            _, color, marker = style.series(system)
            xs, ys = [r["ranks"] for r in mine], [r[metric] for r in mine]
            ax.plot(xs, ys, color=color, marker=marker)
            style.whiskers(ax, xs, ys, color)
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts)
        ax.set_xticklabels([str(n) for n in counts])
        ax.minorticks_off()
        ax.set_xlabel("ranks")
        ax.set_title("put" if metric == "put_gbps" else "get", pad=2)
    mpi = [(n, limits[n]["mpi_get_aggregate_gbps"]) for n in counts if "mpi_get_aggregate_gbps" in limits[n]]
    if mpi:
        ax_get.plot([n for n, _ in mpi], [v for _, v in mpi], color=style.LIMIT_COLOR, ls="-.", lw=0.9, marker="+")
        style.whiskers(ax_get, [n for n, _ in mpi], [v for _, v in mpi], style.LIMIT_COLOR)
    cross = sorted((r for _, r in rows if r["system"] == "cascade" and r.get("cross_get_gbps")),
                   key=lambda r: r["ranks"])
    _, ccolor, _ = style.series("cascade")
    if cross:
        ax_get.plot([r["ranks"] for r in cross], [r["cross_get_gbps"] for r in cross], color=ccolor, ls=":",
                    marker="x")
        style.whiskers(ax_get, [r["ranks"] for r in cross], [r["cross_get_gbps"] for r in cross], ccolor)
    ax_put.set_ylabel("aggregate (GB/s)")
    for ax in (ax_put, ax_get):
        ax.set_yscale("log")
    lo = min(v for ax in (ax_put, ax_get) for line in ax.get_lines() for v in line.get_ydata())
    hi = max(v for ax in (ax_put, ax_get) for line in ax.get_lines() for v in line.get_ydata())
    for ax in (ax_put, ax_get):
        ax.set_ylim(10 ** math.floor(math.log10(lo)), 10 ** math.ceil(math.log10(hi)))
        ax.yaxis.set_major_locator(LogLocator(base=10))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    if not nodes:
        ax_get.tick_params(labelleft=False)
    handles = [Line2D([], [], color="black", ls="--", lw=0.9, label="memcpy, all ranks")]
    if mpi:
        handles.append(Line2D([], [], color=style.LIMIT_COLOR, ls="-.", lw=0.9, marker="+",
                              label="raw MPI Get, all ranks"))
    if cross:
        handles.append(Line2D([], [], color=ccolor, ls=":", marker="x", label="Cascade, another rank's blocks"))
    for system in systems:
        lbl, color, marker = style.series(system)
        handles.append(Line2D([], [], color=color, marker=marker, label=lbl))
    extra = ""
    if ax_nodes is not None:
        xs = [f.nodes for f, _, _ in nodes]
        ax_nodes.plot(xs, [p for _, p, _ in nodes], color=ccolor, marker="o", ls="--", label="Cascade put (exchange)")
        ax_nodes.plot(xs, [g for _, _, g in nodes], color=ccolor, marker="x", ls=":",
                      label="Cascade, reads of other ranks' blocks")
        ax_nodes.set_xticks(xs)
        ax_nodes.set_xticklabels([str(n) for n in xs])
        ax_nodes.set_xlabel("nodes")
        ax_nodes.set_ylabel("aggregate (GB/s)")
        ax_nodes.set_ylim(bottom=0)
        ax_nodes.legend(loc="lower right")
        extra = NODES_CAPTION
    bottom = style.legend_below(fig, handles)
    if nodes:
        fig.subplots_adjust(left=0.19, right=0.97, top=0.95, bottom=bottom, hspace=0.6, wspace=0.35)
    else:
        fig.subplots_adjust(left=0.15, right=0.97, top=0.93, bottom=bottom, wspace=0.08)
    ctx.save(fig, sources, caption_extra=extra)

    _macros(ctx.macros, rf, rows, counts, nodes)
    _table(ctx, rf, rows, counts, systems, limits)
    return sources


def _macros(m: MacroBook, rf: ResultsFile, rows: list[tuple[int, dict]], counts: list[int],
            nodes: list[tuple[ResultsFile, float, float]]) -> None:
    top = counts[-1]
    m.add("ScaleBlocksPerRank", integer(rf.num("blocks_per_rank")), rf.source("blocks_per_rank"))
    m.add("ScaleBlock", size(rf.num("block_bytes")), rf.source("block_bytes"))
    m.add("ScaleMaxRanks", integer(top), rf.source("rank_counts"))
    m.add("ScaleMemcpyAggGBps", sig(rf.num("limits", str(top), "memcpy_aggregate_gbps")),
          rf.source("limits", str(top), "memcpy_aggregate_gbps"))
    if "mpi_get_aggregate_gbps" in rf.mapping("limits", str(top)):
        m.add("ScaleMpiGetAggGBps", sig(rf.num("limits", str(top), "mpi_get_aggregate_gbps")),
              rf.source("limits", str(top), "mpi_get_aggregate_gbps"))
    else:
        m.add("ScaleMpiGetAggGBps", "--", f"{rf.name}: no raw MPI Get at {top} rank(s)")
    found = [(i, r) for i, r in rows if r["system"] == "cascade" and int(r["ranks"]) == top]
    if found:
        i, r = found[0]
        m.add("ScaleCascadeGetGBps", sig(r["get_gbps"]), rf.source("rows", i, "get_gbps"))
        m.add("ScaleCascadePutGBps", sig(r["put_gbps"]), rf.source("rows", i, "put_gbps"))
        m.add("ScaleCascadeGetSpeedup", sig(rf.num("rows", i, "speedup_vs_1_rank", "get_gbps"), 2),
              rf.source("rows", i, "speedup_vs_1_rank", "get_gbps"))
        m.add("ScaleCascadePutSpeedup", sig(rf.num("rows", i, "speedup_vs_1_rank", "put_gbps"), 2),
              rf.source("rows", i, "speedup_vs_1_rank", "put_gbps"))
        m.add("ScaleGetPctMemcpyAgg", pct(rf.num("rows", i, "vs_limit", "get_gbps_vs_memcpy_aggregate"), 0),
              rf.source("rows", i, "vs_limit", "get_gbps_vs_memcpy_aggregate"))
        if r.get("cross_get_gbps"):
            m.add("ScaleCascadeCrossGetGBps", sig(r["cross_get_gbps"]), rf.source("rows", i, "cross_get_gbps"))
            # the limit the harness compares with: aggregate memcpy on one node (the bytes come
            # from the peer's /dev/shm slab, not over MPI), MPI Get across nodes
            limits = rf.mapping("rows", i, "vs_limit")
            key, what = (("cross_get_gbps_vs_mpi_get_aggregate", "raw MPI \\texttt{Get} with every rank reading at once")
                         if "cross_get_gbps_vs_mpi_get_aggregate" in limits else
                         ("cross_get_gbps_vs_memcpy_aggregate", "the aggregate memcpy"))
            m.add("ScaleCrossPctLimit", pct(rf.num("rows", i, "vs_limit", key), 0), rf.source("rows", i, "vs_limit", key))
            m.add("ScaleCrossLimit", what, rf.source("rows", i, "vs_limit", key) + " (which limit)")
            path = r.get("cross_get_path")
            m.add("ScaleCrossPath", escape(str(path)) if path else "a path the run does not record",
                  rf.source("rows", i, "cross_get_path") if path else f"{rf.name}: no cross_get_path")
        else:
            for macro in ("ScaleCascadeCrossGetGBps", "ScaleCrossPctLimit", "ScaleCrossLimit", "ScaleCrossPath"):
                m.add(macro, "--", f"{rf.name}: rows[{i}].cross_get_gbps is null")
    else:
        for macro in ("ScaleCascadeGetGBps", "ScaleCascadePutGBps", "ScaleCascadeGetSpeedup", "ScaleCascadePutSpeedup",
                      "ScaleGetPctMemcpyAgg", "ScaleCascadeCrossGetGBps", "ScaleCrossPctLimit", "ScaleCrossLimit",
                      "ScaleCrossPath"):
            m.add(macro, "--", f"{rf.name}: no cascade row at {top} ranks")
    if nodes:
        m.add("ScaleMaxNodes", integer(max(f.nodes for f, _, _ in nodes)),
              "; ".join(f.source("nodes") for f, _, _ in nodes))
        m.add("ScaleNodeNote", r"the bottom panel of Fig.~\ref{fig:scaling} shows the main job on up to "
              + integer(max(f.nodes for f, _, _ in nodes)) + " nodes",
              "; ".join(f.name for f, _, _ in nodes))
    else:
        m.add("ScaleMaxNodes", "--", "no cascade_run files of two or more node counts")
        m.add("ScaleNodeNote", "no multi-node results exist yet, so scaling over nodes is not shown",
              "no cascade_run files of two or more node counts in the results directory")


def _table(ctx: Context, rf: ResultsFile, rows: list[tuple[int, dict]], counts: list[int], systems: list[str],
           limits: dict[int, dict]) -> None:
    t = ctx.table("scaling", [("system", "l"), ("ranks", "r"), ("put", "r"), ("get", "r"), (r"put $\times$", "r"),
                              (r"get $\times$", "r")], [rf])
    for k, system in enumerate(["limits", *systems]):
        if k:
            t.rule()
        if system == "limits":
            for n in counts:
                mpi = limits[n].get("mpi_get_aggregate_gbps")
                t.add(r"\emph{memcpy\,/\,MPI Get}", integer(n), sig(limits[n]["memcpy_aggregate_gbps"]),
                      sig(mpi) if isinstance(mpi, (int, float)) else "--", "--", "--")
            continue
        for _, r in sorted(((i, r) for i, r in rows if r["system"] == system), key=lambda ir: ir[1]["ranks"]):
            speed = r.get("speedup_vs_1_rank") or {}
            t.add(escape(style.label(system)), integer(r["ranks"]), sig(r["put_gbps"]), sig(r["get_gbps"]),
                  sig(speed["put_gbps"], 2) if isinstance(speed.get("put_gbps"), (int, float)) else "--",
                  sig(speed["get_gbps"], 2) if isinstance(speed.get("get_gbps"), (int, float)) else "--")
    ctx.put(t)


SPEC = FigureSpec("scaling", CAPTION, "scaling results", build, macros=MACROS, tables={"scaling": TABLE_CAPTION})
