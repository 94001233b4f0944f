"""Shared fixtures: small configs in per-test temp directories."""
from __future__ import annotations

import os
import tempfile
from types import SimpleNamespace

import pytest

from cascade import Config
from cascade.buffers import hostcopy
from cascade.testing import mpich_segments


@pytest.fixture
def tiny_config(tmp_path) -> Config:
    """A store config with the tiny model (4 KiB blocks), 64 blocks of SHM, 256 of file;
    no background demoter (tests count where each block lands; tests/test_background_demotion.py)."""
    return Config(model="tiny", shm_bytes=64 * 4096, file_bytes=256 * 8192,
                  file_dir=str(tmp_path / "files"), file_segment_bytes=1 << 20, demote_high=1.0)


@pytest.fixture
def compiled_hostcopy() -> None:
    """Skips the test where the compiled host copies (cascade.buffers._hostcopy) are not built."""
    if not hostcopy.COMPILED:
        pytest.skip("not built here (test_hostcopy.test_the_compiled_copies_were_built says why)")


@pytest.fixture(params=["compiled", "python"])
def hostcopy_impl(request) -> SimpleNamespace:
    """Both host-copy implementations: ``copy_out``, ``copy_in``, ``copy_out_many`` and
    ``copy_in_many`` of the compiled module (skipped where it is not built) and the Python
    fallbacks (which take ``share`` and ``stream`` and copy on the calling thread, through
    the cache)."""
    names = ("copy_out", "copy_in", "copy_out_many", "copy_in_many")
    if request.param == "compiled":
        request.getfixturevalue("compiled_hostcopy")
        return SimpleNamespace(**{name: getattr(hostcopy, name) for name in names})
    return SimpleNamespace(**{name: getattr(hostcopy, f"{name}_python") for name in names})


@pytest.fixture(scope="session", autouse=True)
def _private_tmpdir(tmp_path_factory):
    """Point TMPDIR (this process's tempfile module and every subprocess, e.g. ``cascade
    run`` and mpiexec ranks) at the session's pytest temp directory, so nothing the suite
    creates - mkdtemp dirs, the default ``$TMPDIR/cascade-<uid>`` file_dir - is left in /tmp."""
    path = str(tmp_path_factory.mktemp("tmpdir"))
    saved_env, saved_tempdir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = path
    tempfile.tempdir = path
    yield path
    tempfile.tempdir = saved_tempdir
    if saved_env is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved_env


@pytest.fixture(scope="session", autouse=True)
def _no_stale_mpich_segments():
    """Remove the MPICH segments that jobs the suite's tests killed left in /dev/shm
    (a few MiB of memory each, until reboot)."""
    before = mpich_segments.segments()
    yield
    mpich_segments.remove_orphans(before)
