"""Figure: block hit ratio against cache capacity on a trace, for Cascade's policies
beside LRU and the offline optimum (Belady).

Source: the newest ``trace_replay`` results file of Cascade
(:mod:`benchmark.workloads.trace_replay`); other systems' ``trace_replay`` files are drawn
beside it when the harness wrote them (see :mod:`paper.plots.systems` for their schema).
"""
from __future__ import annotations

import os

from .. import style
from ..core import Context, FigureSpec, Skip
from ..macros import integer, pct
from ..results import ResultsFile
from ..tables import escape

POLICIES = ("reference_lru", "reference_belady", "cascade_lru", "cascade_semantic")
# Cascade LRU hollow and larger, so a semantic point on top of it stays visible
_LINES = {"reference_lru": dict(ls="--", lw=1.0), "reference_belady": dict(ls=":", lw=1.3),
          "cascade_lru": dict(mfc="white", ms=5.0)}

CAPTION = (r"Block hit ratio against cache capacity (in blocks) when the same trace is replayed through "
           r"Cascade's store with its semantic policy and with LRU, beside a reference LRU and the "
           r"offline optimum (Belady). Same semantics for all: every block reference is a lookup and a "
           r"missed block is cached right after it.")

TABLE_CAPTION = (r"Trace replay: block hit ratio (\%) per capacity; ``gap closed'' is "
                 r"$(\mathit{hit}-\mathit{LRU})/(\mathit{Belady}-\mathit{LRU})$ of the semantic policy; "
                 r"``tokens'' is its token hit ratio, the fraction of prompt tokens needing no prefill.")

MACROS = ("TrRequests", "TrReferences", "TrCapacity", "TrLruPct", "TrBeladyPct", "TrSemanticPct", "TrCascadeLruPct",
          "TrGapClosedPct", "TrSemanticTokenPct", "TrMinCapacity", "TrMaxCapacity")


def _rows(rf: ResultsFile) -> list[dict]:
    rows = rf.seq("rows")
    for i, row in enumerate(rows):
        rf.num("capacity_blocks", within=row, prefix=("rows", i))
        for p in POLICIES:
            rf.num(p, "block_hit_ratio", within=row, prefix=("rows", i))
            rf.num(p, "token_hit_ratio", within=row, prefix=("rows", i))
        rf.num("cascade_semantic", "gap_closed", within=row, prefix=("rows", i))
    return sorted(rows, key=lambda r: r["capacity_blocks"])


def trace_name(rf: ResultsFile) -> str:
    source = str(rf.get("source"))
    return os.path.basename(source) if os.sep in source else source


def build(ctx: Context) -> list[ResultsFile]:
    rf = ctx.results.newest("trace_replay", "cascade")
    if rf is None:
        raise Skip("no cascade trace_replay results (python -m benchmark.run_benchmark --system cascade "
                   "--workload trace_replay)")
    rows = _rows(rf)
    caps = [r["capacity_blocks"] for r in rows]
    fig, ax = style.figure(2.3)
    for p in POLICIES:
        lbl, color, marker = style.series(p)
        ax.plot(caps, [100 * r[p]["block_hit_ratio"] for r in rows], color=color, marker=marker,
                label=lbl, **_LINES.get(p, {}))
    ax.set_xscale("log")
    ax.set_xticks(caps)
    ax.set_xticklabels([f"{c:,.0f}" for c in caps])
    ax.minorticks_off()
    ax.set_xlabel("cache capacity (blocks)")
    ax.set_ylabel("block hit ratio (%)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2)
    fig.subplots_adjust(left=0.14, right=0.97, top=0.97, bottom=0.36)
    extra = (f"Trace: \\texttt{{{escape(trace_name(rf))}}}, the first \\TrRequests requests "
             f"(\\TrReferences block references).")
    ctx.save(fig, [rf], caption_extra=extra)

    all_rows = rf.seq("rows")
    quoted = max(rows, key=lambda r: (r["reference_belady"]["block_hit_ratio"] - r["reference_lru"]["block_hit_ratio"],
                                      -r["capacity_blocks"]))
    i = all_rows.index(quoted)
    m = ctx.macros
    m.add("TrRequests", integer(rf.num("requests")), rf.source("requests"))
    m.add("TrReferences", integer(rf.num("rows", i, "cascade_semantic", "references")),
          rf.source("rows", i, "cascade_semantic", "references"))
    m.add("TrCapacity", integer(quoted["capacity_blocks"]),
          rf.source("rows", i, "capacity_blocks") + " (the row with the widest LRU-to-Belady gap)")
    m.add("TrMinCapacity", integer(rows[0]["capacity_blocks"]), rf.source("rows", all_rows.index(rows[0]), "capacity_blocks"))
    m.add("TrMaxCapacity", integer(rows[-1]["capacity_blocks"]),
          rf.source("rows", all_rows.index(rows[-1]), "capacity_blocks"))
    for macro, policy in (("TrLruPct", "reference_lru"), ("TrBeladyPct", "reference_belady"),
                          ("TrSemanticPct", "cascade_semantic"), ("TrCascadeLruPct", "cascade_lru")):
        m.add(macro, pct(rf.num("rows", i, policy, "block_hit_ratio")), rf.source("rows", i, policy, "block_hit_ratio"))
    m.add("TrGapClosedPct", pct(rf.num("rows", i, "cascade_semantic", "gap_closed"), 0),
          rf.source("rows", i, "cascade_semantic", "gap_closed"))
    m.add("TrSemanticTokenPct", pct(rf.num("rows", i, "cascade_semantic", "token_hit_ratio")),
          rf.source("rows", i, "cascade_semantic", "token_hit_ratio"))

    t = ctx.table("trace_replay", [("capacity", "r"), ("LRU", "r"), ("Belady", "r"), ("Cascade LRU", "r"),
                                   ("semantic", "r"), ("gap closed", "r"), ("tokens", "r")], [rf])
    for r in rows:
        t.add(integer(r["capacity_blocks"]), *(pct(r[p]["block_hit_ratio"]) for p in POLICIES),
              pct(r["cascade_semantic"]["gap_closed"], 0), pct(r["cascade_semantic"]["token_hit_ratio"]))
    ctx.put(t)
    return [rf]


SPEC = FigureSpec("hit_ratio", CAPTION, "cascade trace_replay results", build, macros=MACROS,
                  tables={"trace_replay": TABLE_CAPTION})
