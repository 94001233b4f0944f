"""This machine's own limits, measured in the same run as the systems they bound.

Every benchmark figure is also reported as a ratio to one of these: memcpy (DRAM copy),
raw O_DIRECT sequential read and buffered write of the file system under test, the same
with several threads at once (:func:`memcpy_threads`, :func:`raw_read_threads`), and (in
multi-rank runs) a raw mpi4py ``Get`` (see ``benchmark.workloads.mpi_micro``).

Each limit is measured the way Cascade moves the bytes: memcpy at the block size over a
working set larger than the last-level cache (a copy never finds its source or target
cached, as a block fetched from a store does not), and O_DIRECT reads with Cascade's file
tier's request size and requests in flight (:func:`odirect_plan`).
"""
from __future__ import annotations

import mmap
import os
import platform
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
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
            "memory_bytes": mem, "kernel": platform.release(), "python": platform.python_version(),
            **memory_giveback()}


def _read_sys(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def memory_giveback() -> dict[str, Any]:
    """How this (virtual) machine hands memory back on its own, which makes the first use
    of fresh pages (a cold read's page cache) cost more at times: the free page reporting
    order (``page_reporting_order``: free blocks of 2^order pages go back to the host;
    None when the kernel does not report) and the actions of running DAMON schemes
    (``damon_actions``, e.g. ``pageout``: cold pages reclaimed in the background)."""
    actions = []
    root = "/sys/kernel/mm/damon/admin/kdamonds"
    try:
        kdamonds = [d for d in os.listdir(root) if d.isdigit()]
    except OSError:
        kdamonds = []
    for k in kdamonds:
        if _read_sys(f"{root}/{k}/state") != "on":
            continue
        contexts = f"{root}/{k}/contexts"
        for c in (d for d in os.listdir(contexts) if d.isdigit()):
            schemes = f"{contexts}/{c}/schemes"
            actions += [a for d in os.listdir(schemes) if d.isdigit() and (a := _read_sys(f"{schemes}/{d}/action"))]
    order = _read_sys("/sys/module/page_reporting/parameters/page_reporting_order")
    return {"page_reporting_order": int(order) if order and order.isdigit() else None, "damon_actions": actions}


def llc_bytes() -> int:
    """Size of the largest CPU cache (sysfs; 64 MiB when unknown)."""
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in os.listdir(base):
            try:
                with open(os.path.join(base, entry, "size")) as f:
                    text = f.read().strip()
            except OSError:
                continue
            units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
            best = max(best, int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
    except (OSError, ValueError):
        pass
    return best or 64 << 20


def working_set(nbytes: int) -> int:
    """How many ``nbytes`` buffers a copy rotates through so that none is cached when it
    comes round again: at least two, and at least twice the last-level cache per side."""
    return max(2, -(-2 * llc_bytes() // max(nbytes, 1)))


def memcpy_gbps(nbytes: int, repeats: int = 7) -> dict[str, float | None]:
    """numpy copies of ``nbytes`` (median GB/s), each from and to the next of
    :func:`working_set` pre-touched source and target buffers, so neither is cache-resident
    (one buffer copied again and again would be served from the cache below ~LLC size).
    ``streamed_gbps``: the same copies with non-temporal stores (Cascade's compiled
    ``hostcopy`` with ``stream``; None where it is not built), the faster way to memory
    where glibc's memcpy does not stream (this project's VM: see ``Config.stream_copies``)."""
    n = working_set(nbytes)
    src = np.ones(n * nbytes, dtype=np.uint8)
    dst = np.zeros(n * nbytes, dtype=np.uint8)
    calls = max(repeats, n)
    s = summarize(time_calls(_rotating(np.copyto, src, dst, nbytes, n), calls))
    return {"gbps": gbps(nbytes, s["median"]), "block_bytes": nbytes, "working_set_bytes": 2 * n * nbytes,
            "llc_bytes": llc_bytes(), **{f"t_{k}": v for k, v in s.items()},
            "streamed_gbps": _streamed_gbps(src, dst, nbytes, n, calls)}


def _rotating(copy: Callable[[Any, Any], Any], src: np.ndarray, dst: np.ndarray, nbytes: int,
              n: int) -> Callable[[], None]:
    """A call of ``copy(target, source)`` from and to the next of ``n`` slots of
    ``nbytes`` in ``src`` and ``dst``, after one untimed pass over them all (every page mapped)."""
    slot = iter(range(1 << 62))

    def one() -> None:
        lo = (next(slot) % n) * nbytes
        copy(dst[lo:lo + nbytes], src[lo:lo + nbytes])

    for _ in range(n):
        one()
    return one


def _streamed_gbps(src: np.ndarray, dst: np.ndarray, nbytes: int, n: int, calls: int) -> float | None:
    """:func:`memcpy_gbps`'s copies, streamed (median GB/s; None without the compiled copies)."""
    from cascade.buffers import hostcopy

    if not hostcopy.COMPILED:
        return None

    def streamed(target: np.ndarray, source: np.ndarray) -> None:
        hostcopy.copy_in(target.data, 0, nbytes, [source], False, True)

    return gbps(nbytes, summarize(time_calls(_rotating(streamed, src, dst, nbytes, n), calls))["median"])


def odirect_plan(block_bytes: int) -> tuple[int, int]:
    """(bytes per request, requests in flight) of an O_DIRECT read of one ``block_bytes``
    record by Cascade's file tier (``cascade/tiers/record_io.py``: records of 8 MiB and
    more as 1 MiB requests, up to 8 in flight, from one process-wide pool; smaller ones
    as one request). The raw O_DIRECT limits read the same way."""
    from cascade.tiers import record_io

    if block_bytes >= record_io.PARALLEL_MIN and record_io.READERS >= 2:
        return record_io.CHUNK, record_io.READERS
    return block_bytes, 1


class _Reader:
    """``preadv`` of a buffer at an offset as :func:`odirect_plan` cuts it: requests of
    ``request`` bytes, ``in_flight`` at once from one pool shared by every caller."""

    def __init__(self, fd: int, request: int, in_flight: int) -> None:
        self.fd, self.request = fd, request
        self.pool = ThreadPoolExecutor(in_flight, thread_name_prefix="raw-read") if in_flight > 1 else None

    def read(self, views: Sequence[Any], offset: int) -> int:
        if self.pool is None:
            return os.preadv(self.fd, list(views), offset)
        futures = []
        for view in views:
            view = memoryview(view).cast("B")
            for lo in range(0, view.nbytes, self.request):
                futures.append(self.pool.submit(os.preadv, self.fd, [view[lo:lo + self.request]], offset + lo))
            offset += view.nbytes
        return sum(f.result() for f in futures)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)


def _aligned(nbytes: int) -> mmap.mmap:
    return mmap.mmap(-1, (nbytes + PAGE - 1) // PAGE * PAGE)


def raw_file_gbps(directory: str, block_bytes: int, total_bytes: int, *, odirect: bool = True) -> dict[str, Any]:
    """Write a ``total_bytes`` file in ``block_bytes`` chunks (buffered + fsync), then read
    it back sequentially with O_DIRECT (page cache bypassed; each block cut into requests
    as Cascade's file tier cuts a record, :func:`odirect_plan`), then buffered, one
    ``preadv`` per block, after evicting it from the page cache (``posix_fadvise(DONTNEED)``;
    kernel readahead on). GB/s of each."""
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
        request, in_flight = odirect_plan(block_bytes) if odirect else (block_bytes, 1)
        reader = _Reader(rfd, request, in_flight)
        try:
            t0 = time.perf_counter()
            for off in range(0, total_bytes, block_bytes):
                reader.read([buf], off)
            read_s = time.perf_counter() - t0
        finally:
            reader.close()
            os.close(rfd)
        # the same file read through the page cache after evicting it (kernel readahead on)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        t0 = time.perf_counter()
        for off in range(0, total_bytes, block_bytes):
            os.preadv(fd, [buf], off)
        buffered_s = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(path)
        buf.close()
    return {"block_bytes": block_bytes, "total_bytes": total_bytes, "odirect": odirect,
            "odirect_request_bytes": request, "odirect_in_flight": in_flight,
            "write_gbps": gbps(total_bytes, write_s), "read_gbps": gbps(total_bytes, read_s),
            "buffered_cold_read_gbps": gbps(total_bytes, buffered_s)}


# -- several threads at once -----------------------------------------------------------
def shares(n: int, parts: int) -> list[range]:
    """``range(n)`` cut into ``parts`` contiguous shares whose sizes differ by at most one."""
    q, r = divmod(n, parts)
    bounds = [i * q + min(i, r) for i in range(parts + 1)]
    return [range(bounds[i], bounds[i + 1]) for i in range(parts)]


def run_threads(fns: Sequence[Callable[[], Any]]) -> tuple[float, list[Any]]:
    """Run each of ``fns`` on its own thread, all released at once by a barrier; returns
    (wall seconds from the release to the last thread's end, their results in order).
    The first exception of a thread is raised here, after all have ended."""
    gate = threading.Barrier(len(fns) + 1)
    results: list[Any] = [None] * len(fns)
    errors: list[BaseException] = []

    def body(i: int) -> None:
        gate.wait()
        try:
            results[i] = fns[i]()
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(len(fns))]
    for t in threads:
        t.start()
    gate.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return wall, results


def memcpy_threads(pairs: Sequence[tuple[np.ndarray, np.ndarray]], threads: int) -> dict[str, Any]:
    """``threads`` threads copy their contiguous share of ``(src, dst)`` pairs at once
    (numpy's copy releases the GIL), after one untimed pass: the DRAM ceiling of N
    readers. GB/s = bytes / wall time."""
    def copy(share: range) -> None:
        for j in share:
            np.copyto(pairs[j][1], pairs[j][0])

    jobs = [partial(copy, s) for s in shares(len(pairs), threads)]
    run_threads(jobs)
    wall, _ = run_threads(jobs)
    nbytes = sum(src.nbytes for src, _ in pairs)
    return {"threads": threads, "bytes": nbytes, "seconds": wall, "gbps": gbps(nbytes, wall)}


def write_file(path: str, parts: Iterable[Any]) -> int:
    """Write ``parts`` back to back (buffered), then fsync; returns the bytes written."""
    total = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for part in parts:
            total += os.pwrite(fd, part, total)
        os.fsync(fd)
    finally:
        os.close(fd)
    return total


def raw_read_threads(path: str, outs: Sequence[Sequence[Any]], threads: int, how: str) -> dict[str, Any]:
    """``threads`` threads ``preadv`` their contiguous share of a file's blocks at once:
    block ``j`` (at ``j`` x its size) into the buffers ``outs[j]`` (page-aligned for
    O_DIRECT). ``how``: ``odirect`` (page cache bypassed, blocks cut into requests as
    Cascade's file tier cuts them, :func:`odirect_plan`, from one pool shared by the
    threads; buffered if the file system refuses O_DIRECT, then ``odirect`` is False),
    ``buffered_cold`` (the file evicted
    first by :func:`drop_page_cache`; kernel readahead on) or ``buffered_hot`` (after an
    untimed pass). GB/s = bytes / wall time."""
    block = sum(memoryview(b).nbytes for b in outs[0])
    odirect = how == "odirect"
    try:
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if odirect else 0))
    except OSError:
        if not odirect:
            raise
        fd, odirect = os.open(path, os.O_RDONLY), False
    request, in_flight = odirect_plan(block) if odirect else (block, 1)
    reader = _Reader(fd, request, in_flight)

    def read(share: range) -> None:
        for j in share:
            if reader.read(outs[j], j * block) != block:
                raise OSError(f"{path}: short read of block {j}")

    jobs = [partial(read, s) for s in shares(len(outs), threads)]
    out: dict[str, Any] = {"how": how, "threads": threads, "odirect": odirect,
                           "request_bytes": request, "requests_in_flight": in_flight}
    try:
        if how == "buffered_cold":
            out["page_cache"] = drop_page_cache([path])
        elif how == "buffered_hot":
            run_threads(jobs)
        wall, _ = run_threads(jobs)
    finally:
        reader.close()
        os.close(fd)
    nbytes = block * len(outs)
    out.update(bytes=nbytes, seconds=wall, gbps=gbps(nbytes, wall))
    return out


# -- page cache ------------------------------------------------------------------------
def _libc():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    return libc


def resident_bytes(paths: list[str]) -> tuple[int, int]:
    """(bytes of ``paths`` in the page cache, total bytes), by ``mincore`` on a read-only map."""
    import ctypes

    libc = _libc()
    resident = total = 0
    for path in paths:
        size = os.path.getsize(path)
        if size == 0:
            continue
        total += size
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                continue
            try:
                vec = ctypes.create_string_buffer((size + PAGE - 1) // PAGE)
                if libc.mincore(addr, size, vec) == 0:
                    resident += sum(b & 1 for b in vec.raw) * PAGE
            finally:
                libc.munmap(addr, size)
        finally:
            os.close(fd)
    return min(resident, total), total


def files_under(directory: str) -> list[str]:
    """Every regular file below ``directory``."""
    out = []
    for root, _, names in os.walk(directory):
        out.extend(p for n in names if os.path.isfile(p := os.path.join(root, n)))
    return out


def settle_reads(paths: list[str]) -> None:
    """Read ``paths`` through once, buffered and untimed: done before the drop that
    precedes a cold pass, it leaves every pass the same state below the page cache
    (on this VM a cold pass right after a buffered read of its files ran faster than
    one after anything else, and the first read of freshly written bytes slower still:
    benchmark/workloads/file_read_mode.py)."""
    buf = memoryview(bytearray(8 << 20))
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            offset = 0
            while n := os.preadv(fd, [buf], offset):
                offset += n
        finally:
            os.close(fd)


def drop_page_cache(paths: list[str]) -> dict[str, Any]:
    """Evict ``paths`` from the page cache: ``sync``, then ``posix_fadvise(DONTNEED)`` on each
    file; if pages stay resident and we are root, ``echo 1 > /proc/sys/vm/drop_caches``.
    Returns how (``method``) and the resident fraction before and after (``mincore``)."""
    before, total = resident_bytes(paths)
    os.sync()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    method = f"sync + posix_fadvise(POSIX_FADV_DONTNEED) on {len(paths)} files ({total} bytes)"
    after, _ = resident_bytes(paths)
    if after > 0.01 * total and os.geteuid() == 0:
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("1\n")
            method += " + echo 1 > /proc/sys/vm/drop_caches"
            after, _ = resident_bytes(paths)
        except OSError as exc:
            method += f" (drop_caches refused: {exc.strerror})"
    return {"method": method, "files": len(paths), "bytes": total,
            "resident_fraction_before": before / total if total else 0.0,
            "resident_fraction_after": after / total if total else 0.0}


# -- MPI -------------------------------------------------------------------------------
def mpiexec_command(ranks: int, module: str, *args: str) -> list[str]:
    """``mpiexec -n R python -m mpi4py -m module args`` with this interpreter (a failing
    rank aborts the world instead of hanging it)."""
    import shutil
    import sys

    exe = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec") or "mpiexec"
    return [exe, "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", module, *args]


def mpi_get_limits(comm, sizes: list[int], repeats: int = 20) -> dict[str, Any]:
    """Collective. Raw mpi4py ``Get`` + ``Flush`` (``Lock_all`` held, ``Win.Allocate``):
    rank 0 from rank 1 alone (``pair``), then every rank from rank ``r+1`` at once
    (``aggregate``: bytes moved by all ranks / slowest rank's time). Median of repeats."""
    from mpi4py import MPI

    rank, size = comm.Get_rank(), comm.Get_size()
    if size < 2:
        return {"skipped": "needs 2 ranks"}
    top = max(sizes)
    win = MPI.Win.Allocate(top, 1, comm=comm)
    win.Lock_all()
    rows = []
    try:
        out = _aligned(top)
        buf = np.frombuffer(out, dtype=np.uint8)
        for nbytes in sizes:
            n = max(5, min(repeats, (1 << 30) // nbytes))
            pair = []
            comm.Barrier()
            if rank == 0:
                for i in range(n + 1):
                    t0 = time.perf_counter()
                    win.Get([buf[:nbytes], MPI.BYTE], 1, (0, nbytes, MPI.BYTE))
                    win.Flush(1)
                    if i:
                        pair.append(time.perf_counter() - t0)
            _idle_barrier(comm)
            agg = []
            target = (rank + 1) % size
            for i in range(n + 1):
                comm.Barrier()
                t0 = time.perf_counter()
                win.Get([buf[:nbytes], MPI.BYTE], target, (0, nbytes, MPI.BYTE))
                win.Flush(target)
                slowest = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
                if i:
                    agg.append(slowest)
            row = {"block_bytes": nbytes, "repeats": n,
                   "aggregate_gbps": gbps(nbytes * size, summarize(agg)["median"])}
            row = comm.bcast({**row, "pair_gbps": gbps(nbytes, summarize(pair)["median"])} if rank == 0 else None, root=0)
            rows.append(row)
        del buf
    finally:
        win.Unlock_all()
        win.Free()
    return {"ranks": size, "rows": rows}


def memcpy_aggregate(comm, nbytes: int, repeats: int = 7, min_seconds: float = 0.05) -> dict[str, Any]:
    """Collective. Every rank copies ``nbytes`` ``copies`` times at once; aggregate GB/s =
    bytes copied by all ranks / wall time of the whole run (first start to last end on
    the node's monotonic clock; across nodes the slowest rank's time), median of
    ``repeats`` runs. Ranks that outnumber the cores share them, and wall time shows it
    (a rank's own time would not). Each rank rotates through :func:`working_set` buffers,
    so no copy finds its bytes cached. The DRAM ceiling of N ranks."""
    from mpi4py import MPI

    n = working_set(nbytes)
    srcs = np.ones(n * nbytes, dtype=np.uint8)
    dsts = np.zeros(n * nbytes, dtype=np.uint8)
    for k in range(n):  # map every page, untimed
        np.copyto(dsts[k * nbytes:(k + 1) * nbytes], srcs[k * nbytes:(k + 1) * nbytes])
    pairs = [(srcs[k * nbytes:(k + 1) * nbytes], dsts[k * nbytes:(k + 1) * nbytes]) for k in range(n)]
    t0 = time.perf_counter()
    np.copyto(pairs[0][1], pairs[0][0])
    one = max(time.perf_counter() - t0, 1e-7)
    copies = comm.allreduce(max(1, int(min_seconds / one)), op=MPI.MAX)  # every run >= ~min_seconds
    one_node = len(set(comm.allgather(os.uname().nodename))) == 1
    walls = []
    for i in range(repeats + 1):
        _idle_barrier(comm)
        t0 = time.perf_counter()
        for c in range(copies):
            src, dst = pairs[c % n]
            np.copyto(dst, src)
        t1 = time.perf_counter()
        if one_node:
            wall = comm.allreduce(t1, op=MPI.MAX) - comm.allreduce(t0, op=MPI.MIN)
        else:
            wall = comm.allreduce(t1 - t0, op=MPI.MAX)
        if i:
            walls.append(wall)
    return {"block_bytes": nbytes, "ranks": comm.Get_size(), "copies_per_rank": copies, "method": "bytes / wall time",
            "working_set_bytes": 2 * n * nbytes,
            "aggregate_gbps": gbps(nbytes * copies * comm.Get_size(), summarize(walls)["median"])}


def _idle_barrier(comm) -> None:
    """A barrier that sleeps instead of spinning (ranks may outnumber cores)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(1e-3)


def mpi_limits_via_mpiexec(ranks: int, sizes: list[int], timeout: float = 300.0) -> dict[str, Any]:
    """Run :func:`mpi_get_limits` and :func:`memcpy_aggregate` under ``mpiexec -n ranks``
    from a single-process benchmark; returns their result or ``{"skipped": reason}``."""
    import json
    import subprocess

    if ranks < 2:
        return {"skipped": "one rank: no MPI transfer to bound"}
    cmd = mpiexec_command(ranks, "benchmark.machine", "mpi-limits", ",".join(map(str, sizes)))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"skipped": f"{' '.join(cmd)}: {exc}"}
    if proc.returncode != 0:
        return {"skipped": f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr[-500:]}"}
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    doc["command"] = cmd
    return doc


def _mpi_limits_main(sizes: list[int]) -> None:
    import json

    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    result = {"mpi_get": mpi_get_limits(comm, sizes),
              "memcpy_aggregate": [memcpy_aggregate(comm, s) for s in sizes]}
    if comm.Get_rank() == 0:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    import sys

    if len(sys.argv) >= 3 and sys.argv[1] == "mpi-limits":
        _mpi_limits_main([int(s) for s in sys.argv[2].split(",")])
    else:
        print("usage: mpiexec -n N python -m mpi4py -m benchmark.machine mpi-limits SIZE[,SIZE...]", file=sys.stderr)
        sys.exit(2)
