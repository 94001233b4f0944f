"""Multi-rank tests: the same test bodies at every world size.

Run at one rank with plain ``pytest tests/mpi`` and at N ranks with
``mpiexec -n 4 python -m mpi4py -m pytest tests/mpi -p no:cacheprovider``. Assertions are
collective (``everywhere(...)``), so every rank checks the same global fact and all ranks
pass or fail together. A hang becomes a failure: every test here has a thread-based
timeout, which ends the process (``python -m mpi4py`` then takes the whole job down) even
when a rank is stuck inside an MPI call, where a signal could not interrupt it.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

TIMEOUT_SECONDS = 120
_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items):
    for item in items:
        if not item.path.is_relative_to(_HERE):
            continue
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TIMEOUT_SECONDS, method="thread"))
        item.add_marker(pytest.mark.mpi)


@pytest.fixture
def comm():
    """The world communicator, duplicated so that a test's traffic stays its own."""
    MPI = pytest.importorskip("mpi4py.MPI", reason="the mpi extra (mpi4py) is not installed")
    dup = MPI.COMM_WORLD.Dup()
    yield dup
    dup.Free()


@pytest.fixture
def everywhere(comm):
    """``everywhere(ok)``: True when ``ok`` holds on every rank (collective)."""
    from mpi4py import MPI
    return lambda ok: comm.allreduce(bool(ok), op=MPI.LAND)


@pytest.fixture
def shared_dir(comm):
    """A directory made by rank 0 and seen by every rank; removed once all are done."""
    path = comm.bcast(tempfile.mkdtemp(prefix="cascade-mpi-") if comm.rank == 0 else None)
    yield path
    comm.Barrier()  # every rank's store is closed: the files can go
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
