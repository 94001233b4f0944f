"""``cascade serve``: one rank of a Cascade job that serves its node's engines.

Every rank (one per node or per GPU; ``srun`` or ``mpiexec``, always under
``python -m mpi4py`` so one failing rank aborts the job) opens the store over
``COMM_WORLD`` (collective), listens on its socket (:mod:`.server`), and runs until it
is told to stop: SIGTERM or SIGINT on any rank stops every rank (the stopping rank tells
the others with one small message each), so that the store's collective close happens
on all of them together. While waiting, the main thread polls MPI every few ms, which
also gives other ranks' one-sided operations on this rank progress.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import time
from typing import Any

import numpy as np

from ..config import Config
from ..distributed.agree import agree
from ..errors import LaunchError
from ..models import BlockSpec
from ..store import CascadeStore
from .paths import default_socket_dir, socket_path
from .server import RankServer

log = logging.getLogger(__name__)
_STOP_TAG = 0x5E5  # on a private duplicate of the world communicator
POLL_SECONDS = 0.002


def _world() -> Any:
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ImportError("cascade serve needs mpi4py: pip install 'cascade-kv[mpi]'") from exc
    comm = MPI.COMM_WORLD
    if comm.Get_size() > 1 and "mpi4py.run" not in sys.modules:
        raise LaunchError("run the ranks as `python -m mpi4py -m cascade serve ...` (under srun or mpiexec) "
                          "so that one failing rank aborts the job instead of hanging it")
    if comm.Get_size() > 1 and MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        raise LaunchError("cascade serve calls MPI from one thread per client and needs MPI_THREAD_MULTIPLE "
                          "(mpi4py.rc.thread_level = 'multiple', the default; this MPI gave less)")
    return comm


def serve(config: Config, *, block_spec: BlockSpec | None = None, socket_dir: str | None = None,
          comm: Any = None) -> int:
    """Run one rank until any rank is stopped; returns the exit code. Collective over
    ``comm`` (default ``COMM_WORLD``)."""
    from ..launch import discover

    comm = comm if comm is not None else _world()
    info = discover(comm)
    socket_dir = socket_dir or default_socket_dir()
    socket_path(socket_dir, info.rank)  # a path too long for a socket fails before the store opens
    store = CascadeStore(config, block_spec=block_spec, comm=comm)
    server: RankServer | None = None
    try:
        try:
            server = RankServer(store, socket_dir, info.rank, world_size=info.size)
        finally:  # every rank learns whether every rank listens (else all close now)
            if info.size > 1:
                agree(comm, server is not None, "serve start")
        print(f"cascade serve: rank {info.rank}/{info.size} (pid {os.getpid()}) on node {info.node_id} serves "
              f"{store.spec.block_bytes}-byte blocks at {server.path}", flush=True)
        by = _wait_for_stop(comm)
        log.info("rank %d stops (%s)", info.rank, by)
    finally:
        if server is not None:
            server.close()
        store.close()
    return 0


def _wait_for_stop(comm: Any) -> str:
    """Block until SIGTERM/SIGINT here or a stop message from another rank; tell the
    other ranks when the signal came here. Returns what stopped us.

    The signal handler only appends to a list: a handler that took a lock (``Event.set``)
    could interrupt this thread inside that same lock's ``wait`` and deadlock it."""
    signals: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _frame: signals.append(signum))
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if comm.Get_size() == 1:
            while not signals:
                time.sleep(POLL_SECONDS)
            return "signal"
        from mpi4py import MPI

        ctl = comm.Dup()
        note = np.zeros(1, dtype=np.uint8)
        incoming = ctl.Irecv(note, source=MPI.ANY_SOURCE, tag=_STOP_TAG)
        while not signals:
            if incoming.Test():
                return "another rank stopped"
            time.sleep(POLL_SECONDS)
        incoming.Cancel()
        incoming.Wait()
        me = comm.Get_rank()
        MPI.Request.Waitall([ctl.Isend(np.ones(1, dtype=np.uint8), dest=r, tag=_STOP_TAG)
                             for r in range(comm.Get_size()) if r != me])
        return "signal"
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
