"""Start a local multi-rank run: ``cascade run --ranks N`` -> ``mpiexec -n N ...``."""
from __future__ import annotations

import os
import shutil
import signal
import sys
from collections.abc import Sequence

from ..errors import LaunchError
from .process_group import run_in_group

#: Seconds the ranks of an interrupted run get to close their stores (SIGINT) before SIGKILL.
STOP_GRACE_S = 30.0


def mpiexec_path() -> str:
    """The ``mpiexec`` beside this interpreter (the PyPI mpich wheel's), else on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = beside if os.access(beside, os.X_OK) else shutil.which("mpiexec")
    if found is None:
        raise LaunchError("no mpiexec found: pip install 'cascade-kv[mpi]' (mpi4py and the mpich wheel)")
    return found


def run_local_ranks(ranks: int, args: Sequence[str]) -> int:
    """Run ``cascade.app run ARGS`` on ``ranks`` local ranks; its exit code.
    ``--ranks N`` is dropped from ``args``; everything else is passed through. The ranks
    run in a process group of their own: when this call is interrupted (Ctrl-C, or a
    SIGTERM turned into ``SystemExit``), every one of them gets SIGINT, then SIGKILL after
    :data:`STOP_GRACE_S` seconds, before the exception goes on (nothing outlives the run)."""
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
    done = run_in_group(cmd, timeout=None, grace=STOP_GRACE_S, stop=signal.SIGINT)
    assert done is not None  # (no time limit: it returns once the command ended)
    return done.returncode
