"""Multi-rank tests: the same test bodies at every world size.

Run at one rank with plain ``pytest tests/mpi`` and at N ranks with
``mpiexec -n 4 python -m mpi4py -m pytest tests/mpi -p no:cacheprovider``. Assertions are
collective (``assert everywhere(ok, detail)``), so every rank checks the same global fact
and all ranks pass or fail together, each naming the ranks that failed and why.

What an assertion cannot make collective - an unexpected exception, or a check left on
one rank - the hook below does: after each test every rank shares its outcome, a test
that failed on some rank fails on all of them (naming those ranks), and a rank that
failed alone while the others are stuck in a collective it left aborts the job after
:data:`STRAGGLER_SECONDS` with its own report, instead of a silent hang. A hang
becomes a failure too: every test here has a thread-based timeout, which ends the
process (``python -m mpi4py`` then takes the whole job down) even when a rank is stuck
inside an MPI call, where a signal could not interrupt it.
"""
from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from collective import Verdict

TIMEOUT_SECONDS = 120
STRAGGLER_SECONDS = 30.0  # a rank that failed alone waits this long for the others
_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items):
    for item in items:
        if not item.path.is_relative_to(_HERE):
            continue
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TIMEOUT_SECONDS, method="thread"))
        item.add_marker(pytest.mark.mpi)


def _world():
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return MPI.COMM_WORLD if MPI.COMM_WORLD.Get_size() > 1 else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Make each test's outcome one global fact (see the module docstring)."""
    outcome = yield
    report = outcome.get_result()
    world = _world() if item.path.is_relative_to(_HERE) else None
    if world is None or report.when == "teardown" or (report.when == "setup" and report.passed):
        return  # the call phase shares the outcome; a setup error ends the test early
    import numpy as np

    mine = np.array([report.failed], dtype=np.int32)
    everyone = np.zeros(world.Get_size(), dtype=np.int32)
    request = world.Iallgather(mine, everyone)
    deadline = time.monotonic() + STRAGGLER_SECONDS
    while not request.Test():
        if report.failed and time.monotonic() > deadline:
            sys.stderr.write(f"\nrank {world.Get_rank()} failed {item.nodeid} ({report.when}) while the "
                             f"other ranks did not finish it within {STRAGGLER_SECONDS:.0f} s (stuck in a "
                             f"collective this rank left): aborting the job (MPI_Abort).\n{report.longreprtext}\n")
            sys.stderr.flush()
            time.sleep(1.0)  # mpiexec forwards output asynchronously: let the report out before the kill
            world.Abort(1)
        time.sleep(0.001)
    failed = [rank for rank, bad in enumerate(everyone) if bad]
    if failed and not report.failed:
        report.outcome = "failed"
        report.longrepr = f"{item.nodeid} failed on rank(s) {failed} (see their reports); it passed here"


@pytest.fixture
def comm():
    """The world communicator, duplicated so that a test's traffic stays its own."""
    MPI = pytest.importorskip("mpi4py.MPI", reason="the mpi extra (mpi4py) is not installed")
    dup = MPI.COMM_WORLD.Dup()
    yield dup
    dup.Free()


@pytest.fixture
def everywhere(comm):
    """``assert everywhere(ok, detail)``: ``ok`` must hold on every rank (collective).

    Returns a :class:`collective.Verdict`, true when ``ok`` held on every rank; when
    false, pytest prints which ranks failed and each one's ``detail`` (default: ``ok``
    itself, e.g. an :func:`collective.raises` outcome)."""
    def check(ok, detail=None) -> Verdict:
        mine = None if ok else str(ok if detail is None else detail)
        return Verdict(comm.allgather(mine))
    return check


@pytest.fixture
def shared_dir(comm):
    """A directory made by rank 0 and seen by every rank; removed once all are done."""
    path = comm.bcast(tempfile.mkdtemp(prefix="cascade-mpi-") if comm.rank == 0 else None)
    yield path
    comm.Barrier()  # every rank's store is closed: the files can go
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
