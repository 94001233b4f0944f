"""Re-measure ``paper/sample_results/``: a small, real suite run for the paper's tests.

    python -m paper.samples [--out DIR] [--reps N]     (or: make -C paper samples)

Writes a suite directory in the layout of ``python -m benchmark.suite``
(``benchmark/README.md``): ``manifest.json`` (format ``cascade-bench-suite/1``) and
``rep0/ rep1/ ...``, one results file per workload in each. Each repetition runs the
real workloads at tiny sizes, through the same command lines a user runs -- nothing here
is typed in -- and keeps their results files with the raw per-call sample lists dropped
(the summaries computed from them are kept; each file says so in ``trimmed``). Unlike the
suite, repetitions run one after the other, not interleaved. The runs of a repetition:

* ``python -m benchmark.run_benchmark --system all`` for ``write_throughput``,
  ``read_throughput`` and ``read_latency`` (2 MiB blocks, 8 measured, 2 rounds),
  ``trace_replay`` (first 150 requests at 50, 200 and 800 blocks) and ``scaling``
  (1 and 2 ranks, 4 blocks per rank); ``--system cascade`` for ``tier_bandwidth``
  (64 KiB - 4 MiB, 8 MiB per size and tier);
* ``mpi_micro`` on two local ranks, 64 KiB - 4 MiB;
* ``cascade run`` on one rank and on two ranks: 60 requests, 64 MiB SHM, 512 MiB files.

Takes a few minutes on a 2-core machine; run it when a results schema changes.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

SAMPLE_DIR = Path(__file__).resolve().parent / "sample_results"
ROOT = SAMPLE_DIR.parent.parent
_KB, _MB = 1 << 10, 1 << 20


def _raw(key: str) -> bool:
    return key in ("samples", "samples_s") or key.endswith("_samples_s")


def trim(doc: Any) -> Any:
    """``doc`` without raw sample lists (keys ``samples``, ``samples_s``, ``*_samples_s``)."""
    if isinstance(doc, dict):
        return {k: trim(v) for k, v in doc.items() if not _raw(k)}
    if isinstance(doc, list):
        return [trim(v) for v in doc]
    return doc


def _finish(path: Path) -> Path:
    doc = json.loads(path.read_text())
    doc = trim(doc)
    doc["trimmed"] = "paper/samples.py: raw per-call sample lists removed; every other field as measured"
    path.write_text(json.dumps(doc, separators=(",", ":")))
    return path


def _runner(out: Path, system: str, workload: str, *args: str) -> Path:
    """``python -m benchmark.run_benchmark`` into a scratch directory; the file, trimmed."""
    with tempfile.TemporaryDirectory(prefix="cascade-sample-out-") as scratch:
        _call([_python(), "-m", "benchmark.run_benchmark", "--system", system, "--workload", workload, *args,
               "--out", scratch])
        [made] = Path(scratch).glob("*.json")
        target = out / made.name
        target.write_text(made.read_text())
    return _finish(target)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CASCADE_")}


def _call(cmd: list[str]) -> None:
    """Run ``cmd`` from the repository root; on failure show the end of its stderr."""
    print("+", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        raise SystemExit(f"{cmd[2:5]} failed ({done.returncode}):\n{done.stderr[-4000:]}")


def _mpi_micro_child(out: Path) -> None:
    """Runs on every rank under mpiexec; rank 0 writes the file."""
    from mpi4py import MPI

    from benchmark.results import write_results
    from benchmark.workloads import mpi_micro

    comm = MPI.COMM_WORLD
    result = mpi_micro.run({"sizes": [64 * _KB, _MB, 4 * _MB]}, comm)
    if comm.Get_rank() == 0:
        _finish(write_results("cascade", "mpi_micro", result, nodes=result["nodes"], ranks=result["ranks"],
                              config={"sizes": [64 * _KB, _MB, 4 * _MB]}, directory=out))


def _python() -> str:
    return sys.executable


def _mpiexec() -> str:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else "mpiexec"


def _cascade_run(out: Path, ranks: int, work: Path) -> None:
    cmd = [_python(), "-m", "cascade.cli", "run", "--requests", "60", "--quiet", "--results", str(out),
           "--set", "shm_bytes=64M", "--set", "file_bytes=512M", "--set", f"file_dir={work / f'files{ranks}'}"]
    if ranks > 1:
        cmd += ["--ranks", str(ranks), "--blocks", "8"]
    _call(cmd)


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""


def _stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")


def write_manifest(suite: Path, command: list[str], started: str) -> Path:
    """``suite/manifest.json`` listing every ``rep*/*.json`` as a successful run."""
    runs = []
    for rep_dir in sorted(suite.glob("rep*"), key=lambda p: int(p.name[3:])):
        for path in sorted(rep_dir.glob("*.json")):
            workload = json.loads(path.read_text()).get("workload") or "run"
            runs.append({"rep": int(rep_dir.name[3:]), "workload": workload, "status": "ok",
                         "file": str(path.relative_to(suite))})
    dirty = [line[3:] for line in _git("status", "--porcelain", "--", "cascade", "benchmark").splitlines()]
    manifest = {"format": "cascade-bench-suite/1", "written_by": "python -m paper.samples (not benchmark.suite: "
                "tiny sizes, repetitions one after the other)", "commit": _git("rev-parse", "HEAD") or None,
                "dirty": bool(dirty), "dirty_paths": dirty, "command": command, "size": "paper-sample",
                "reps": len({r["rep"] for r in runs}), "workloads": sorted({r["workload"] for r in runs}),
                "runs": runs, "started": started, "finished": datetime.now(timezone.utc).isoformat()}
    path = suite / "manifest.json"
    path.write_text(json.dumps(manifest, indent=1) + "\n")
    return path


def regenerate(out: Path, reps: int = 3) -> list[Path]:
    """A suite of ``reps`` repetitions in ``out/suite_<commit12>_<stamp>/`` (``out`` is
    emptied of older suites first)."""
    started = datetime.now(timezone.utc).isoformat()
    for old in out.glob("suite_*"):
        shutil.rmtree(old)
    suite = out / f"suite_{(_git('rev-parse', 'HEAD') or 'unknown')[:12]}_{_stamp()}"
    for r in range(reps):
        one_repetition(suite / f"rep{r}")
    write_manifest(suite, ["python", "-m", "paper.samples", "--reps", str(reps)], started)
    return sorted(suite.rglob("*.json"))


def one_repetition(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.json"):
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="cascade-samples-") as tmp:
        work = Path(tmp)
        files = ["--file-dir", str(work / "files")]
        data = ["--data-dir", str(work / "data")]
        _runner(out, "cascade", "tier_bandwidth", "--sizes", "64K,256K,1M,4M", "--total-bytes", "8M", *files)
        small = ["--sizes", "2M", "--blocks", "8", "--warmup", "2", "--rounds", "2", *data, *files]
        _runner(out, "all", "write_throughput", *small)
        _runner(out, "all", "read_throughput", *small)
        _runner(out, "all", "read_latency", *small, "--ops", "24")
        _runner(out, "all", "trace_replay", "--requests", "150", "--capacities", "50,200,800", "--time-limit", "30",
                *files)
        _runner(out, "all", "scaling", "--rank-counts", "1,2", "--blocks", "4", "--rounds", "2", "--sizes", "2M",
                *data, *files)
        _call([_mpiexec(), "-n", "2", _python(), "-m", "mpi4py", "-m", "paper.samples", "--mpi-micro-child",
               "--out", str(out)])
        _cascade_run(out, 1, work)
        _cascade_run(out, 2, work)
    return sorted(out.glob("*.json"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper.samples", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=SAMPLE_DIR, help="where the suite directory goes")
    p.add_argument("--reps", type=int, default=3, help="repetitions (default %(default)s)")
    p.add_argument("--mpi-micro-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.mpi_micro_child:
        _mpi_micro_child(args.out)
        return 0
    if args.reps < 1:
        p.error("--reps must be at least 1")
    for path in regenerate(args.out, args.reps):
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
