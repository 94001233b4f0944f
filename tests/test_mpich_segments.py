"""remove_orphans: only new MPICH segments that no live process uses are removed."""
from __future__ import annotations

import mmap
import os
import uuid

import pytest

from cascade.testing import mpich_segments


def _segment() -> str:
    path = f"/dev/shm/mpich_shm_test{uuid.uuid4().hex[:8]}_0"
    with open(path, "wb") as f:
        f.write(b"\0" * 4096)
    return path


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_new_unused_segments_go_and_used_or_older_ones_stay():
    older = _segment()
    before = mpich_segments.segments()
    orphan, held, mapped = _segment(), _segment(), _segment()
    fd = os.open(held, os.O_RDONLY)
    with open(mapped, "r+b") as f:
        view = mmap.mmap(f.fileno(), 4096)  # mapped after its file is closed, as MPICH's ranks keep it
    try:
        assert mpich_segments.remove_orphans(before, wait_s=0.2) == [orphan]
        assert not os.path.exists(orphan)
        assert all(os.path.exists(p) for p in (older, held, mapped))
    finally:
        view.close()
        os.close(fd)
        for path in (older, held, mapped):
            if os.path.exists(path):
                os.unlink(path)
