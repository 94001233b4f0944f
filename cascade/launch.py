"""Rank and node discovery, cross-checked between MPI and SLURM.

A job is launched one of three ways: a plain ``mpiexec`` (or no launcher at all),
``srun`` with an ``--mpi`` plugin, or ``mpiexec`` inside a SLURM allocation. Under
``srun`` a wrong ``--mpi`` plugin does not fail: each task silently becomes its own
MPI world of size 1, and every rank then believes it is alone. :func:`discover` compares
``MPI.COMM_WORLD`` and the node grouping MPI sees with SLURM's task variables and raises
:class:`~cascade.errors.LaunchError` naming the fix instead.

The checks are pure functions over an environment mapping (:func:`slurm_layout`,
:func:`check_world`, :func:`check_nodes`) so they can be tested without MPI or SLURM.
mpi4py is imported only by :func:`discover`.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import LaunchError

if TYPE_CHECKING:
    from mpi4py import MPI

_FIX = (
    "start the ranks with `srun --mpi=pmi2 python -m mpi4py -m <module> ...` "
    "(pmi2 is what the PyPI mpich wheel and Cray MPICH speak; Open MPI needs --mpi=pmix; "
    "`srun --mpi=list` shows the plugins this cluster has)"
)


@dataclass(frozen=True)
class SlurmLayout:
    """What SLURM says about this process (the ``SLURM_*`` variables)."""

    procid: int
    ntasks: int
    localid: int
    nodeid: int
    nnodes: int
    job_id: str
    in_step: bool
    """Started by ``srun`` (a job step), not the batch script's own shell."""
    by_mpiexec: bool
    """Started by MPICH's ``mpiexec`` inside the allocation: the ``SLURM_*`` task
    variables then describe mpiexec's per-node proxies, not the MPI ranks."""


@dataclass(frozen=True)
class LaunchInfo:
    """Where this rank sits in the job (result of :func:`discover`)."""

    rank: int
    size: int
    local_rank: int
    """Rank among the ranks sharing this node's memory (``COMM_TYPE_SHARED``)."""
    local_size: int
    node_id: int
    num_nodes: int
    job_id: str | None
    under_slurm: bool


def slurm_layout(env: Mapping[str, str] = os.environ) -> SlurmLayout | None:
    """SLURM's view of this process from ``env``, or None outside a SLURM job. Local.

    Raises LaunchError when a SLURM variable is present but not an integer.
    """
    if "SLURM_JOB_ID" not in env or "SLURM_PROCID" not in env:
        return None

    def integer(name: str, default: int) -> int:
        raw = env.get(name)
        if raw is None:
            return default
        try:
            return int(raw)
        except ValueError:
            raise LaunchError(f"{name}={raw!r} is not an integer") from None

    return SlurmLayout(
        procid=integer("SLURM_PROCID", 0),
        ntasks=integer("SLURM_NTASKS", 1),
        localid=integer("SLURM_LOCALID", 0),
        nodeid=integer("SLURM_NODEID", 0),
        nnodes=integer("SLURM_NNODES", 1),
        job_id=env["SLURM_JOB_ID"],
        in_step="SLURM_STEP_ID" in env,
        by_mpiexec="MPI_LOCALRANKID" in env,  # set by MPICH's hydra for every rank
    )


def check_world(rank: int, size: int, slurm: SlurmLayout | None) -> None:
    """Raise LaunchError if MPI's (rank, size) contradicts SLURM's task layout. Local."""
    if slurm is None or slurm.by_mpiexec:
        return
    if not slurm.in_step and size != slurm.ntasks:
        raise LaunchError(
            f"the job has {slurm.ntasks} SLURM tasks but this process was not started by "
            f"srun (MPI world of size {size}): {_FIX}"
        )
    if size != slurm.ntasks:
        hint = (
            f"each of the {slurm.ntasks} tasks is its own MPI world of size 1, "
            "so the --mpi plugin does not match the MPI library"
            if size == 1
            else "the MPI library did not take the task count from SLURM"
        )
        raise LaunchError(f"MPI world size {size} != SLURM_NTASKS={slurm.ntasks}: {hint}; {_FIX}")
    if rank != slurm.procid:
        raise LaunchError(
            f"MPI rank {rank} != SLURM_PROCID={slurm.procid}: the MPI library did not take "
            f"its rank from SLURM's PMI; {_FIX}"
        )


def check_nodes(num_nodes: int, local_rank: int, slurm: SlurmLayout | None) -> None:
    """Raise LaunchError if MPI groups the world's ranks into nodes unlike SLURM. Local.

    MPI groups ranks by shared memory, and the SHM tier trusts that grouping; a mismatch
    would put the tier on the wrong set of ranks.
    """
    if slurm is None or slurm.by_mpiexec or not slurm.in_step:
        return
    if num_nodes != slurm.nnodes:
        raise LaunchError(
            f"MPI finds {num_nodes} shared-memory nodes but SLURM_NNODES={slurm.nnodes}: "
            "ranks on one node cannot share memory (or a node is seen twice)"
        )
    if local_rank != slurm.localid:
        raise LaunchError(
            f"node-local MPI rank {local_rank} != SLURM_LOCALID={slurm.localid}: MPI and "
            "SLURM disagree on which ranks share this node"
        )


def discover(comm: MPI.Comm, env: Mapping[str, str] = os.environ) -> LaunchInfo:
    """Rank, node and job of this process in ``comm``, checked against SLURM.

    Collective over ``comm``: two splits (freed again), a bcast and an allreduce.
    The launch check compares SLURM with ``MPI.COMM_WORLD`` (a local query), so any
    ``comm`` may be passed, ``COMM_SELF`` included. Raises LaunchError on a wrong
    launch, possibly on some ranks only: run ranks under ``python -m mpi4py`` so that
    one raising rank aborts the job. Raises ImportError when mpi4py is missing.
    """
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ImportError("cascade.launch needs mpi4py: pip install 'cascade-kv[mpi]'") from exc

    slurm = slurm_layout(env)
    world = MPI.COMM_WORLD
    check_world(world.Get_rank(), world.Get_size(), slurm)

    rank, size = comm.Get_rank(), comm.Get_size()
    # SLURM's node numbering describes the whole step: only a world-wide comm uses it
    step = slurm if slurm is not None and slurm.in_step and not slurm.by_mpiexec else None
    if size != world.Get_size():
        step = None
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    try:
        local_rank, local_size = node.Get_rank(), node.Get_size()
        leader = local_rank == 0
        leaders = comm.Split(0 if leader else MPI.UNDEFINED, key=rank)
        # node ids follow the lowest rank on each node; the leader tells its node
        node_id = node.bcast(leaders.Get_rank() if leader else None, root=0)
        if leaders != MPI.COMM_NULL:
            leaders.Free()
        num_nodes = comm.allreduce(int(leader), op=MPI.SUM)
    finally:
        node.Free()
    if step is not None:
        check_nodes(num_nodes, local_rank, step)
        node_id = step.nodeid  # the numbering SLURM's logs and tools use
    return LaunchInfo(
        rank=rank,
        size=size,
        local_rank=local_rank,
        local_size=local_size,
        node_id=node_id,
        num_nodes=num_nodes,
        job_id=slurm.job_id if slurm is not None else None,
        under_slurm=slurm is not None,
    )
