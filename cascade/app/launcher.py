"""Start a local multi-rank run: ``cascade run --ranks N`` -> ``mpiexec -n N ...``."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence

from ..errors import LaunchError


def mpiexec_path() -> str:
    """The ``mpiexec`` beside this interpreter (the PyPI mpich wheel's), else on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = beside if os.access(beside, os.X_OK) else shutil.which("mpiexec")
    if found is None:
        raise LaunchError("no mpiexec found: pip install 'cascade-kv[mpi]' (mpi4py and the mpich wheel)")
    return found


def run_local_ranks(ranks: int, args: Sequence[str]) -> int:
    """Run ``cascade.app run ARGS`` on ``ranks`` local ranks; its exit code.
    ``--ranks N`` is dropped from ``args``; everything else is passed through."""
    forwarded: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg == "--ranks":
            skip = True
            continue
        if arg.startswith("--ranks="):
            continue
        forwarded.append(arg)
    cmd = [mpiexec_path(), "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "cascade.app",
           "run", *forwarded]
    return subprocess.call(cmd)
