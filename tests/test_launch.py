"""Launch checks: pure functions over SLURM-like environments, and discover() on MPI."""
from __future__ import annotations

import sys

import pytest

from cascade.errors import CascadeError, LaunchError
from cascade.launch import LaunchInfo, check_nodes, check_world, discover, slurm_layout


def srun_env(procid: int, ntasks: int, nnodes: int = 1, **extra: str) -> dict[str, str]:
    """The variables srun gives task ``procid`` of a step of ``ntasks`` tasks."""
    return {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(procid),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_LOCALID": str(procid % (ntasks // nnodes)),
        "SLURM_NODEID": str(procid // (ntasks // nnodes)),
        "SLURM_NNODES": str(nnodes),
        **extra,
    }


def test_outside_slurm_there_is_no_layout() -> None:
    assert slurm_layout({}) is None
    assert slurm_layout({"PATH": "/usr/bin", "SLURM_CONF": "/etc/slurm.conf"}) is None
    check_world(0, 1, None)
    check_nodes(3, 1, None)


def test_layout_is_parsed() -> None:
    layout = slurm_layout(srun_env(5, 8, nnodes=2))
    assert layout is not None
    assert (layout.procid, layout.ntasks, layout.localid, layout.nodeid, layout.nnodes) == (
        5, 8, 1, 1, 2,
    )
    assert layout.job_id == "4242" and layout.in_step and not layout.by_mpiexec


def test_good_layout_passes() -> None:
    for procid in range(8):
        layout = slurm_layout(srun_env(procid, 8, nnodes=2))
        assert (layout.localid, layout.nodeid) == (procid % 4, procid // 4)
        assert check_world(procid, 8, layout) is None and check_nodes(2, procid % 4, layout) is None
        # the same layout is checked, not waved through: one fact off is refused
        with pytest.raises(LaunchError, match=f"MPI rank {(procid + 1) % 8} != SLURM_PROCID={procid}"):
            check_world((procid + 1) % 8, 8, layout)
        with pytest.raises(LaunchError, match=f"node-local MPI rank {(procid + 1) % 4} != SLURM_LOCALID"):
            check_nodes(2, (procid + 1) % 4, layout)


def test_wrong_mpi_plugin_is_named() -> None:
    # --mpi=none with a PMI-2 MPI: every task is rank 0 of a world of size 1
    layout = slurm_layout(srun_env(3, 4))
    with pytest.raises(LaunchError, match=r"world size 1 != SLURM_NTASKS=4.*--mpi=pmi2") as err:
        check_world(0, 1, layout)
    assert "size 1" in str(err.value) and "--mpi plugin" in str(err.value)
    assert isinstance(err.value, CascadeError) and isinstance(err.value, RuntimeError)


def test_size_mismatch_other_than_one() -> None:
    with pytest.raises(LaunchError, match=r"world size 2 != SLURM_NTASKS=4.*--mpi=pmi2"):
        check_world(1, 2, slurm_layout(srun_env(1, 4)))


def test_rank_mismatch() -> None:
    with pytest.raises(LaunchError, match=r"MPI rank 2 != SLURM_PROCID=1.*--mpi=pmi2"):
        check_world(2, 4, slurm_layout(srun_env(1, 4)))


def test_batch_shell_without_srun() -> None:
    env = srun_env(0, 4)
    del env["SLURM_STEP_ID"]
    with pytest.raises(LaunchError, match="not started by srun"):
        check_world(0, 1, slurm_layout(env))
    check_world(0, 4, slurm_layout(env))  # e.g. a batch shell of a 1-task job


def test_mpiexec_inside_allocation_is_not_checked() -> None:
    # hydra starts one proxy per node with srun: SLURM_* then describe the proxies
    layout = slurm_layout(srun_env(0, 1, MPI_LOCALRANKID="2"))
    assert layout is not None and layout.by_mpiexec
    check_world(2, 4, layout)
    check_nodes(2, 2, layout)


def test_node_mismatch() -> None:
    with pytest.raises(LaunchError, match="2 shared-memory nodes but SLURM_NNODES=1"):
        check_nodes(2, 0, slurm_layout(srun_env(0, 4)))
    with pytest.raises(LaunchError, match="node-local MPI rank 0 != SLURM_LOCALID=1"):
        check_nodes(2, 0, slurm_layout(srun_env(5, 8, nnodes=2)))


def test_malformed_variable() -> None:
    with pytest.raises(LaunchError, match="SLURM_NTASKS='four'"):
        slurm_layout(srun_env(0, 4) | {"SLURM_NTASKS": "four"})


@pytest.mark.mpi
def test_discover_without_slurm() -> None:
    MPI = pytest.importorskip("mpi4py.MPI")
    world = MPI.COMM_WORLD
    info = discover(world, env={})
    # this machine is one node, whatever the world size the suite runs at
    assert info == LaunchInfo(
        rank=world.rank, size=world.size, local_rank=world.rank, local_size=world.size,
        node_id=0, num_nodes=1, job_id=None, under_slurm=False,
    )
    assert discover(MPI.COMM_SELF, env={}).size == 1


@pytest.mark.mpi
def test_discover_checks_the_world_against_slurm() -> None:
    MPI = pytest.importorskip("mpi4py.MPI")
    world = MPI.COMM_WORLD
    info = discover(world, env=srun_env(world.rank, world.size))
    assert info.under_slurm and info.job_id == "4242" and info.size == world.size
    with pytest.raises(LaunchError, match="--mpi=pmi2"):
        discover(MPI.COMM_SELF, env=srun_env(world.rank, world.size + 1))


def test_discover_without_mpi4py_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(ImportError, match=r"cascade-kv\[mpi\]"):
        discover(None, env={})  # type: ignore[arg-type]
