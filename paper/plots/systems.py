"""Figure: the compared systems side by side -- put and get throughput, get latency.

Sources: the newest ``write_throughput``, ``read_throughput`` and ``read_latency``
results files (schemas ``cascade-bench/<workload>/1`` in ``benchmark/README.md``): flat
``rows`` per (system, block size, mode), the machine's ``limits`` per block size, and
``not_run`` for systems that could not start. Systems are only compared within one file
(one run); the figure shows the block size the text quotes, the table every size.
"""
from __future__ import annotations

import math

import numpy as np
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from .. import style
from ..core import Context, FigureSpec, absent
from ..macros import MacroBook, and_list, pct, per_size, quoted_sizes, sig, size
from ..results import ResultsError, ResultsFile
from ..spread import pairwise
from ..tables import escape
from .common import default_block_bytes, reference_row

WORKLOADS = ("write_throughput", "read_throughput", "read_latency")
ORDER = ("cascade", "cascade_file", "lmcache_cpu", "lmcache_disk", "lmcache_disk_odirect", "lmcache_cpu_disk", "redis",
         "redis_unix", "hdf5", "hdf5_nocache", "mooncake",
         "pdc")
HATCH = "////"

CAPTION = (r"The compared systems on the same blocks from one shared data directory, each with the same "
           r"capacity (\SysRefBlock blocks). Top: put throughput including the final flush; middle: "
           r"\texttt{get\_into} throughput; bottom: per-get latency, median (bar) and p99 (circle). "
           r"Bars are medians over the \SuiteReps repetitions of the suite run, whiskers their minimum and "
           r"maximum. "
           r"Solid: hot (just written or cached); hatched: cold, after the system's files were dropped "
           r"from the page cache (file-backed systems only). Lines: this machine's limits measured in the "
           r"same runs --- memcpy of a block (over buffers larger than the last-level cache) and a raw file "
           r"written, then read cold with \texttt{O\_DIRECT} (the file tier's request size and depth; dotted) "
           r"and through the page cache (dash-dotted), on the file system the systems write to. A peer's "
           r"variants (its documented settings the harness tries) are bars of their own. Cascade's put "
           r"\SysCascadePutHashing. Logarithmic axes.")

TABLE_CAPTION = (r"The compared systems per block size: put and get throughput (GB/s, medians of rounds) and "
                 r"per-get latency (ms), hot and cold, with the machine's limits of the same runs; "
                 r"``vs Cascade'' is Cascade's hot get throughput over the system's (above one: Cascade "
                 r"is faster). Each variant of a peer is a row of its own; the text compares Cascade with the "
                 r"best variant of each peer in each repetition.")

MACROS = ("SysRefBlock", "SysQuotedBlocks", "SysCascadePutGBps", "SysCascadeGetGBps", "SysCascadeGetPctMemcpy",
          "SysCascadePFiftyMs", "SysCascadePNinetyNineMs", "SysPutVsLmcacheCpu", "SysGetVsLmcacheCpu", "SysGetVsRedis",
          "SysRedisBest", "SysGetVsMooncake", "SysGetVsHdf", "SysHdfBestHot", "SysLatVsLmcacheCpu", "SysFileColdGetGBps",
          "SysFileReadMode", "SysFilePctRawRead", "SysFileRawKind", "SysFileColdVsLmcacheDisk", "SysLmcacheDiskBestCold",
          "SysFileColdVsHdf", "SysHdfBestCold", "SysBestPeerGet", "SysNotRun", "SysCascadePutHashing")
GBPS, MS, PCT, TIMES = r"\,GB/s", r"\,ms", r"\,\%", r"$\times$"
#: What each read mode means for a cold row (``read_mode``) and the raw read it is compared with.
READ_MODES = {
    "buffered": (r"through the page cache (its \texttt{auto} mode uses \texttt{O\_DIRECT} only on Lustre)",
                 "raw buffered cold read"),
    "direct": (r"with \texttt{O\_DIRECT}", r"raw \texttt{O\_DIRECT} read with the tier's request size and depth"),
    None: ("in a mode this run did not record", r"better of the raw \texttt{O\_DIRECT} and buffered cold reads"),
}


class Run:
    """One workload's results file: rows by (system, block size, mode) and limits."""

    FIELDS = {"write_throughput": ("put_gbps",), "read_throughput": ("get_gbps",),
              "read_latency": ("p50_s",)}

    def __init__(self, rf: ResultsFile) -> None:
        self.rf = rf
        self.rows: dict[tuple[str, int, str], tuple[int, dict]] = {}
        for i, row in enumerate(rf.seq("rows")):
            p = ("rows", i)
            system = str(rf.get("system", within=row, prefix=p))
            nbytes = int(rf.num("block_bytes", within=row, prefix=p))
            mode = str(rf.get("mode", within=row, prefix=p))
            for key in self.FIELDS[rf.workload]:
                rf.num(key, within=row, prefix=p)
            if rf.workload == "read_latency":
                rf.num("latency_s", "p50", within=row, prefix=p)
                rf.num("latency_s", "p99", within=row, prefix=p)
            rf.mapping("vs_systems", within=row, prefix=p)
            self.rows[(system, nbytes, mode)] = (i, row)
        self.not_run = [p for p in rf.seq("not_run", nonempty=False) if isinstance(p, dict)]

    def sizes(self) -> list[int]:
        return sorted({k[1] for k in self.rows})

    def row(self, system: str, nbytes: int, mode: str) -> tuple[int, dict] | None:
        return self.rows.get((system, nbytes, mode))

    def limit(self, nbytes: int, key: str) -> float:
        return self.rf.num("limits", str(nbytes), key)

    def systems(self) -> list[str]:
        return sorted({k[0] for k in self.rows}, key=_order)


def _order(system: str) -> tuple[int, str]:
    return (ORDER.index(system) if system in ORDER else len(ORDER), system)


def load(ctx: Context) -> dict[str, Run]:
    files = {w: ctx.results.newest(w) for w in WORKLOADS}
    missing = [w for w, f in files.items() if f is None]
    if missing:
        raise absent(*missing)
    return {w: Run(f) for w, f in files.items() if f is not None}


def build(ctx: Context) -> list[ResultsFile]:
    runs = load(ctx)
    sources = [r.rf for r in runs.values()]
    put, get, lat = runs["write_throughput"], runs["read_throughput"], runs["read_latency"]
    common_sizes = sorted(set(put.sizes()) & set(get.sizes()) & set(lat.sizes()))
    if not common_sizes:
        raise ResultsError(put.rf.path, "rows[*].block_bytes",
                           "shares no block size with the read_throughput and read_latency files")
    ref = reference_row([{"block_bytes": s} for s in common_sizes], default_block_bytes())["block_bytes"]
    systems = sorted(set(put.systems()) | set(get.systems()) | set(lat.systems()), key=_order)

    fig, (ax_put, ax_get, ax_lat) = style.figure(5.0, nrows=3, sharex=True)
    x = np.arange(len(systems))
    for i, system in enumerate(systems):
        _, color, _ = style.series(system)
        got = put.row(system, ref, "put")
        if got:
            ax_put.bar(i, got[1]["put_gbps"], width=0.55, color=color)
            style.whiskers(ax_put, [i], [got[1]["put_gbps"]], cap=0.1)
        for run, ax, value in ((get, ax_get, lambda r: r["get_gbps"]), (lat, ax_lat, lambda r: 1e3 * r["p50_s"])):
            hot, cold = run.row(system, ref, "hot"), run.row(system, ref, "cold")
            slots = [(hot, 0.0)] if not cold else [(hot, -0.2), (cold, 0.2)]
            for (found, dx), is_cold in zip(slots, (False, True)):
                if not found:
                    continue
                width = 0.55 if not cold else 0.38
                ax.bar(i + dx, value(found[1]), width=width, color="white" if is_cold else color,
                       edgecolor=color, hatch=HATCH if is_cold else None, linewidth=0.8)
                if run is lat:
                    p99 = 1e3 * found[1]["latency_s"]["p99"]
                    ax.plot([i + dx], [p99], marker="o", markersize=2.6, markerfacecolor="white",
                            markeredgecolor="black", markeredgewidth=0.6, ls="none", zorder=5)
                    style.whiskers(ax, [i + dx], [1e3 * found[1]["latency_s"]["p50"]], cap=width / 5)
                else:
                    style.whiskers(ax, [i + dx], [value(found[1])], cap=width / 5)
    span = (-0.6, len(systems) - 0.4)
    ax_put.hlines(put.limit(ref, "memcpy_gbps"), *span, colors="black", linestyles="--", lw=0.9)
    ax_put.hlines(put.limit(ref, "raw_write_gbps"), *span, colors=style.LIMIT_COLOR, linestyles=":", lw=1.1)
    ax_get.hlines(get.limit(ref, "memcpy_gbps"), *span, colors="black", linestyles="--", lw=0.9)
    ax_get.hlines(get.limit(ref, "raw_odirect_read_gbps"), *span, colors=style.LIMIT_COLOR, linestyles=":", lw=1.1)
    ax_get.hlines(get.limit(ref, "raw_buffered_cold_read_gbps"), *span, colors=style.LIMIT_COLOR, linestyles="-.",
                  lw=0.9)
    ax_lat.hlines(1e3 * lat.limit(ref, "memcpy_s_p50"), *span, colors="black", linestyles="--", lw=0.9)
    ax_lat.hlines(1e3 * ref / (lat.limit(ref, "raw_odirect_read_gbps") * 1e9), *span, colors=style.LIMIT_COLOR,
                  linestyles=":", lw=1.1)
    ax_lat.hlines(1e3 * ref / (lat.limit(ref, "raw_buffered_cold_read_gbps") * 1e9), *span, colors=style.LIMIT_COLOR,
                  linestyles="-.", lw=0.9)
    for ax, ylabel in ((ax_put, "put (GB/s)"), (ax_get, "get (GB/s)"), (ax_lat, "get latency (ms)")):
        ax.set_yscale("log")
        _decades(ax)
        ax.set_ylabel(ylabel)
        ax.grid(axis="x", visible=False)
        ax.set_xlim(*span)
    ax_lat.set_xticks(x)
    ax_lat.set_xticklabels([style.label(s) for s in systems], rotation=45, ha="right", rotation_mode="anchor")
    handles = [Line2D([], [], color="black", ls="--", lw=0.9, label="memcpy"),
               Line2D([], [], color=style.LIMIT_COLOR, ls=":", lw=1.1, label="raw file (put: write, get: O_DIRECT read)"),
               Line2D([], [], color=style.LIMIT_COLOR, ls="-.", lw=0.9, label="raw buffered cold read"),
               Patch(facecolor="#777777", label="hot"),
               Patch(facecolor="white", edgecolor="#777777", hatch=HATCH, label="cold"),
               Line2D([], [], color="black", lw=0.7, marker="_", label="min-max"),
               Line2D([], [], color="black", marker="o", markersize=2.6, markerfacecolor="white", ls="none",
                      markeredgewidth=0.6, label="p99")]
    ax_put.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.02), ncol=2, borderaxespad=0.1)
    fig.subplots_adjust(left=0.15, right=0.98, top=0.86, bottom=0.21, hspace=0.12)
    not_run = _not_run(runs)
    extra = (f"Not run here: {escape(not_run)}." if not_run else "")
    ctx.save(fig, sources, caption_extra=extra)

    _macros(ctx.macros, runs, ref, quoted_sizes(common_sizes, ref), not_run)
    _table(ctx, runs, systems, common_sizes, sources)
    return sources


def _decades(ax) -> None:
    """Whole decades on a log axis, labelled plainly."""
    lo, hi = ax.get_ylim()
    ax.set_ylim(10 ** math.floor(math.log10(lo)), 10 ** math.ceil(math.log10(hi)))
    ax.yaxis.set_major_locator(LogLocator(base=10))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _not_run(runs: dict[str, Run]) -> str:
    """``'PDC (skipped)'``-style list of systems some workload could not run, with status."""
    seen: dict[str, str] = {}
    for run in runs.values():
        for p in run.not_run:
            system = str(p.get("system", "?"))
            if not any(system == k[0] for k in run.rows):
                seen.setdefault(system, str(p.get("status", "not run")))
    return ", ".join(f"{style.label(s)} ({status})" for s, status in sorted(seen.items(), key=lambda kv: _order(kv[0])))


def _best_variant(run: Run, family: str, nbytes: int, mode: str) -> list[str]:
    """The variant of peer ``family`` that won at (``nbytes``, ``mode``) in each repetition
    (``best_variants`` of the run; a run without it had one variant per peer)."""
    out = []
    for rep in run.rf.reps:
        chosen = rep.doc.get("best_variants", {}).get(family, {}).get(f"{nbytes}/{mode}")
        out.append(str(chosen) if chosen else family)
    return out


def _variant_phrase(run: Run, family: str, sizes: list[int], mode: str) -> tuple[str, str]:
    """(``"Redis (Unix socket)"``, provenance): the best variant of ``family`` at the quoted
    sizes, naming where sizes or repetitions disagree."""
    per = {s: _best_variant(run, family, s, mode) for s in sizes}
    every = {w for ws in per.values() for w in ws}
    source = f"{run.rf.name} and its repetitions: best_variants.{family} (best {mode} variant per size)"
    if len(every) == 1:
        return escape(style.label(every.pop())), source
    parts = []
    for s, ws in per.items():
        counts = sorted(((ws.count(w), w) for w in set(ws)), reverse=True)
        names = and_list([escape(style.label(w)) + (f" in {k} of {len(ws)} repetitions" if len(counts) > 1 else "")
                          for k, w in counts])
        parts.append(f"{names} at {size(s)}")
    return "its best variant: " + "; ".join(parts), source


def _row_value(run: Run, system: str, nbytes: int, mode: str, keys: tuple) -> tuple[object, str] | None:
    found = run.row(system, nbytes, mode)
    if found is None:
        return None
    return run.rf.num("rows", found[0], *keys), run.rf.source("rows", found[0], *keys)


def _each(m: MacroBook, macro: str, run: Run, system: str, sizes: list[int], mode: str, get_value,
          fmt=sig, unit: str = "") -> None:
    """One macro with ``get_value(nbytes) -> (value, source) | None`` at every quoted size
    (``--`` and a reason where a size has no value)."""
    values, sources = [], []
    for s in sizes:
        got = get_value(s)
        if got is None:
            values.append((s, "--"))
            sources.append(f"{run.rf.name}: no {system}/{mode} value at {s} bytes")
        else:
            values.append((s, fmt(got[0])))
            sources.append(got[1])
    m.add(macro, per_size(values, unit if any(v != "--" for _, v in values) else ""), "; ".join(sources))


def _vs_best(run: Run, system: str, mode: str, family: str):
    """``get_value`` for ``system``'s ratio to the best variant of ``family`` (``vs_best``;
    a run without variants compares with the family's one system, ``vs_systems``)."""
    def get(nbytes: int):
        found = run.row(system, nbytes, mode)
        if found is None:
            return None
        i, row = found
        for key in ("vs_best", "vs_systems"):
            if family in row.get(key, {}):
                return run.rf.num("rows", i, key, family), run.rf.source("rows", i, key, family)
        return None
    return get


def _same_mode(run: Run, nbytes: int, mode: str):
    """(read mode or None, ratio to the raw read of that mode, source) of cascade_file's cold row."""
    found = run.row("cascade_file", nbytes, mode)
    if found is None:
        return None
    i, row = found
    read_mode = row.get("read_mode")
    if read_mode in ("buffered", "direct") and "raw_read_same_mode" in row.get("vs_limit", {}):
        return read_mode, run.rf.num("rows", i, "vs_limit", "raw_read_same_mode"), \
            run.rf.source("rows", i, "vs_limit", "raw_read_same_mode")
    # an older run: its mode is unknown, so compare with the better of both raw reads
    best = pairwise(max, run.limit(nbytes, "raw_odirect_read_gbps"), run.limit(nbytes, "raw_buffered_cold_read_gbps"))
    return None, run.rf.num("rows", i, "get_gbps") / best, \
        run.rf.source("rows", i, "get_gbps") + " over the better of limits.raw_odirect_read_gbps and " \
        "limits.raw_buffered_cold_read_gbps (read_mode not recorded)"


def _macros(m: MacroBook, runs: dict[str, Run], ref: int, sizes: list[int], not_run: str) -> None:
    put, get, lat = runs["write_throughput"], runs["read_throughput"], runs["read_latency"]
    i = put.row("cascade", ref, "put")
    m.add("SysRefBlock", size(ref), put.rf.source("rows", i[0] if i else 0, "block_bytes")
          + " (smallest size measured by all three workloads >= the default block)")
    m.add("SysQuotedBlocks", and_list([size(s) for s in sizes]),
          put.rf.source("rows", i[0] if i else 0, "block_bytes") + " (2 and 16 MiB where measured)")
    value = lambda run, system, mode, *keys: (lambda s: _row_value(run, system, s, mode, keys))  # noqa: E731
    _each(m, "SysCascadePutGBps", put, "cascade", sizes, "put", value(put, "cascade", "put", "put_gbps"), unit=GBPS)
    found = put.row("cascade", ref, "put")
    hashing = found[1].get("describe", {}).get("hash_on_put") if found else None
    m.add("SysCascadePutHashing",
          "hashes every block with BLAKE3 and checks it against its content id" if hashing is True else
          "takes precomputed block ids, as an engine passes token-prefix ids, so no system hashes KV data "
          "in its timed put" if hashing is False else "(hashing not recorded by the run)",
          put.rf.source("rows", found[0], "describe", "hash_on_put") if found else f"{put.rf.name}: no cascade row")
    _each(m, "SysCascadeGetGBps", get, "cascade", sizes, "hot", value(get, "cascade", "hot", "get_gbps"), unit=GBPS)
    _each(m, "SysCascadeGetPctMemcpy", get, "cascade", sizes, "hot", value(get, "cascade", "hot", "vs_limit", "memcpy"),
          fmt=lambda v: pct(v, 0), unit=PCT)
    _each(m, "SysCascadePFiftyMs", lat, "cascade", sizes, "hot",
          lambda s: (lambda g: g and (1e3 * g[0], g[1]))(_row_value(lat, "cascade", s, "hot", ("latency_s", "p50"))),
          unit=MS)
    _each(m, "SysCascadePNinetyNineMs", lat, "cascade", sizes, "hot",
          lambda s: (lambda g: g and (1e3 * g[0], g[1]))(_row_value(lat, "cascade", s, "hot", ("latency_s", "p99"))),
          unit=MS)
    _each(m, "SysPutVsLmcacheCpu", put, "cascade", sizes, "put", _vs_best(put, "cascade", "put", "lmcache_cpu"), unit=TIMES)
    _each(m, "SysGetVsLmcacheCpu", get, "cascade", sizes, "hot", _vs_best(get, "cascade", "hot", "lmcache_cpu"), unit=TIMES)
    _each(m, "SysGetVsRedis", get, "cascade", sizes, "hot", _vs_best(get, "cascade", "hot", "redis"), unit=TIMES)
    m.add("SysRedisBest", *_variant_phrase(get, "redis", sizes, "hot"))
    _each(m, "SysGetVsMooncake", get, "cascade", sizes, "hot", _vs_best(get, "cascade", "hot", "mooncake"), unit=TIMES)
    _each(m, "SysGetVsHdf", get, "cascade", sizes, "hot", _vs_best(get, "cascade", "hot", "hdf5"), unit=TIMES)
    m.add("SysHdfBestHot", *_variant_phrase(get, "hdf5", sizes, "hot"))
    _each(m, "SysLatVsLmcacheCpu", lat, "cascade", sizes, "hot", _vs_best(lat, "cascade", "hot", "lmcache_cpu"),
          unit=TIMES)
    _each(m, "SysFileColdGetGBps", get, "cascade_file", sizes, "cold", value(get, "cascade_file", "cold", "get_gbps"),
          unit=GBPS)
    same = {s: _same_mode(get, s, "cold") for s in sizes}
    modes = {v[0] for v in same.values() if v is not None}
    where = "; ".join(f"{get.rf.name}: rows[cascade_file/cold/{s}].read_mode" for s in sizes)
    mode = modes.pop() if len(modes) == 1 else None
    m.add("SysFileReadMode", READ_MODES[mode][0] if not modes else "in modes that differ by size", where)
    m.add("SysFileRawKind", READ_MODES[mode][1] if not modes else "raw read of each size's mode", where)
    _each(m, "SysFilePctRawRead", get, "cascade_file", sizes, "cold",
          lambda s: same[s] and (same[s][1], same[s][2]), fmt=lambda v: pct(v, 0), unit=PCT)
    _each(m, "SysFileColdVsLmcacheDisk", get, "cascade_file", sizes, "cold",
          _vs_best(get, "cascade_file", "cold", "lmcache_disk"), unit=TIMES)
    m.add("SysLmcacheDiskBestCold", *_variant_phrase(get, "lmcache_disk", sizes, "cold"))
    _each(m, "SysFileColdVsHdf", get, "cascade_file", sizes, "cold", _vs_best(get, "cascade_file", "cold", "hdf5"),
          unit=TIMES)
    m.add("SysHdfBestCold", *_variant_phrase(get, "hdf5", sizes, "cold"))
    best, sources = [], []
    for s in sizes:
        peers = [(row["get_gbps"], sy, i) for (sy, nbytes, mode), (i, row) in get.rows.items()
                 if nbytes == s and mode == "hot" and not sy.startswith("cascade")]
        if peers:
            gb, sy, i = max(peers)
            best.append((s, f"{escape(style.label(sy))} ({sig(gb)}{GBPS})"))
            sources.append(get.rf.source("rows", i, "get_gbps") + " (fastest hot get of a peer)")
        else:
            best.append((s, "none"))
            sources.append(f"{get.rf.name}: no peer ran at {s} bytes")
    m.add("SysBestPeerGet", per_size(best), "; ".join(sources))
    m.add("SysNotRun", escape(not_run) or "none", ", ".join(r.rf.name for r in runs.values()) + ": not_run")


def _table(ctx: Context, runs: dict[str, Run], systems: list[str], sizes: list[int],
           sources: list[ResultsFile]) -> None:
    put, get, lat = runs["write_throughput"], runs["read_throughput"], runs["read_latency"]
    cols = [("system", "l"), ("block", "r"), ("put", "r"), ("get hot", "r"), ("get cold", "r"), ("p50 hot", "r"),
            ("p99 hot", "r"), ("p50 cold", "r"), ("p99 cold", "r"), ("vs Cascade", "r")]
    t = ctx.table("systems", cols, sources)
    dash = "--"

    def cell(run: Run, system: str, nbytes: int, mode: str, fn) -> str:
        found = run.row(system, nbytes, mode)
        return sig(fn(found[1])) if found else dash

    for k, nbytes in enumerate(sizes):
        if k:
            t.rule()
        t.add(r"\emph{memcpy}", size(nbytes), sig(put.limit(nbytes, "memcpy_gbps")), sig(get.limit(nbytes, "memcpy_gbps")),
              dash, sig(1e3 * lat.limit(nbytes, "memcpy_s_p50")), dash, dash, dash, dash)
        raw_ms = 1e3 * nbytes / (lat.limit(nbytes, "raw_odirect_read_gbps") * 1e9)
        t.add(r"\emph{raw file}", size(nbytes), sig(put.limit(nbytes, "raw_write_gbps")), dash,
              sig(get.limit(nbytes, "raw_odirect_read_gbps")), dash, dash, sig(raw_ms), dash, dash)
        for system in systems:
            hot = get.row(system, nbytes, "hot")
            vs = dash
            if hot and system != "cascade":
                mine = get.row("cascade", nbytes, "hot")
                if mine and system in mine[1]["vs_systems"]:
                    vs = sig(mine[1]["vs_systems"][system])
            t.add(escape(style.label(system)), size(nbytes),
                  cell(put, system, nbytes, "put", lambda r: r["put_gbps"]),
                  cell(get, system, nbytes, "hot", lambda r: r["get_gbps"]),
                  cell(get, system, nbytes, "cold", lambda r: r["get_gbps"]),
                  cell(lat, system, nbytes, "hot", lambda r: 1e3 * r["latency_s"]["p50"]),
                  cell(lat, system, nbytes, "hot", lambda r: 1e3 * r["latency_s"]["p99"]),
                  cell(lat, system, nbytes, "cold", lambda r: 1e3 * r["latency_s"]["p50"]),
                  cell(lat, system, nbytes, "cold", lambda r: 1e3 * r["latency_s"]["p99"]), vs)
    ctx.put(t)


SPEC = FigureSpec("systems", CAPTION, "write_throughput, read_throughput and read_latency results", build,
                  macros=MACROS, tables={"systems": TABLE_CAPTION}, wide_tables=("systems",))
