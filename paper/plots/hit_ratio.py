"""Figure: hit ratio against cache capacity on a trace, for every system with eviction,
beside LRU and the offline optimum (Belady).

Source: the newest ``trace_replay`` results file (:mod:`benchmark.workloads.trace_replay`,
schema ``cascade-bench/trace_replay/2`` in ``benchmark/README.md``).

The capacities need not replay the same requests: Cascade replays the whole trace at
``full_capacities`` (``scope: "full"``) and every system a common prefix at the others
(``scope: "compare"``), so each ``rows`` entry and each number quoted from it carries its
own request count. Only points replayed on the same requests are comparable, so a line
joins only those (one line per system or policy and request count; a request count of a
single capacity is a marker alone), and each capacity's tick names its requests.

* top: block hit ratio of every system row that replayed the whole of its run (the whole
  trace, or all of its prefix: :func:`_whole`) on the requests of the LRU and Belady lines
  at its capacity (``rows``);
* bottom: every system's place between LRU (0) and Belady (100 %) on exactly the requests
  it replayed (``gap_closed``): slow systems stop at a time limit, and this is the
  comparison that stays fair for them.
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from .. import style
from ..core import Context, FigureSpec, absent
from ..macros import MacroBook, integer, pct
from ..results import ResultsFile
from ..tables import escape

POLICIES = ("reference_lru", "reference_belady", "cascade_lru", "cascade_semantic")
# markers: a capacity whose requests no other capacity replayed is a point, not a line
REFS = {"reference_lru": dict(color="#777777", ls="--", lw=1.0, marker="x", ms=4.5, zorder=2.5),
        "reference_belady": dict(color="#000000", ls=":", lw=1.3, marker="*", ms=5.0, zorder=2.5)}
# system_rows names -> legend label in this figure (Cascade's two tiers, two policies)
LABELS = {"cascade": "Cascade (SHM), semantic", "cascade_lru": "Cascade (SHM), LRU",
          "cascade_file": "Cascade (file tier), semantic"}
SYSTEM_ORDER = ("cascade", "cascade_lru", "cascade_file", "lmcache_cpu", "lmcache_disk", "lmcache_cpu_disk", "redis",
                "mooncake")

CAPTION = (r"Hit ratio against cache capacity (in blocks) when a request trace (Trace, below) is replayed through every "
           r"system with eviction, each given the same capacity in bytes; a capacity replays the whole trace or "
           r"a prefix of it (in parentheses under each capacity, and in Table~\ref{tab:trace_replay}), and lines "
           r"join only capacities that replayed the same requests (a lone marker: no other capacity did). Top: "
           r"block hit ratio of the systems that replayed all of a capacity's requests, beside LRU and the offline "
           r"optimum (Belady) on the same requests. Bottom: where each system lies between LRU (at zero) and Belady "
           r"(at the top line), each on exactly the requests it replayed; hollow markers are replays the time limit "
           r"stopped early. Same semantics everywhere: every block reference is a lookup and a missed block is put "
           r"right after it. Cascade replays through its real store with parents and in-flight pins. Where the "
           r"\SuiteReps repetitions of the suite run differ, points are medians and vertical bars their "
           r"minimum and maximum.")

TABLE_CAPTION = (r"Trace replay through Cascade's store: requests replayed (the whole trace or a prefix of it) "
                 r"and block hit ratio (\%) per capacity, LRU and Belady on the same requests; ``gap closed'' is "
                 r"$(\mathit{hit}-\mathit{LRU})/(\mathit{Belady}-\mathit{LRU})$ of the semantic policy; "
                 r"``tokens'' is its token hit ratio, the fraction of prompt tokens needing no prefill.")
SYSTEMS_CAPTION = (r"Trace replay, every system (Cascade: SHM tier, semantic policy, unless named): requests "
                   r"replayed, block hit ratio, LRU and Belady on the same requests (\%), and the fraction of the "
                   r"LRU-to-Belady gap closed (\%); $^\ast$: stopped by the time "
                   r"limit before the end of its requests.")

MACROS = ("TrRequests", "TrReferences", "TrCapacity", "TrLruPct", "TrBeladyPct", "TrSemanticPct", "TrCascadeLruPct",
          "TrGapClosedPct", "TrSemanticTokenPct", "TrMinCapacity", "TrMaxCapacity", "TrBestPeer", "TrBestPeerGapPct",
          "TrPeerRequests", "TrPeerCapacity", "TrCascadePeerGapPct", "TrPeersReplayed", "TrTraceKind",
          "TrTraceRequests", "TrPeerPrefix")


def _rows(rf: ResultsFile) -> list[dict]:
    rows = rf.seq("rows")
    for i, row in enumerate(rows):
        rf.num("capacity_blocks", within=row, prefix=("rows", i))
        for p in POLICIES:
            rf.num(p, "block_hit_ratio", within=row, prefix=("rows", i))
            rf.num(p, "token_hit_ratio", within=row, prefix=("rows", i))
        rf.num("cascade_semantic", "gap_closed", within=row, prefix=("rows", i))
    return sorted(rows, key=lambda r: r["capacity_blocks"])


def _row_requests(rf: ResultsFile, i: int) -> tuple[float, str]:
    """Requests ``rows[i]`` was computed on, and where that is read: what Cascade replayed
    at that capacity (schema 3: the whole trace or the prefix all systems share), else the
    whole trace (schema 1)."""
    if "requests" in rf.mapping("rows", i, "cascade_semantic"):
        return rf.num("rows", i, "cascade_semantic", "requests"), rf.source("rows", i, "cascade_semantic", "requests")
    return rf.num("requests"), rf.source("requests")


def _whole(row: dict) -> bool:
    """Whether a ``system_rows`` entry replayed the whole of its run: the whole trace
    (``scope: "full"``) or every request of its prefix, not stopped by the time limit."""
    if row.get("truncated"):
        return False
    return row.get("scope") == "full" or row["requests"] == row.get("prefix_requests")


def _system_rows(rf: ResultsFile) -> list[tuple[int, dict]]:
    """``(index, row)`` of every ``system_rows`` entry."""
    out = []
    for i, row in enumerate(rf.seq("system_rows")):
        p = ("system_rows", i)
        rf.get("system", within=row, prefix=p)
        for key in ("capacity_blocks", "requests", "block_hit_ratio", "lru_block_hit_ratio", "belady_block_hit_ratio"):
            rf.num(key, within=row, prefix=p)
        rf.get("gap_closed", within=row, prefix=p)  # null when LRU already equals Belady
        out.append((i, row))
    return out


def _not_run(rf: ResultsFile) -> str:
    """`` Not run in one or more repetitions: X.`` for the systems of ``not_run`` (united
    over the repetitions by the merge), else nothing."""
    names = sorted({str(p.get("system")) for p in rf.doc.get("not_run") or [] if isinstance(p, dict)}, key=_order)
    return f" Not run in one or more repetitions: {escape(', '.join(style.label(s) for s in names))}." if names else ""


def trace_name(rf: ResultsFile) -> str:
    source = str(rf.get("source"))
    return os.path.basename(source) if os.sep in source else source


def _label(system: str) -> str:
    return LABELS.get(system, style.label(system))


def _order(system: str) -> tuple[int, str]:
    return (SYSTEM_ORDER.index(system) if system in SYSTEM_ORDER else len(SYSTEM_ORDER), system)


def pick(ctx: Context) -> ResultsFile | None:
    """The newest trace_replay file with Cascade's rows (whatever its ``--system`` label)."""
    files = [f for f in ctx.results.of("trace_replay") if "rows" in f.doc]
    return files[-1] if files else None


def build(ctx: Context) -> list[ResultsFile]:
    rf = pick(ctx)
    if rf is None:
        raise absent("trace_replay")
    rows = _rows(rf)
    srows = _system_rows(rf)
    requests = _requests(rf, rows)
    systems = sorted({str(r["system"]) for _, r in srows}, key=_order)
    fig = draw(rows, requests, srows, systems)
    extra = f"Trace: \\texttt{{{escape(trace_name(rf))}}}, \\TrTraceRequests requests." + _not_run(rf)
    ctx.save(fig, [rf], caption_extra=extra)

    _macros(ctx.macros, rf, rows, srows)
    _tables(ctx, rf, rows, requests, srows, systems)
    return [rf]


def _requests(rf: ResultsFile, rows: list[dict]) -> dict[float, float]:
    """Per capacity, the requests its row of ``rows`` was computed on."""
    all_rows = rf.seq("rows")
    return {r["capacity_blocks"]: _row_requests(rf, all_rows.index(r))[0] for r in rows}


def _by_requests(points: Iterable[tuple[float, float, Any]]) -> list[tuple[list[float], list[Any]]]:
    """``(requests, capacity, value)`` points as one (capacities, values) series per request
    count, by capacity: only points replayed on the same requests are joined by a line."""
    groups: dict[float, list[tuple[float, Any]]] = {}
    for n, cap, value in sorted(points, key=lambda p: (float(p[0]), p[1])):
        groups.setdefault(float(n), []).append((cap, value))
    return [([c for c, _ in pts], [v for _, v in pts]) for pts in groups.values()]


def draw(rows: list[dict], requests: dict[float, float], srows: list[tuple[int, dict]], systems: list[str]) -> Figure:
    """The figure: hit ratios (top) and gap closed (bottom) per capacity, a line per
    system or policy and request count."""
    caps = [r["capacity_blocks"] for r in rows]
    fig, (ax_hit, ax_gap) = style.figure(4.5, nrows=2, sharex=True, gridspec_kw={"height_ratios": [1.2, 1]})
    for ref in ("reference_lru", "reference_belady"):
        for xs, ys in _by_requests((requests[c], c, 100 * r[ref]["block_hit_ratio"]) for c, r in zip(caps, rows)):
            ax_hit.plot(xs, ys, **REFS[ref])
            style.whiskers(ax_hit, xs, ys, REFS[ref]["color"])
    for system in systems:
        mine = [r for _, r in srows if r["system"] == system]
        _, color, marker = style.series(system)
        whole = [r for r in mine if _whole(r) and r["requests"] == requests.get(r["capacity_blocks"])]
        for xs, ys in _by_requests((r["requests"], r["capacity_blocks"], 100 * r["block_hit_ratio"]) for r in whole):
            ax_hit.plot(xs, ys, color=color, marker=marker, **_style(system))
            style.whiskers(ax_hit, xs, ys, color)
        done = [r for r in mine if r.get("gap_closed") is not None]
        for xs, ys in _by_requests((r["requests"], r["capacity_blocks"], 100 * r["gap_closed"]) for r in done):
            ax_gap.plot(xs, ys, color=color, lw=0.9, **{k: v for k, v in _style(system).items() if k != "ms"})
            style.whiskers(ax_gap, xs, ys, color)
        for r in done:  # hollow: the time limit stopped the replay early
            ax_gap.plot([r["capacity_blocks"]], [100 * r["gap_closed"]], ls="None", marker=marker, color=color,
                        mfc=color if _whole(r) else "white", ms=_style(system)["ms"], zorder=_style(system)["zorder"])
    line_only = ("marker", "ms", "zorder")
    ax_gap.axhline(0, **{k: v for k, v in REFS["reference_lru"].items() if k not in line_only})
    ax_gap.axhline(100, **{k: v for k, v in REFS["reference_belady"].items() if k not in line_only})
    ax_hit.set_ylabel("block hit ratio (%)")
    ax_hit.set_ylim(bottom=0)
    ax_gap.set_ylabel("gap closed (%)")
    ax_gap.set_xscale("log")
    ax_gap.set_xticks(caps)
    ax_gap.set_xticklabels([f"{c:,.0f}\n({requests[c]:,.0f})" for c in caps])
    ax_gap.minorticks_off()
    ax_gap.set_xlabel("cache capacity, blocks (requests replayed)")
    handles = [Line2D([], [], label="LRU (reference)", **REFS["reference_lru"]),
               Line2D([], [], label="Belady (optimal)", **REFS["reference_belady"])]
    for system in systems:
        _, color, marker = style.series(system)
        handles.append(Line2D([], [], color=color, marker=marker, label=_label(system), **_style(system)))
    bottom = style.legend_below(fig, handles, axis_room_in=0.52)  # two-line tick labels
    fig.subplots_adjust(left=0.17, right=0.97, top=0.98, bottom=bottom, hspace=0.1)
    return fig


# Systems often hit exactly alike (same policy, same requests): markers shrink and rise in
# drawing order, so coincident points show as nested rings and every system stays visible.
_DRAW = ("cascade_lru", "cascade_file", "cascade", "lmcache_cpu", "lmcache_cpu_disk", "lmcache_disk", "redis", "mooncake")


def _style(system: str) -> dict:
    k = _DRAW.index(system) if system in _DRAW else len(_DRAW)
    out = dict(ms=max(7.5 - 0.9 * k, 3.0), zorder=2.0 + 0.01 * k)
    if system == "cascade_lru":
        out["ls"] = "--"
    return out


def _macros(m: MacroBook, rf: ResultsFile, rows: list[dict], srows: list[tuple[int, dict]]) -> None:
    """The quoted row's numbers (the capacity with the widest LRU-to-Belady gap), each on
    that row's own requests."""
    all_rows = rf.seq("rows")
    quoted = max(rows, key=lambda r: (r["reference_belady"]["block_hit_ratio"] - r["reference_lru"]["block_hit_ratio"],
                                      -r["capacity_blocks"]))
    i = all_rows.index(quoted)
    requests, where = _row_requests(rf, i)
    m.add("TrRequests", integer(requests), where + " (at TrCapacity)")
    m.add("TrTraceRequests", integer(rf.num("requests")), rf.source("requests") + " (the whole trace)")
    source = str(rf.get("source"))
    m.add("TrTraceKind", f"the request trace \\texttt{{{escape(trace_name(rf))}}}" if os.sep in source
          else f"a synthetic workload from Cascade's generator (\\texttt{{{escape(trace_name(rf))}}})",
          rf.source("source") + " (a file: a recorded trace; otherwise the built-in generator)")
    m.add("TrReferences", integer(rf.num("rows", i, "reference_lru", "references")),
          rf.source("rows", i, "reference_lru", "references"))
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
    names = sorted({str(r["system"]) for _, r in srows if not str(r["system"]).startswith("cascade")}, key=_order)
    m.add("TrPeersReplayed", escape(", ".join(style.label(s) for s in names)) or "none",
          f"{rf.name}: system_rows[*].system (peers)")
    _peer_macros(m, rf, srows, requests)


def _prefix(peer_requests: float, requests: float) -> str:
    """How the peers' replay relates to the quoted one of ``requests`` requests."""
    if peer_requests < requests:
        return "a shorter prefix"
    return "the same requests" if peer_requests == requests else "a longer prefix"


def _peer_macros(m: MacroBook, rf: ResultsFile, srows: list[tuple[int, dict]], requests: float) -> None:
    """Quote the peers where they ran (Cascade's quoted row may replay more of the trace
    than they did), at the capacity of their replay with the widest LRU-to-Belady gap,
    beside Cascade's semantic policy on exactly those requests."""
    peer = lambda r: not str(r["system"]).startswith("cascade")  # noqa: E731
    done = [(k, r) for k, r in srows if peer(r) and r.get("gap_closed") is not None and not r.get("truncated")]
    caps = sorted({r["capacity_blocks"] for _, r in done})
    cascade = {r["capacity_blocks"]: (k, r) for k, r in srows if r["system"] == "cascade" and r.get("scope") == "compare"}
    caps = [c for c in caps if c in cascade]
    if not caps:
        reason = f"{rf.name}: no peer finished a replay that Cascade also ran"
        for macro in ("TrBestPeer", "TrBestPeerGapPct", "TrPeerRequests", "TrPeerCapacity", "TrCascadePeerGapPct",
                      "TrPeerPrefix"):
            m.add(macro, "--", reason)
        return
    cap = max(caps, key=lambda c: (cascade[c][1]["belady_block_hit_ratio"] - cascade[c][1]["lru_block_hit_ratio"], -c))
    k_c, mine = cascade[cap]
    gap, k, best = max(((r["gap_closed"], k, r) for k, r in done if r["capacity_blocks"] == cap),
                       key=lambda p: (p[0], -p[1]))
    m.add("TrPeerCapacity", integer(cap), rf.source("system_rows", k, "capacity_blocks")
          + " (of the peers' finished replays, the capacity with the widest LRU-to-Belady gap)")
    m.add("TrPeerRequests", integer(best["requests"]), rf.source("system_rows", k, "requests"))
    m.add("TrPeerPrefix", _prefix(best["requests"], requests),
          rf.source("system_rows", k, "requests") + " against TrRequests")
    m.add("TrBestPeer", escape(style.label(str(best["system"]))),
          rf.source("system_rows", k, "system") + " (largest gap_closed among peers at TrPeerCapacity)")
    m.add("TrBestPeerGapPct", pct(gap, 0), rf.source("system_rows", k, "gap_closed"))
    m.add("TrCascadePeerGapPct", pct(rf.num("system_rows", k_c, "gap_closed"), 0),
          rf.source("system_rows", k_c, "gap_closed") + " (cascade, scope compare: the same requests)")


def _tables(ctx: Context, rf: ResultsFile, rows: list[dict], requests: dict[float, float],
            srows: list[tuple[int, dict]], systems: list[str]) -> None:
    """``requests``: per capacity, the requests its row was computed on."""
    t = ctx.table("trace_replay", [("capacity", "r"), ("requests", "r"), ("LRU", "r"), ("Belady", "r"),
                                   ("Cascade LRU", "r"), ("semantic", "r"), ("gap closed", "r"), ("tokens", "r")], [rf])
    for r in rows:
        t.add(integer(r["capacity_blocks"]), integer(requests[r["capacity_blocks"]]),
              *(pct(r[p]["block_hit_ratio"]) for p in POLICIES),
              pct(r["cascade_semantic"]["gap_closed"], 0), pct(r["cascade_semantic"]["token_hit_ratio"]))
    ctx.put(t)

    s = ctx.table("trace_replay_systems", [("system", "l"), ("capacity", "r"), ("requests", "r"), ("hit", "r"),
                                           ("LRU", "r"), ("Belady", "r"), ("gap", "r")], [rf])
    for n, system in enumerate(systems):
        if n:
            s.rule()
        for _, r in sorted(((k, r) for k, r in srows if r["system"] == system), key=lambda kr: kr[1]["capacity_blocks"]):
            gap = r.get("gap_closed")
            s.add(escape(style.label(system)), integer(r["capacity_blocks"]),
                  integer(r["requests"]) + (r"$^\ast$" if r.get("truncated") else ""), pct(r["block_hit_ratio"]),
                  pct(r["lru_block_hit_ratio"]), pct(r["belady_block_hit_ratio"]),
                  pct(gap, 0) if gap is not None else "--")
    ctx.put(s)


SPEC = FigureSpec("hit_ratio", CAPTION, "trace_replay results", build, macros=MACROS,
                  tables={"trace_replay": TABLE_CAPTION, "trace_replay_systems": SYSTEMS_CAPTION})
