"""Table: the REMOTE tier and the global directory beside raw MPI one-sided operations.

Source: the newest ``mpi_micro`` results file (:mod:`benchmark.workloads.mpi_micro`,
``mpiexec -n 2 python -m mpi4py -m benchmark.workloads.mpi_micro --save``).
"""
from __future__ import annotations

from ..core import Context, FigureSpec, Skip, absent
from ..macros import integer, pct, sig, size
from ..results import ResultsFile
from .common import default_block_bytes, reference_row

TABLE_CAPTION = (r"MPI one-sided costs on one node: REMOTE-tier reads (\texttt{RemoteTier.read\_into}) beside "
                 r"a raw \texttt{Get}\,+\,\texttt{Flush} of the same bytes from a window of the same "
                 r"rank (GB/s, medians), and a directory \texttt{lookup} of an id owned by another rank beside "
                 r"one raw \texttt{Fetch\_and\_op}\,+\,\texttt{Flush} round trip ($\mu$s).")

MACROS = ("MpiRefBlock", "MpiRemoteGBps", "MpiRawGetGBps", "MpiRemotePctRaw", "MpiLookupPFiftyUs",
          "MpiLookupPNinetyNineUs", "MpiFetchOpPFiftyUs", "MpiLookupOverFetchOp", "MpiInsertPFiftyUs",
          "MpiBatchedIdsPerSec", "MpiRanks")


def build(ctx: Context) -> list[ResultsFile]:
    rf = ctx.results.newest("mpi_micro")
    if rf is None:
        raise absent("mpi_micro")
    rb = rf.mapping("remote_bandwidth")
    if "skipped" in rb:
        raise Skip(f"{rf.name}: remote_bandwidth skipped: {rb['skipped']}")
    rows = rf.seq("remote_bandwidth", "rows")
    for i, row in enumerate(rows):
        for key in ("bytes", "tier_gbps", "raw_get_gbps", "ratio"):
            rf.num(key, within=row, prefix=("remote_bandwidth", "rows", i))
    rows_sorted = sorted(rows, key=lambda r: r["bytes"])
    ref = reference_row(rows_sorted, default_block_bytes(), key="bytes")
    i = rows.index(ref)
    m = ctx.macros
    m.add("MpiRanks", integer(rf.num("ranks")), rf.source("ranks"))
    m.add("MpiRefBlock", size(ref["bytes"]), rf.source("remote_bandwidth", "rows", i, "bytes")
          + " (smallest measured size >= the default block)")
    m.add("MpiRemoteGBps", sig(ref["tier_gbps"]), rf.source("remote_bandwidth", "rows", i, "tier_gbps"))
    m.add("MpiRawGetGBps", sig(ref["raw_get_gbps"]), rf.source("remote_bandwidth", "rows", i, "raw_get_gbps"))
    m.add("MpiRemotePctRaw", pct(ref["ratio"], 0), rf.source("remote_bandwidth", "rows", i, "ratio"))
    lat = ("directory_latency",)
    m.add("MpiLookupPFiftyUs", sig(rf.num(*lat, "lookup_us", "p50")), rf.source(*lat, "lookup_us", "p50"))
    m.add("MpiLookupPNinetyNineUs", sig(rf.num(*lat, "lookup_us", "p99")), rf.source(*lat, "lookup_us", "p99"))
    m.add("MpiFetchOpPFiftyUs", sig(rf.num(*lat, "raw_fetch_and_op_us", "p50")),
          rf.source(*lat, "raw_fetch_and_op_us", "p50"))
    m.add("MpiLookupOverFetchOp", sig(rf.num(*lat, "lookup_p50_over_raw_fetch_and_op"), 2),
          rf.source(*lat, "lookup_p50_over_raw_fetch_and_op"))
    m.add("MpiInsertPFiftyUs", sig(rf.num(*lat, "insert_us", "p50")), rf.source(*lat, "insert_us", "p50"))
    m.add("MpiBatchedIdsPerSec", integer(rf.num(*lat, "batched", "median_ids_per_s")),
          rf.source(*lat, "batched", "median_ids_per_s"))

    t = ctx.table("mpi_micro", [("operation", "l"), ("size", "r"), ("Cascade", "r"), ("raw MPI", "r"),
                                ("ratio", "r")], [rf])
    for r in rows_sorted:
        t.add(r"REMOTE read (GB/s)", size(r["bytes"]), sig(r["tier_gbps"]), sig(r["raw_get_gbps"]),
              sig(r["ratio"], 2))
    t.rule()
    for q in ("p50", "p99"):
        t.add(f"lookup {q} ($\\mu$s)", "--", sig(rf.num(*lat, "lookup_us", q)),
              sig(rf.num(*lat, "raw_fetch_and_op_us", q)),
              sig(rf.num(*lat, "lookup_us", q) / rf.num(*lat, "raw_fetch_and_op_us", q), 2))
    ctx.put(t)
    return [rf]


SPEC = FigureSpec("mpi_micro", "", "mpi_micro results", build, macros=MACROS,
                  tables={"mpi_micro": TABLE_CAPTION}, figure=False)
