"""The main job on every rank: ``python -m mpi4py -m cascade.app run ...``.

Two phases, both against one cluster-wide store:

1. exchange: every rank puts ``--blocks`` blocks of its token sequence under token-prefix
   ids, then recomputes every other rank's ids from its tokens, reads those blocks and
   checks them byte for byte (cross-rank reads through the directory);
2. replay: the requests of the built-in workload (or ``--trace``) are dealt round-robin
   to the ranks and replayed concurrently (shared prefixes hit across ranks).

Rank 0 prints a per-tier report summed over ranks and writes
``cascade_run_{nodes}n_{timestamp}.json`` into ``--results``. The exit code is non-zero
if any rank read a wrong byte. Collective: every rank runs all of it.
"""
from __future__ import annotations

import argparse
import logging
import os
import platform
import time
from typing import Any, Sequence

import numpy as np

from ..cli import count_arg, trace_file
from ..config import Config, parse_overrides
from ..errors import CascadeError
from .results import check_results_dir, write_results


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m cascade.app", description="Cascade's main job on N ranks")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="exchange + replay on every rank", allow_abbrev=False)
    run.add_argument("--results", help="directory for the results JSON (rank 0 writes it)")
    run.add_argument("--blocks", type=count_arg(0), default=32, help="blocks each rank puts in the exchange phase")
    run.add_argument("--requests", type=count_arg(0), default=None,
                     help="replay only the first N requests, dealt to the ranks (default: all; 0: skip the replay)")
    run.add_argument("--trace", type=trace_file, help="Mooncake-format trace (default: the built-in workload)")
    run.add_argument("--seed", type=count_arg(0), default=0)
    run.add_argument("--config", help="TOML config file")
    run.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one config key")
    run.add_argument("--quiet", action="store_true")
    run.add_argument("-v", "--verbose", action="store_true", help="log what the tiers do")
    return p


def _config(args: argparse.Namespace) -> Config:
    """The run's config: ``--config`` (or ``CASCADE_CONFIG``), ``CASCADE_*`` and ``--set``
    over the defaults, and unless one of them sets ``remote_bytes``, half of ``shm_bytes``
    lent to the other ranks (a multi-rank run lends DRAM by default)."""
    overrides = parse_overrides(args.set)
    path = args.config or os.environ.get("CASCADE_CONFIG")
    cfg = Config.load(path, **overrides)
    if "remote_bytes" not in Config.given_keys(path, **overrides):
        cfg = cfg.replace(remote_bytes=cfg.shm_bytes // 2)
    return cfg


def _results_dir_checked(path: str | None, comm) -> None:
    """Rank 0 checks that ``--results`` can take the results (:func:`check_results_dir`)
    before anything runs; every rank raises its error. Collective."""
    error = None
    if comm.rank == 0 and path is not None:
        try:
            check_results_dir(path)
        except CascadeError as exc:
            error = str(exc)
    error = comm.bcast(error, root=0)
    if error is not None:
        raise CascadeError(error)


def _exchange(store, comm, blocks: int, seed: int) -> dict[str, Any]:
    """Each rank puts ``blocks`` blocks of its own token sequence under token-prefix ids;
    then every rank recomputes every other rank's ids from that rank's tokens (as an
    engine would: no ids are exchanged), checks how long a prefix the cluster holds and
    reads and checks every block of theirs (its own are not cross-rank reads)."""
    from ..prefix import model_fingerprint, prefix_ids

    spec = store.spec
    fingerprint = model_fingerprint(store.config.model, "cascade-main-job", str(np.dtype(spec.dtype)))

    def tokens(rank: int) -> np.ndarray:
        return np.random.default_rng([seed, rank]).integers(0, 128_000, blocks * store.config.block_tokens)

    def ids_of(rank: int) -> list[str]:
        return prefix_ids(tokens(rank), block_tokens=store.config.block_tokens, model_fingerprint=fingerprint)

    def content(rank: int, i: int):
        rng = np.random.default_rng([seed, rank, i])
        return rng.standard_normal(spec.shape).astype(spec.dtype), rng.standard_normal(spec.shape).astype(spec.dtype)

    t0 = time.perf_counter()
    mine, parent = ids_of(comm.rank), None
    for i, bid in enumerate(mine):
        store.put(*content(comm.rank, i), block_id=bid, parent=parent)
        parent = bid
    put_s = time.perf_counter() - t0
    comm.Barrier()
    wrong = missing = short_prefix = 0
    key_out, value_out = spec.empty()
    t0 = time.perf_counter()
    for rank in range(comm.size):
        if rank == comm.rank:
            continue
        ids = ids_of(rank)
        held = store.longest_prefix(tokens=tokens(rank), model_fingerprint=fingerprint)
        short_prefix += len(ids) - held
        for i, bid in enumerate(ids):
            if not store.get_into(bid, key_out, value_out):
                missing += 1
                continue
            k, v = content(rank, i)
            wrong += not (np.array_equal(key_out, k) and np.array_equal(value_out, v))
    get_s = time.perf_counter() - t0
    comm.Barrier()
    return {"blocks_put": blocks, "blocks_read": blocks * (comm.size - 1), "wrong": wrong, "missing": missing,
            "prefix_blocks_missing": short_prefix, "ids": "token-prefix (cascade.prefix_ids)",
            "put_s": put_s, "get_s": get_s}


def run(argv: Sequence[str] | None = None, comm=None) -> int:
    """Run the main job; returns the exit code. Collective over ``comm`` (default: the
    world communicator of this launch)."""
    args = _parser().parse_args(argv)
    from mpi4py import MPI

    from ..launch import discover
    from ..metrics import aggregate
    from ..replay import replay
    from ..report import human_bytes, summary, tier_table
    from ..store import CascadeStore
    from ..trace import read_trace
    from ..workload import WorkloadParams, generate

    comm = comm if comm is not None else MPI.COMM_WORLD  # the launcher's world: this is the program, not the library
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format=f"%(levelname)s rank {comm.rank} %(name)s: %(message)s")
    info = discover(comm)
    cfg = _config(args)
    _results_dir_checked(args.results, comm)
    if args.trace:
        requests = read_trace(args.trace, limit=args.requests)
    else:
        requests = generate(WorkloadParams(), seed=args.seed)[: args.requests]
    if comm.rank == 0 and not args.quiet:
        print(f"cascade: {info.size} ranks on {info.num_nodes} node(s); model {cfg.model}, "
              f"{human_bytes(cfg.shm_bytes)} SHM + {human_bytes(cfg.remote_bytes)} lent DRAM per rank; file tier {cfg.file_dir}",
              flush=True)
    started = time.perf_counter()
    store = CascadeStore(cfg, comm=comm)
    try:
        exchange = _exchange(store, comm, args.blocks, args.seed)
        mine = requests[comm.rank::comm.size]
        result = replay(store, mine, progress=False, seed=args.seed + comm.rank)
        comm.Barrier()
        per_rank = comm.gather(store.stats(), root=0)
        replays = comm.gather(result.as_dict() | {"store_stats": None}, root=0)
        exchanges = comm.gather(exchange, root=0)
    except KeyboardInterrupt:  # Ctrl-C or the launcher's stop reaches every rank at once: they close together
        store.close()
        raise
    # Any other error is this rank's alone: the others wait in the job's next collective
    # call and would never reach close(), whose agreement would wait 10 minutes for them.
    # It propagates unclosed; python -m mpi4py then aborts every rank at once (the next
    # open removes the slab files left in shm_dir; the file tier stays for a warm restart).
    store.close()
    elapsed = time.perf_counter() - started
    wrong = comm.allreduce(exchange["wrong"])
    if comm.rank == 0:
        total = aggregate(per_rank)
        refs = sum(r["references"] for r in replays)
        hits = sum(r["hits"] for r in replays)
        if not args.quiet:
            print(tier_table(total))
            print(summary(total))
            print(f"exchange: {sum(e['blocks_read'] for e in exchanges)} cross-rank reads, "
                  f"{wrong} wrong, {sum(e['missing'] for e in exchanges)} missing; replay: {refs} references, "
                  f"block hit ratio {hits / max(refs, 1):.1%} ({total['cluster_hits']} hits served by another rank); "
                  f"{elapsed:.1f} s")
        if args.results:
            path = write_results(args.results, info.num_nodes, {
                "ranks": info.size, "launch": info.__dict__, "config": cfg.as_dict(), "host": platform.node(),
                "elapsed_s": elapsed, "exchange": exchanges, "wrong_bytes_blocks": wrong,
                "replay": {"references": refs, "hits": hits, "block_hit_ratio": hits / max(refs, 1),
                           "per_rank": replays},
                "totals": total, "per_rank_stats": per_rank})
            print(f"results: {path}", flush=True)
    return 1 if wrong else 0
