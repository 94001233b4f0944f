"""Which ranks see one ``file_dir``: checked at start, so that file-tier blocks are only
read from (and deduplicated onto) copies the reader can open.

Rank 0 writes a file with a random nonce into its ``file_dir``; every rank looks for it
in its own ``file_dir``. If all see it, the directory is one shared file system
(Lustre ``$SCRATCH``, NFS, or one node). Otherwise the lowest rank of each node does the
same for its node, so node-local disks still share between the ranks of a node.
Cost: two collectives and at most two small files per node at start.
"""
from __future__ import annotations

import os
import secrets
from typing import TYPE_CHECKING

from .rma import load_mpi

if TYPE_CHECKING:
    from mpi4py import MPI


def _sees(directory: str, name: str | None, nonce: str | None) -> bool:
    if name is None:
        return False
    try:
        with open(os.path.join(directory, name)) as f:
            return f.read() == nonce
    except OSError:
        return False


def _write_nonce(directory: str) -> tuple[str | None, str | None]:
    """A fresh nonce file (mode 0600) in ``directory``; (None, None) when it cannot be
    written, e.g. the directory does not exist (no file tier: nothing to share)."""
    name, nonce = f".cascade-share-{os.getpid()}-{secrets.token_hex(8)}", secrets.token_hex(16)
    try:
        fd = os.open(os.path.join(directory, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(nonce)
    except OSError:
        return None, None
    return name, nonce


def _remove(directory: str, name: str | None) -> None:
    if name is not None:
        try:
            os.unlink(os.path.join(directory, name))
        except OSError:
            pass


def file_share_groups(comm: MPI.Comm, file_dir: str, node_comm: MPI.Comm) -> list[int]:
    """Collective over ``comm`` (``node_comm``: this rank's node, from
    ``Split_type(COMM_TYPE_SHARED)``). For every rank of ``comm``, a group number: two
    ranks can read each other's aggregated files iff their numbers are equal and not
    negative. -1 means the rank shares its ``file_dir`` with nobody."""
    rank = comm.Get_rank()
    name, nonce = _write_nonce(file_dir) if rank == 0 else (None, None)
    name, nonce = comm.bcast((name, nonce), root=0)
    seen = comm.allgather(_sees(file_dir, name, nonce))
    comm.Barrier()  # everybody looked before the file goes
    if rank == 0:
        _remove(file_dir, name)
    if all(seen):
        return [0] * comm.Get_size()
    MPI = load_mpi()
    leader = node_comm.Get_rank() == 0
    name, nonce = _write_nonce(file_dir) if leader else (None, None)
    name, nonce = node_comm.bcast((name, nonce), root=0)
    node_sees = _sees(file_dir, name, nonce)
    node_comm.Barrier()
    if leader:
        _remove(file_dir, name)
    node_leader = node_comm.allreduce(rank, op=MPI.MIN)
    return comm.allgather(1 + node_leader if node_sees else -1)
