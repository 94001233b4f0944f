"""Results files: ``benchmark/results/{system}_{workload}_{nodes}n_{timestamp}.json``.

Each file holds the command line, versions, machine facts, the config and the raw samples
beside the summaries, so every figure and table can be traced back and redone.
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .machine import machine_facts

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def versions() -> dict[str, str]:
    """Versions of Cascade and of every peer library importable here."""
    out: dict[str, str] = {}
    for mod in ("cascade", "numpy", "blake3", "mpi4py", "h5py", "redis", "lmcache", "torch", "mooncake", "cupy"):
        try:
            out[mod] = str(getattr(__import__(mod), "__version__", "installed"))
        except Exception:  # a peer that fails to import is simply absent here
            continue
    return out


def git_state() -> dict[str, Any]:
    """The checkout's commit and whether tracked files differ from it (``{}`` outside git)."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "benchmark", "cascade"],
                               cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"commit": commit, "dirty_paths": dirty.splitlines()} if commit else {}


def results_dir(directory: str | Path | None = None) -> Path:
    """The results directory (default :data:`RESULTS_DIR`), created and proven writable
    by a file made and removed in it: call before a run, so an unwritable one is known
    before the run, not after. Raises ``OSError``."""
    path = Path(directory) if directory else RESULTS_DIR
    path.mkdir(parents=True, exist_ok=True)
    tempfile.TemporaryFile(dir=path).close()
    return path


def write_results(system: str, workload: str, payload: dict[str, Any], *, nodes: int = 1,
                  ranks: int = 1, config: dict[str, Any] | None = None,
                  directory: str | Path | None = None) -> Path:
    """Write one results file and return its path. Call on rank 0 only."""
    directory = results_dir(directory)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    path = directory / f"{system}_{workload}_{nodes}n_{stamp}.json"
    n = 1
    while path.exists():
        path = directory / f"{system}_{workload}_{nodes}n_{stamp}_{n}.json"
        n += 1
    doc = {"system": system, "workload": workload, "nodes": nodes, "ranks": ranks,
           "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": sys.argv,
           "versions": versions(), "git": git_state(), "machine": machine_facts(), "config": config or {}, **payload}
    path.write_text(json.dumps(doc, indent=1, default=str))
    return path
