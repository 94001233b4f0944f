"""This machine's own limits, measured in the same run as the systems they bound.

Every benchmark figure is also reported as a ratio to one of these: memcpy (DRAM copy),
raw O_DIRECT sequential read and buffered write of the file system under test, and (in
multi-rank runs) a raw mpi4py ``Get`` (see ``benchmark.workloads.mpi_micro``).
"""
from __future__ import annotations

import mmap
import os
import platform
import socket
from typing import Any

import numpy as np

from .timing import gbps, summarize, time_calls

PAGE = 4096


def machine_facts() -> dict[str, Any]:
    """Host, CPU count, memory and kernel: the context of every results file."""
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) * 1024
    except OSError:
        pass
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    return {"hostname": socket.gethostname(), "cpus": os.cpu_count(), "cpu_model": cpu,
            "memory_bytes": mem, "kernel": platform.release(), "python": platform.python_version()}


def memcpy_gbps(nbytes: int, repeats: int = 7) -> dict[str, float]:
    """numpy copy between two pre-touched buffers of ``nbytes`` (median GB/s)."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)
    s = summarize(time_calls(lambda: np.copyto(dst, src), repeats))
    return {"gbps": gbps(nbytes, s["median"]), "block_bytes": nbytes, **{f"t_{k}": v for k, v in s.items()}}


def _aligned(nbytes: int) -> mmap.mmap:
    return mmap.mmap(-1, (nbytes + PAGE - 1) // PAGE * PAGE)


def raw_file_gbps(directory: str, block_bytes: int, total_bytes: int, *, odirect: bool = True) -> dict[str, Any]:
    """Write a ``total_bytes`` file in ``block_bytes`` chunks (buffered + fsync), then read
    it back sequentially with O_DIRECT (page cache bypassed). GB/s of both."""
    import time

    total_bytes = max(total_bytes // block_bytes, 1) * block_bytes
    path = os.path.join(directory, f"raw_limit_{os.getpid()}.bin")
    buf = _aligned(block_bytes)
    buf.write(os.urandom(min(block_bytes, 1 << 20)) * (block_bytes // min(block_bytes, 1 << 20)))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        t0 = time.perf_counter()
        for off in range(0, total_bytes, block_bytes):
            os.pwrite(fd, buf, off)
        os.fsync(fd)
        write_s = time.perf_counter() - t0
        flags = os.O_RDONLY | (os.O_DIRECT if odirect else 0)
        try:
            rfd = os.open(path, flags)
        except OSError:
            rfd, odirect = os.open(path, os.O_RDONLY), False
        try:
            t0 = time.perf_counter()
            for off in range(0, total_bytes, block_bytes):
                os.preadv(rfd, [buf], off)
            read_s = time.perf_counter() - t0
        finally:
            os.close(rfd)
    finally:
        os.close(fd)
        os.unlink(path)
        buf.close()
    return {"block_bytes": block_bytes, "total_bytes": total_bytes, "odirect": odirect,
            "write_gbps": gbps(total_bytes, write_s), "read_gbps": gbps(total_bytes, read_s)}
