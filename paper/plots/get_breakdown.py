"""Figure: where a get's time goes, per serving tier, from the runtime's own statistics.

Source: the suite run's ``run`` workload, the main job ``cascade run --ranks 4``
(``cascade_run_*.json``; of several rank counts, the most ranks: a multi-rank run has
REMOTE-tier and cross-rank gets). Per rank, ``CascadeStore.stats()`` holds one latency
histogram per serving tier (``tiers.<t>.get_latency``: counts per power-of-two
microsecond bucket, ``sum_s``, ``count``) and one for gets another rank served
(``cluster_get_latency``); they are summed over ranks here. The histograms hold the gets
a tier served (hits), not every get: the text calls them served gets and sets them against
all gets (``gets`` per rank). Each repetition's histograms stay apart: quantiles and
cumulative fractions are taken per repetition, then shown as median with min-max.
"""
from __future__ import annotations

import math

import numpy as np
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from .. import style
from ..core import Context, FigureSpec, absent
from ..macros import integer, pct, sig
from ..results import ResultsError, ResultsFile, field_name
from ..spread import Spread

TIER_ORDER = ("gpu", "shm", "remote", "lustre", "cluster")

CAPTION = (r"Where get time goes, by the tier that served the get, from the store's own per-tier "
           r"latency histograms summed over all ranks of a \texttt{cascade run}; they hold the served gets "
           r"(those that found their block). Top: cumulative fraction of served gets against latency "
           r"(histogram buckets are powers of two in microseconds, so each step is a bucket's upper bound). "
           r"Bottom: each tier's share of the served gets and of their total time. ``another rank'' are "
           r"local misses read from a peer's tier through the global directory. Over the \SuiteReps "
           r"repetitions of the suite run: the top panel draws the median cumulative fraction with the minimum "
           r"to maximum shaded, the bottom medians with their minimum and maximum as horizontal bars.")

TABLE_CAPTION = (r"Served gets by serving tier in the \texttt{cascade run} of Fig.~\ref{fig:get_breakdown}: "
                 r"count, mean, median (p50) and p99 latency as histogram-bucket upper bounds, and the tier's "
                 r"share of the served gets' time.")

MACROS = ("RunRanks", "RunNodes", "RunGets", "RunServedGets", "RunHitPct", "GetShmMedianUs", "GetShmMeanUs",
          "GetLustreMedianUs", "GetLustreMeanUs", "GetLustreGetsPct", "GetLustreTimePct", "GetRemoteMedianUs",
          "GetClusterMedianUs", "GetClusterGetsPct", "RunFileTierFs")


def _per_rank(rf: ResultsFile) -> tuple[list[dict], str]:
    """Every rank's stats and the field they sit at."""
    if "per_rank_stats" in rf.doc:
        return rf.seq("per_rank_stats"), "per_rank_stats"
    if "store_stats" in rf.doc:
        return [rf.mapping("store_stats")], "store_stats"
    raise ResultsError(rf.path, "per_rank_stats", "is missing (and so is store_stats, its single-rank form)")


def all_gets(rf: ResultsFile) -> float:
    """Every get of the run, served or not: ``gets`` summed over ranks (a Spread per repetition)."""
    stats, where = _per_rank(rf)
    prefixes = [(where, r) for r in range(len(stats))] if where == "per_rank_stats" else [(where,)]
    return sum(rf.num("gets", within=s, prefix=p) for s, p in zip(stats, prefixes))


def _rep_counts(buckets: list, reps: int) -> np.ndarray:
    """(repetitions x buckets) counts: a merged bucket holds a Spread where repetitions differ."""
    return np.array([b.reps if isinstance(b, Spread) else (b,) * reps for b in buckets], dtype=np.int64).T


def histograms(rf: ResultsFile) -> dict[str, dict]:
    """Per serving tier, summed over ranks: ``buckets`` (numpy, one row per repetition),
    ``sum_s`` and ``count`` (Spreads where repetitions differ)."""
    stats, where = _per_rank(rf)
    reps = len(rf.reps)
    out: dict[str, dict] = {}
    for r, rank_stats in enumerate(stats):
        prefix = (where, r) if where == "per_rank_stats" else (where,)
        tiers = rf.mapping("tiers", within=rank_stats, prefix=prefix)
        parts = [(name, ("tiers", name, "get_latency")) for name in tiers]
        parts.append(("cluster", ("cluster_get_latency",)))
        for name, keys in parts:
            hist = rf.mapping(*keys, within=rank_stats, prefix=prefix)
            buckets = rf.seq("buckets", within=hist, prefix=(*prefix, *keys))
            if not all((isinstance(b, int) or isinstance(b, Spread)) and b >= 0 for b in buckets):
                raise ResultsError(rf.path, field_name((*prefix, *keys, "buckets")), "holds non-counts")
            total = rf.num("sum_s", within=hist, prefix=(*prefix, *keys))
            count = rf.num("count", within=hist, prefix=(*prefix, *keys))
            agg = out.setdefault(name, {"buckets": np.zeros((reps, len(buckets)), dtype=np.int64), "sum_s": 0.0,
                                        "count": 0})
            if agg["buckets"].shape[1] != len(buckets):
                raise ResultsError(rf.path, field_name((*prefix, *keys, "buckets")),
                                   f"has {len(buckets)} buckets, other ranks {agg['buckets'].shape[1]}")
            agg["buckets"] += _rep_counts(buckets, reps)
            agg["sum_s"] += total
            agg["count"] = agg["count"] + count  # a Spread stays one (per-repetition sums)
    return {name: out[name] for name in (*TIER_ORDER, *sorted(set(out) - set(TIER_ORDER)))
            if name in out and out[name]["buckets"].any()}


def _over_reps(values: list[float]) -> float:
    return Spread(values) if len(values) > 1 else values[0]


def mean_us(h: dict) -> float:
    """Mean get latency (us) of a tier, per repetition in which it served gets."""
    reps = len(h["buckets"])
    sums = h["sum_s"].reps if isinstance(h["sum_s"], Spread) else (h["sum_s"],) * reps
    counts = h["count"].reps if isinstance(h["count"], Spread) else (h["count"],) * reps
    return _over_reps([1e6 * s / c for s, c in zip(sums, counts) if c > 0])


def quantile_bound_us(buckets: np.ndarray, q: float) -> float:
    """Upper bound (us) of the bucket holding quantile ``q`` (as ``LatencyHistogram.quantile``);
    for (repetitions x buckets) counts, per repetition in which the tier served gets."""
    if buckets.ndim == 2:
        return _over_reps([quantile_bound_us(b, q) for b in buckets if b.sum()])
    n = int(buckets.sum())
    seen = 0
    for i, c in enumerate(buckets):
        seen += int(c)
        if c and seen >= q * n:
            return float(2 ** i)
    return float(2 ** (len(buckets) - 1))


def _us_label(v: float, _pos: int) -> str:
    if v >= 1e6:
        return f"{v / 1e6:g} s"
    if v >= 1e3:
        return f"{v / 1e3:g} ms"
    return f"{v:g} µs"


def pick_run(ctx: Context) -> ResultsFile | None:
    runs = ctx.results.of("run")
    if not runs:
        return None
    return max(runs, key=lambda f: (f.ranks, f.stamp))


def build(ctx: Context) -> list[ResultsFile]:
    rf = pick_run(ctx)
    if rf is None:
        raise absent("run")
    hists = histograms(rf)
    if not hists:
        raise ResultsError(rf.path, "tiers.*.get_latency.count", "is zero for every tier: the run served no gets")
    total_s = sum(h["sum_s"] for h in hists.values())
    total_n = sum(h["count"] for h in hists.values())

    fig, (ax_cdf, ax_bar) = style.figure(3.5, nrows=2, gridspec_kw={"height_ratios": [1.3, 1]})
    nonempty = [np.nonzero(h["buckets"].sum(axis=0))[0] for h in hists.values()]
    low = min(int(idx.min()) for idx in nonempty)
    top = max(int(idx.max()) for idx in nonempty)
    for name, h in hists.items():
        lbl, color, _ = style.series(name)
        bounds = 2.0 ** np.arange(h["buckets"].shape[1])
        # per repetition (a repetition whose tier served no gets has no curve)
        counts = h["buckets"][h["buckets"].sum(axis=1) > 0]
        cdf = np.cumsum(counts, axis=1) / counts.sum(axis=1, keepdims=True)
        # from the lower bound of the lowest bucket (0 %) to the top bucket's upper bound
        xs = np.concatenate([[2.0 ** (low - 1)], bounds[low: top + 1], [2.0 ** (top + 1)]])
        ys = np.concatenate([np.zeros((len(cdf), 1)), cdf[:, low: top + 1], np.ones((len(cdf), 1))], axis=1)
        ax_cdf.step(xs, 100 * np.median(ys, axis=0), where="post", color=color, label=lbl)
        if len(ys) > 1:  # min-max over repetitions
            ax_cdf.fill_between(xs, 100 * ys.min(axis=0), 100 * ys.max(axis=0), step="post", color=color,
                                alpha=0.2, lw=0)
    ax_cdf.set_xscale("log", base=10)
    ax_cdf.set_xlim(10.0 ** math.floor(math.log10(2.0 ** (low - 1))), 10.0 ** math.ceil(math.log10(2.0 ** (top + 1))))
    ax_cdf.xaxis.set_major_locator(LogLocator(base=10))
    ax_cdf.xaxis.set_major_formatter(FuncFormatter(_us_label))
    ax_cdf.xaxis.set_minor_formatter(NullFormatter())
    ax_cdf.set_xlabel("get latency")
    ax_cdf.set_ylabel("gets (cumulative %)")
    ax_cdf.set_ylim(0, 102)
    ax_cdf.legend(loc="lower center", bbox_to_anchor=(0.5, 1.01), ncol=2, borderaxespad=0.1)

    names = list(hists)
    y = np.arange(len(names))
    gets_pct = [100 * hists[n]["count"] / total_n for n in names]
    time_pct = [100 * hists[n]["sum_s"] / total_s for n in names]
    colors = [style.series(n)[1] for n in names]
    ax_bar.barh(y - 0.2, gets_pct, height=0.38, color=colors, alpha=0.35)
    ax_bar.barh(y + 0.2, time_pct, height=0.38, color=colors)
    for yy, values in ((y - 0.2, gets_pct), (y + 0.2, time_pct)):  # min-max over repetitions
        for k, v in zip(yy, values):
            if isinstance(v, Spread) and v.varies:
                ax_bar.plot([v.lo, v.hi], [k, k], color="black", lw=0.7, marker="|", markersize=3.5,
                            markeredgewidth=0.7, zorder=4)
    ax_bar.set_yticks(y)
    ax_bar.set_yticklabels([style.label(n) for n in names])
    ax_bar.invert_yaxis()
    ax_bar.set_xlim(0, 100)
    ax_bar.set_xlabel("share (%)")
    ax_bar.grid(axis="y", visible=False)
    ax_bar.legend(handles=[Patch(facecolor="#555555", alpha=0.35, label="share of served gets (upper, light)"),
                           Patch(facecolor="#555555", label="share of their time (lower, dark)")],
                  loc="lower left", bbox_to_anchor=(0.0, 1.01), ncol=1, borderaxespad=0.1)
    fig.subplots_adjust(left=0.27, right=0.93, top=0.91, bottom=0.1, hspace=0.8)
    ctx.save(fig, [rf])

    m = ctx.macros
    where = "per_rank_stats[*]" if "per_rank_stats" in rf.doc else "store_stats"
    m.add("RunRanks", integer(rf.ranks), rf.source("ranks") if "ranks" in rf.doc else f"{rf.name}: (single-rank run)")
    m.add("RunNodes", integer(rf.nodes), rf.source("nodes") if "nodes" in rf.doc else f"{rf.name}: file name")
    gets = all_gets(rf)
    served = rf.source(where, "tiers.*.get_latency.count") + " + cluster_get_latency.count, summed"
    m.add("RunGets", integer(gets), rf.source(where, "gets") + ", summed (every get, served or not)")
    m.add("RunServedGets", integer(total_n), served + " (the gets a tier served)")
    m.add("RunHitPct", pct(total_n / gets), f"{served} / {rf.source(where, 'gets')}, summed, per repetition")

    stats, where_key = _per_rank(rf)
    prefix = (where_key, 0) if where_key == "per_rank_stats" else (where_key,)
    if "lustre" in rf.mapping("tiers", within=stats[0], prefix=prefix):
        on_lustre = rf.get("tiers", "lustre", "on_lustre", within=stats[0], prefix=prefix)
        m.add("RunFileTierFs", "a Lustre file system" if on_lustre is True else "a local file system (not Lustre)",
              f"{rf.name}: {field_name((*prefix, 'tiers', 'lustre', 'on_lustre'))}")
    else:
        m.add("RunFileTierFs", "no file system (the run had no LUSTRE tier)", f"{rf.name}: no tiers.lustre")

    def tier_macro(macro: str, tier: str, what: str) -> None:
        h = hists.get(tier)
        if h is None:
            m.add(macro, "--", f"{rf.name}: {where}: no gets served by the {tier} tier in this run")
            return
        value = {"median": sig(quantile_bound_us(h["buckets"], 0.5)),
                 "mean": sig(mean_us(h)),
                 "share of served gets": pct(h["count"] / total_n, 0),
                 "share of served get time": pct(h["sum_s"] / total_s, 0)}[what]
        field = "cluster_get_latency" if tier == "cluster" else f"tiers.{tier}.get_latency"
        m.add(macro, value, f"{rf.source(where, field)} ({what}, summed over ranks)")

    tier_macro("GetShmMedianUs", "shm", "median")
    tier_macro("GetShmMeanUs", "shm", "mean")
    tier_macro("GetLustreMedianUs", "lustre", "median")
    tier_macro("GetLustreMeanUs", "lustre", "mean")
    tier_macro("GetLustreGetsPct", "lustre", "share of served gets")
    tier_macro("GetLustreTimePct", "lustre", "share of served get time")
    tier_macro("GetRemoteMedianUs", "remote", "median")
    tier_macro("GetClusterMedianUs", "cluster", "median")
    tier_macro("GetClusterGetsPct", "cluster", "share of served gets")

    t = ctx.table("get_latency", [("served by", "l"), ("served gets", "r"), (r"mean ($\mu$s)", "r"),
                                  (r"p50 ($\mu$s)", "r"), (r"p99 ($\mu$s)", "r"), ("time (\\%)", "r")], [rf])
    for name, h in hists.items():
        t.add(style.label(name), integer(h["count"]), sig(mean_us(h)),
              integer(quantile_bound_us(h["buckets"], 0.5)), integer(quantile_bound_us(h["buckets"], 0.99)),
              pct(h["sum_s"] / total_s, 0))
    ctx.put(t)
    return [rf]


SPEC = FigureSpec("get_breakdown", CAPTION, "the suite's run workload (cascade_run_*.json)", build, macros=MACROS,
                  tables={"get_latency": TABLE_CAPTION})
