"""Tables: engines attached to ``cascade serve`` ranks -- the cost of attaching per block,
and the hit ratio of one shared cache against private per-worker stores.

Source: the suite's ``cluster_serving`` results (:mod:`benchmark.workloads.cluster_serving`):
``attach[i]`` per block size (``block_bytes``) with ``in_process`` and ``attached`` per-op
latency summaries (``put.p50``, ``get.p50``, seconds), ``attached_over_in_process_p50`` and
``attach_cost_us_p50`` per op, batch GB/s and the channel round trip (``attached.lookup_rtt``);
``serving`` with ``ranks``, ``requests``, ``block_bytes``, ``shared`` (``global``,
``per_client``, ``bytes_from_other_ranks``) and ``private`` (``global``, ``per_client``).
Any other object of ``serving`` with a ``global`` hit ratio (e.g. LMCache's own CPU+disk
backends, per worker) is a further row of the hit-ratio table, named by its key (its
``label`` when it has one).
"""
from __future__ import annotations

from typing import Any

from ..core import Context, FigureSpec, absent
from ..macros import and_list, integer, pct, per_size, sig, size
from ..results import ResultsFile
from ..tables import escape

ATTACH_CAPTION = (
    r"The cost of attaching: per-block latency ($\mu$s, median of the blocks) of a client process talking to a "
    r"\texttt{cascade serve} rank through shared memory and a Unix socket (attached), beside the same store "
    r"opened in the calling process (in-process), the two taking turns block by block; ``cost'': attached "
    r"minus in-process, ``$\times$'': their ratio, both taken within each repetition (median and range over the "
    r"\SuiteReps repetitions); batch GB/s of \texttt{get\_many\_into} and \texttt{put\_many}; ``round trip'': "
    r"a one-id lookup over the channel alone.")
HITS_CAPTION = (
    r"Block hit ratio (\%) of serving clients, one per rank, each replaying its share of one shared-prefix "
    r"request stream: through their ranks of one \texttt{cascade serve} job sharing one cache (shared), and "
    r"through private per-worker stores of the same capacity (private); per client and over all "
    r"references; per-block get and put latency of the engines (median of their p50s, $\mu$s) and chunks read "
    r"back wrong, where the run records them; bytes: block bytes the ranks served from other ranks' memory.")

MACROS = ("CsRanks", "CsRequests", "CsServeBlock", "CsSharedPct", "CsPrivatePct", "CsSharedGainPts",
          "CsBytesOther", "CsOthers", "CsAttachSizes", "CsAttachGetUs", "CsAttachPutUs", "CsAttachGetRatio",
          "CsAttachPutRatio", "CsRttUs", "CsThroughEngine")

OPS = ("put", "get")
KNOWN = ("shared", "private")
#: How the text names a further way of serving, by its key in ``serving``.
LABELS = {"lmcache_cpu_disk": "LMCache CPU+disk (per worker)"}


def _check(rf: ResultsFile) -> list[tuple[int, dict[str, Any]]]:
    attach = rf.seq("attach")
    for i, a in enumerate(attach):
        p = ("attach", i)
        rf.num("block_bytes", within=a, prefix=p)
        for op in OPS:
            for side in ("in_process", "attached"):
                rf.num(side, op, "p50", within=a, prefix=p)
                rf.num(side, f"batch_{op}_gbps", within=a, prefix=p)
            rf.num("attached_over_in_process_p50", op, within=a, prefix=p)
            rf.num("attach_cost_us_p50", op, within=a, prefix=p)
        rf.num("attached", "lookup_rtt", "p50", within=a, prefix=p)
    for k in ("ranks", "requests", "block_bytes"):
        rf.num("serving", k)
    for scope in KNOWN:
        rf.num("serving", scope, "global")
        rf.seq("serving", scope, "per_client")
    rf.num("serving", "shared", "bytes_from_other_ranks")
    return sorted(enumerate(attach), key=lambda ia: ia[1]["block_bytes"])


def _others(rf: ResultsFile) -> list[tuple[str, str, dict[str, Any]]]:
    """(key, label, object) of every further hit-ratio variant of ``serving``."""
    out = []
    for key, value in rf.mapping("serving").items():
        if key in KNOWN or not isinstance(value, dict) or "global" not in value:
            continue
        rf.num("serving", key, "global")
        label = value.get("label") if isinstance(value.get("label"), str) else LABELS.get(key, key.replace("_", " "))
        out.append((key, label, value))
    return out


def build(ctx: Context) -> list[ResultsFile]:
    rf = ctx.results.newest("cluster_serving")
    if rf is None:
        raise absent("cluster_serving")
    attach = _check(rf)
    others = _others(rf)
    s = rf.mapping("serving")
    m = ctx.macros
    m.add("CsRanks", integer(s["ranks"]), rf.source("serving", "ranks"))
    m.add("CsRequests", integer(s["requests"]), rf.source("serving", "requests"))
    m.add("CsServeBlock", size(s["block_bytes"]), rf.source("serving", "block_bytes"))
    shared, private = s["shared"]["global"], s["private"]["global"]
    m.add("CsSharedPct", pct(shared), rf.source("serving", "shared", "global"))
    m.add("CsPrivatePct", pct(private), rf.source("serving", "private", "global"))
    m.add("CsSharedGainPts", sig(100 * (shared - private), 2),
          rf.source("serving", "shared", "global") + " minus " + rf.source("serving", "private", "global")
          + " (percentage points, per repetition)")
    m.add("CsBytesOther", sig(s["shared"]["bytes_from_other_ranks"] / (1 << 20)) + r"\,MiB",
          rf.source("serving", "shared", "bytes_from_other_ranks"))
    if others:
        m.add("CsOthers", and_list([f"{pct(v['global'])}\\,\\% with {escape(label)}" for _, label, v in others]),
              "; ".join(rf.source("serving", k, "global") for k, _, _ in others))
    else:
        m.add("CsOthers", "none in this suite run",
              rf.source("serving") + " (no object with a global hit ratio besides shared and private)")
    through = s.get("attached_over_private_p50")
    if isinstance(through, dict) and all(isinstance(through.get(op), (int, float)) for op in ("get", "put")):
        m.add("CsThroughEngine", f"{sig(through['get'], 2)}$\\times$ for gets and {sig(through['put'], 2)}$\\times$ "
              "for puts", rf.source("serving", "attached_over_private_p50"))
    else:
        m.add("CsThroughEngine", "not measured in this suite run",
              rf.source("serving") + " (no attached_over_private_p50)")
    m.add("CsAttachSizes", and_list([size(a["block_bytes"]) for _, a in attach]),
          rf.source("attach", "*", "block_bytes"))

    def each(name: str, keys: tuple[str, ...], fmt, unit: str) -> None:
        m.add(name, per_size([(a["block_bytes"], fmt(rf.num(*keys, within=a, prefix=("attach", i))))
                              for i, a in attach], unit),
              "; ".join(rf.source("attach", i, *keys) for i, _ in attach))

    each("CsAttachGetUs", ("attach_cost_us_p50", "get"), sig, r"\,$\mu$s")
    each("CsAttachPutUs", ("attach_cost_us_p50", "put"), sig, r"\,$\mu$s")
    each("CsAttachGetRatio", ("attached_over_in_process_p50", "get"), lambda v: sig(v, 2), r"$\times$")
    each("CsAttachPutRatio", ("attached_over_in_process_p50", "put"), lambda v: sig(v, 2), r"$\times$")
    each("CsRttUs", ("attached", "lookup_rtt", "p50"), lambda v: sig(1e6 * v), r"\,$\mu$s")

    t = ctx.table("cluster_attach", [("block", "r"), ("op", "l"), ("in-process", "r"), ("attached", "r"),
                                     ("cost", "r"), (r"$\times$", "r"), ("batch GB/s in-proc.", "r"),
                                     ("attached", "r"), ("round trip", "r")], [rf])
    for k, (i, a) in enumerate(attach):
        if k:
            t.rule()
        for j, op in enumerate(OPS):
            t.add(size(a["block_bytes"]) if j == 0 else "", op, sig(1e6 * a["in_process"][op]["p50"]),
                  sig(1e6 * a["attached"][op]["p50"]), sig(a["attach_cost_us_p50"][op]),
                  sig(a["attached_over_in_process_p50"][op], 2), sig(a["in_process"][f"batch_{op}_gbps"]),
                  sig(a["attached"][f"batch_{op}_gbps"]),
                  sig(1e6 * a["attached"]["lookup_rtt"]["p50"]) if j == 0 else "")
    ctx.put(t)

    clients = int(s["ranks"])
    cols = ([("caches", "l"), ("all", "r")] + [(f"client {c}", "r") for c in range(clients)]
            + [(r"get $\mu$s", "r"), (r"put $\mu$s", "r"), ("wrong", "r"), ("bytes", "r")])
    h = ctx.table("cluster_hits", cols, [rf])
    for key, label, v in [("shared", "shared (one cache)", s["shared"]), ("private", "private per worker",
                                                                            s["private"]), *others]:
        per = v.get("per_client") if isinstance(v.get("per_client"), list) else []
        cells = [pct(x) if isinstance(x, (int, float)) else "--" for x in per[:clients]]
        cells += ["--"] * (clients - len(cells))
        moved = v.get("bytes_from_other_ranks")
        h.add(escape(label), pct(v["global"]), *cells, *(_cell(v.get(k)) for k in ("get_us_p50", "put_us_p50")),
              _cell(v.get("wrong_chunks"), integer),
              sig(moved / (1 << 20)) + r"\,MiB" if isinstance(moved, (int, float)) else "--")
    ctx.put(h)
    return [rf]


def _cell(value: Any, fmt=sig) -> str:
    return fmt(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else "--"


SPEC = FigureSpec("cluster_serving", "", "cluster_serving results", build, macros=MACROS,
                  tables={"cluster_attach": ATTACH_CAPTION, "cluster_hits": HITS_CAPTION},
                  wide_tables=("cluster_attach",), figure=False)
