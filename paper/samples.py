"""Re-measure ``paper/sample_results/``: small, real results files for the paper's tests.

    python -m paper.samples [--out DIR]      (or: make -C paper samples)

Runs the real workloads at tiny sizes -- nothing here is typed in -- and writes their
results files, with the raw per-call sample lists dropped (the summaries computed from
them are kept; the file says so in ``trimmed``). The workloads:

* ``tier_bandwidth``: 64 KiB - 4 MiB blocks, 8 MiB per size and tier;
* ``trace_replay``: the first 300 requests of the shared trace (or of the built-in
  generator when the trace is absent) at 50, 200 and 800 blocks;
* ``mpi_micro``: two local ranks, 64 KiB - 4 MiB;
* ``cascade run``: one rank and two ranks, 60 requests, 64 MiB SHM and 512 MiB file tiers.

The benchmark harness's comparison and scaling workloads are added here when they exist.
Takes about a minute on a 2-core machine; run it when a results schema changes.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

SAMPLE_DIR = Path(__file__).resolve().parent / "sample_results"
ROOT = SAMPLE_DIR.parent.parent
_KB, _MB = 1 << 10, 1 << 20


def trim(doc: Any) -> Any:
    """``doc`` without raw sample lists (keys ``samples_s`` / ``*_samples_s``)."""
    if isinstance(doc, dict):
        return {k: trim(v) for k, v in doc.items() if not (k == "samples_s" or k.endswith("_samples_s"))}
    if isinstance(doc, list):
        return [trim(v) for v in doc]
    return doc


def _finish(path: Path) -> Path:
    doc = json.loads(path.read_text())
    doc = trim(doc)
    doc["trimmed"] = "paper/samples.py: raw per-call sample lists removed; every other field as measured"
    path.write_text(json.dumps(doc, indent=1))
    return path


def _runner_workload(out: Path, workload: str, options: dict[str, Any]) -> Path:
    import importlib

    from benchmark.results import write_results

    module = importlib.import_module(f"benchmark.workloads.{workload}")
    result = module.run(options)
    path = write_results("cascade", workload, result, config={k: v for k, v in options.items() if v is not None},
                         directory=out)
    return _finish(path)


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
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASCADE_")}
    subprocess.run(cmd, check=True, cwd=ROOT, env=env)


def regenerate(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.json"):
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="cascade-samples-") as tmp:
        work = Path(tmp)
        _runner_workload(out, "tier_bandwidth", {"sizes": [64 * _KB, 256 * _KB, _MB, 4 * _MB],
                                                 "total_bytes": 8 * _MB, "file_dir": str(work)})
        _runner_workload(out, "trace_replay", {"requests": 300, "capacities": [50, 200, 800]})
        subprocess.run([_mpiexec(), "-n", "2", _python(), "-m", "mpi4py", "-m", "paper.samples",
                        "--mpi-micro-child", "--out", str(out)], check=True, cwd=ROOT)
        _cascade_run(out, 1, work)
        _cascade_run(out, 2, work)
    return sorted(out.glob("*.json"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper.samples", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=SAMPLE_DIR)
    p.add_argument("--mpi-micro-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.mpi_micro_child:
        _mpi_micro_child(args.out)
        return 0
    for path in regenerate(args.out):
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
