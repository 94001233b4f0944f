"""What ``CascadeStore.flush()`` promises: every completed put is on the device when it
returns, and readable by a later process with no help from the writer (no close).

"On the device" is observed, not counted: after ``posix_fadvise(DONTNEED)`` the kernel
drops a file's clean cached pages but keeps dirty ones (``mincore`` shows which stay), so
a segment with no page left resident had nothing waiting to be written back. A control
file written without fsync shows that this file system keeps dirty pages visible (tmpfs,
for one, does not: the test is skipped there with that reason).
"""
from __future__ import annotations

import ctypes
import json
import mmap
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cascade import CascadeStore, Config

BLOCKS = 300  # tiny blocks of 8 KiB on disk: several 1 MiB segments
_libc = ctypes.CDLL(None, use_errno=True)


def resident_pages(path: Path) -> int:
    """Pages of ``path`` in the page cache after asking the kernel to drop the clean ones."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        size = os.fstat(fd).st_size
        if size == 0:
            return 0
        with mmap.mmap(fd, size, prot=mmap.PROT_READ) as mm:
            view = np.frombuffer(mm, dtype=np.uint8)
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(size), vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {path}")
            del view
            return sum(v & 1 for v in vec)
    finally:
        os.close(fd)


def config(directory: Path) -> Config:
    return Config(model="tiny", shm_bytes=0, file_bytes=64 << 20, file_dir=str(directory),
                  file_segment_bytes=1 << 20, file_fsync=False, file_odirect=False)


def content(spec, seed: int):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(spec.shape).astype(spec.dtype), rng.standard_normal(spec.shape).astype(spec.dtype)


WRITER = f"""
import json, os, signal, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from pathlib import Path
from test_flush_durability import BLOCKS, config, content
from cascade import CascadeStore
store = CascadeStore(config(Path(sys.argv[1])))
ids = [store.put(*content(store.spec, i)) for i in range(BLOCKS)]
store.flush()
print(json.dumps(ids), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no close(): only what flush() did counts
"""


@pytest.mark.skipif(not hasattr(os, "posix_fadvise") or sys.platform != "linux",
                    reason="needs Linux posix_fadvise and mincore to see dirty pages")
def test_flush_puts_every_record_on_the_device_and_a_new_process_reads_them(tmp_path):
    control = tmp_path / "control.bin"
    control.write_bytes(os.urandom(1 << 20))  # written, never synced
    if resident_pages(control) == 0:
        pytest.skip(f"{tmp_path} does not keep dirty pages visible (tmpfs?): cannot tell synced from not")
    files = tmp_path / "agg"
    writer = subprocess.run([sys.executable, "-c", WRITER, str(files)], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert writer.returncode == -9, writer.stderr[-2000:]  # killed right after flush()
    ids = json.loads(writer.stdout)
    segments = sorted(files.glob("*.bin"))
    assert len(segments) >= 2 and sum(p.stat().st_size for p in segments) >= BLOCKS * 8192
    dirty = {p.name: n for p in segments if (n := resident_pages(p))}
    assert dirty == {}, f"pages still waiting for write-back after flush(): {dirty}"
    with CascadeStore(config(files)) as store:  # a later process: the index comes from the records
        assert len(store) == BLOCKS
        wrong = [i for i, bid in enumerate(ids)
                 if not all(np.array_equal(a, b) for a, b in zip(store.get(bid) or (None, None),
                                                                  content(store.spec, i)))]
        assert wrong == []
