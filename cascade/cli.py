"""The ``cascade`` command: ``info``, ``run`` (the main job), ``serve`` (a rank engines attach
to) and ``stats``."""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from . import __version__
from .config import Config, parse_overrides
from .errors import CascadeError


def _config(args: argparse.Namespace) -> Config:
    return Config.load(args.config or os.environ.get("CASCADE_CONFIG"), **parse_overrides(args.set))


def _versions() -> dict[str, str]:
    versions = {"cascade": __version__, "python": platform.python_version()}
    for mod in ("numpy", "blake3", "xxhash", "mpi4py", "cupy"):
        try:
            versions[mod] = getattr(__import__(mod), "__version__", "installed")
        except ImportError:
            versions[mod] = "not installed"
    return versions


def cmd_info(args: argparse.Namespace) -> int:
    """Print the tiers this machine offers with the current config."""
    from .models import BlockSpec
    from .tiers.gpu import cupy_module
    from .tiers.lustre_fs import is_lustre

    cfg = _config(args)
    spec = BlockSpec.for_model(cfg.model, cfg.block_tokens)
    gpu = cupy_module()
    file_parent = cfg.file_dir if os.path.isdir(cfg.file_dir) else os.path.dirname(cfg.file_dir.rstrip("/")) or "."
    info = {
        "versions": _versions(),
        "block": {"model": cfg.model, "block_tokens": cfg.block_tokens, "shape": spec.shape,
                  "dtype": spec.dtype, "bytes": spec.block_bytes},
        "tiers": {
            "gpu": {"capacity": cfg.gpu_bytes, "available": gpu is not None,
                    "note": "cupy device memory" if gpu else "off: no usable GPU (tests run this tier with numpy)"},
            "shm": {"capacity": cfg.shm_bytes, "dir": cfg.shm_dir, "exists": os.path.isdir(cfg.shm_dir)},
            "remote": {"capacity": cfg.remote_bytes, "note": "other ranks' DRAM over MPI RMA (multi-rank runs)"},
            "file": {"capacity": cfg.file_bytes, "dir": cfg.file_dir,
                       "on_lustre": os.path.isdir(file_parent) and is_lustre(file_parent),
                       "stripe": [cfg.lustre_stripe_count, cfg.lustre_stripe_size]},
        },
        "policy": cfg.policy,
    }
    print(json.dumps(info, indent=2, default=str))
    return 0


def _run_file_dir(args: argparse.Namespace, cfg: Config) -> tuple[str, str | None]:
    """The file-tier directory of this run and the fresh one to remove afterwards.

    A run starts cold in a new private directory under ``file_dir`` (removed at exit), so
    two runs of one command measure the same thing; ``--warm`` reuses ``file_dir`` itself
    and whatever earlier runs left there."""
    from .tiers.private_dir import ensure_private_dir

    base = ensure_private_dir(cfg.file_dir)
    if args.warm or cfg.file_bytes == 0:
        return base, None
    fresh = tempfile.mkdtemp(prefix="run-", dir=base)  # mode 0700
    return fresh, fresh


def _say_file_tier(cfg: Config, base: str, used: str, fresh: str | None) -> None:
    if cfg.file_bytes == 0:
        print("file tier: off (file_bytes=0)", flush=True)
    elif fresh is not None:
        print(f"file tier: fresh directory {used} (cold start, removed at exit; --warm reuses {base})", flush=True)
    else:
        print(f"file tier: warm, reusing {used} and the blocks earlier runs left there", flush=True)


def _forwarded_run_args(args: argparse.Namespace) -> list[str]:
    """The arguments after the ``run`` subcommand, minus the ones only this launcher
    reads, plus ``--verbose`` when the global ``-v`` was given."""
    raw = args.raw_argv
    start = next(i for i, a in enumerate(raw) if not a.startswith("-")) + 1  # global flags come first
    return [a for a in raw[start:] if a != "--warm"] + (["--verbose"] if args.verbose else [])


@contextmanager
def _sigterm_exits() -> Iterator[None]:
    """SIGTERM (a ``kill``, a scheduler, a CI time limit) raises ``SystemExit(143)`` in
    the main thread while the ``with`` block runs, so that its ``finally`` clauses run:
    the ranks of a run are stopped and its fresh directory removed. Elsewhere than on
    the main thread (where no handler can be set) it does nothing."""
    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def cmd_run(args: argparse.Namespace) -> int:
    """Replay the built-in workload (or ``--trace``) against a store; print the report."""
    from .app.results import check_results_dir

    cfg = _config(args)
    if args.results is not None:
        check_results_dir(args.results)
    with _sigterm_exits():
        used, fresh = _run_file_dir(args, cfg)
        try:
            _say_file_tier(cfg, os.path.abspath(cfg.file_dir), used, fresh)
            if args.ranks > 1:
                from .app.launcher import run_local_ranks

                return run_local_ranks(args.ranks, _forwarded_run_args(args) + ["--set", f"file_dir={used}"])
            return _run_here(args, cfg.replace(file_dir=used))
        finally:
            if fresh is not None:
                shutil.rmtree(fresh, ignore_errors=True)


def _run_here(args: argparse.Namespace, cfg: Config) -> int:
    from .replay import replay
    from .report import summary, tier_table
    from .store import CascadeStore
    from .trace import read_trace
    from .workload import WorkloadParams, generate

    if args.trace:
        requests = read_trace(args.trace, limit=args.requests)
        source = args.trace
    else:
        requests = generate(WorkloadParams(), seed=args.seed)[: args.requests]
        source = f"built-in workload (seed {args.seed})"
    print(f"cascade run: {len(requests)} requests from {source}; model {cfg.model}, "
          f"{cfg.block_tokens} tokens per block", flush=True)
    t0 = time.perf_counter()
    with CascadeStore(cfg) as store:
        result = replay(store, requests, progress=not args.quiet, seed=args.seed)
    elapsed = time.perf_counter() - t0
    stats = result.store_stats
    moved = sum(t.get("bytes_read", 0) + t.get("bytes_written", 0) for t in stats["tiers"].values())
    print(tier_table(stats))
    print(summary(stats))
    print(f"references {result.references}: block hit ratio {result.block_hit_ratio:.1%}, token hit "
          f"ratio {result.token_hit_ratio:.1%}; {elapsed:.1f} s, {moved / elapsed / 1e9:.2f} GB/s moved")
    if args.results:
        from .app.results import write_results

        path = write_results(args.results, 1, {"config": cfg.as_dict(), "versions": _versions(), "source": source,
                                               "elapsed_s": elapsed, **result.as_dict()})
        print(f"results: {path}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Run one rank of a Cascade job serving this node's engines (see cascade/serve/)."""
    from .models import BlockSpec
    from .serve.rank import serve

    spec = BlockSpec.flat(args.block_bytes) if args.block_bytes else None
    return serve(_config(args), block_spec=spec, socket_dir=args.socket_dir)


def cmd_stats(args: argparse.Namespace) -> int:
    """Print the stats files a running or finished job wrote (``stats_dir``)."""
    from .metrics import aggregate, prometheus_text
    from .report import summary, tier_table
    from .stats import read_stats_files

    directory = args.dir or _config(args).stats_dir
    if not directory:
        raise CascadeError("no stats directory: pass DIR or set stats_dir (CASCADE_STATS_DIR)")
    per_rank = read_stats_files(directory)
    if not per_rank:
        raise CascadeError(f"no stats_rank*.json files in {directory}")
    if args.prometheus:
        print(prometheus_text(per_rank), end="")
        return 0
    total = aggregate(per_rank)
    print(f"{total['ranks']} rank(s) in {directory}")
    print(tier_table(total))
    print(summary(total))
    return 0


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr (exit 2), never a traceback."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def count_arg(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum`` (a usage error otherwise)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    parse.__name__ = f"integer >= {minimum}"
    return parse


def trace_file(text: str) -> str:
    """An argparse type: the path of a readable file (a usage error otherwise)."""
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"no such trace file: {text}")
    if not os.access(text, os.R_OK):
        raise argparse.ArgumentTypeError(f"cannot read trace file: {text}")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cascade", description=__doc__)
    parser.add_argument("--version", action="version", version=f"cascade {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the tiers do")
    sub = parser.add_subparsers(dest="command", required=True)
    common = _Parser(add_help=False)
    common.add_argument("--config", help="TOML file with a [cascade] table (or CASCADE_CONFIG)")
    common.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one config key (repeatable)")
    sub.add_parser("info", parents=[common], help="tiers, capacities, paths and versions").set_defaults(func=cmd_info)
    run = sub.add_parser("run", parents=[common], help="the main job: replay a workload, report per tier",
                         allow_abbrev=False)  # (its arguments go on to cascade.app, which takes no abbreviations)
    run.add_argument("--trace", type=trace_file,
                     help="Mooncake-format JSONL trace (default: the built-in workload generator)")
    run.add_argument("--requests", type=count_arg(0), default=None, help="replay only the first N requests")
    run.add_argument("--seed", type=count_arg(0), default=0)
    run.add_argument("--ranks", type=count_arg(1), default=1, help="run N local MPI ranks (mpiexec)")
    run.add_argument("--blocks", type=count_arg(0), help="with --ranks: blocks each rank puts and all others read back")
    run.add_argument("--warm", action="store_true",
                     help="reuse file_dir and the blocks earlier runs left there (default: a fresh directory)")
    run.add_argument("--results", help="write a results JSON into this directory")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.set_defaults(func=cmd_run)
    serve = sub.add_parser("serve", parents=[common],
                           help="one rank of a job that local engines attach to (python -m mpi4py -m cascade serve)")
    serve.add_argument("--socket-dir", help="node-local private directory of the rank sockets "
                       "(default /tmp/cascade-<uid>, plus /j<SLURM_JOB_ID> in a SLURM job)")
    serve.add_argument("--block-bytes", type=count_arg(2), help="raw blocks of this many bytes (default: the model's)")
    serve.set_defaults(func=cmd_serve)
    stats = sub.add_parser("stats", parents=[common], help="stats of a running or finished job")
    stats.add_argument("dir", nargs="?", help="the job's stats_dir (default: config stats_dir)")
    stats.add_argument("--prometheus", action="store_true", help="Prometheus text format")
    stats.set_defaults(func=cmd_stats)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(raw)
    args.raw_argv = raw
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except CascadeError as exc:
        print(f"cascade: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
