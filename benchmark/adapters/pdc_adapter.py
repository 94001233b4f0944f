"""PDC (Proactive Data Containers) through its Python bindings, PDCpy (module ``pdc``).

PDC is a client/server object store built on the Mercury RPC library. Neither Mercury
nor PDC nor PDCpy is packaged by any registry these machines reach (PyPI's ``pdc`` and
``mercury`` are unrelated projects; Debian has neither), so on them :meth:`initialize`
raises :class:`AdapterUnavailable` with that reason. On a cluster where PDC is built
(``pdc_server`` on PATH, PDCpy importable) the adapter runs for real:

* it starts its own ``pdc_server`` (``pdc_server.exe`` in PDC's build tree) with
  ``PDC_TMPDIR`` under the data directory, waits for its "Server ready" line, then
  ``pdc.init()``; the server is stopped by PID at :meth:`close`. Mercury's transport
  and address come from the environment PDC documents (``HG_TRANSPORT``, ``HG_HOST``);
  the adapter sets ``HG_HOST=127.0.0.1`` unless the caller set it.
* one transient container per adapter; one PDC object per block holding
  ``key bytes || value bytes`` as a 1-D ``INT8`` array (PDC has no untyped bytes; int8
  is the same bytes), written with ``Object.set_data(...).wait()`` and read with
  ``Object.get_data().wait()``.

Copies: put hands PDC a zero-copy int8 view of a joined key+value buffer (one join
copy); get receives a new numpy array from PDC and copies it into the caller's buffers.
PDC has no eviction (``has_eviction`` is False); capacity is enforced by the adapter.

This adapter never stores anything itself: without a PDC server it does not run.
"""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
import time
import uuid

from .base import (AdapterUnavailable, Buffer, StorageAdapter, byte_view, die_with_parent,
                   stop_process, writable_view)

_NO_PDC = (
    "PDC is not installed: its Python bindings (PDCpy, module 'pdc') and 'pdc_server' are "
    "missing. PDC needs the Mercury RPC library, which no package registry reachable "
    "here provides (PyPI's 'pdc' and 'mercury' are unrelated projects; Debian packages "
    "neither). Build Mercury, PDC and PDCpy on the target cluster (third_party/pdc/README.md)."
)
_SERVER_NAMES = ("pdc_server.exe", "pdc_server")
_STARTUP_TIMEOUT_S = 30.0


def _import_pdc():
    """PDCpy's module, or AdapterUnavailable (also for PyPI's unrelated 'pdc')."""
    try:
        import pdc  # PDCpy
    except ImportError as exc:
        raise AdapterUnavailable(_NO_PDC) from exc
    if not all(hasattr(pdc, attr) for attr in ("init", "Container", "Object", "Type")):
        raise AdapterUnavailable(
            f"the importable 'pdc' ({getattr(pdc, '__file__', '?')}) is not PDCpy. " + _NO_PDC)
    return pdc


def _server_binary() -> str | None:
    for name in _SERVER_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


class PDCAdapter(StorageAdapter):
    """Blocks as objects of one transient PDC container. Not thread-safe."""

    name = "pdc"
    has_eviction = False

    def __init__(self, server_binary: str | None = None, container_name: str | None = None,
                 startup_timeout_s: float = _STARTUP_TIMEOUT_S) -> None:
        super().__init__()
        self._binary = server_binary
        self._container_name = container_name or f"cascade_bench_{uuid.uuid4().hex[:8]}"
        self._timeout = float(startup_timeout_s)
        self._pdc = None
        self._proc: subprocess.Popen | None = None
        self._container = None
        self._objects: dict[str, tuple[object, int, int]] = {}
        self._used = 0
        self._workdir = ""

    @staticmethod
    def probe() -> str | None:
        try:
            _import_pdc()
        except AdapterUnavailable as exc:
            return str(exc)
        if _server_binary() is None:
            return ("PDCpy imports but no pdc_server(.exe) is on PATH. " + _NO_PDC)
        return None

    # -- life cycle -------------------------------------------------------------------
    def initialize(self, capacity_bytes: int, data_dir: str) -> None:
        super().initialize(capacity_bytes, data_dir)
        pdc = _import_pdc()
        binary = self._binary or _server_binary()
        if binary is None:
            raise AdapterUnavailable("PDCpy imports but no pdc_server(.exe) is on PATH. " + _NO_PDC)
        self._workdir = os.path.join(self.data_dir, f"pdc_{os.getpid()}_{uuid.uuid4().hex[:8]}")
        os.makedirs(self._workdir, exist_ok=True)
        env = dict(os.environ, PDC_TMPDIR=self._workdir)
        env.setdefault("HG_HOST", "127.0.0.1")
        os.environ.setdefault("HG_HOST", "127.0.0.1")
        os.environ["PDC_TMPDIR"] = self._workdir  # the client finds the server's address here
        try:
            # pdc_server announces readiness on stdout; it keeps its files in PDC_TMPDIR.
            self._proc = subprocess.Popen([binary], cwd=self._workdir, env=env, text=True,
                                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, start_new_session=True,
                                          preexec_fn=die_with_parent)
            self._wait_ready()
            pdc.init()
            self._pdc = pdc
            self._container = pdc.Container(self._container_name,
                                            lifetime=pdc.Container.Lifetime.TRANSIENT)
        except BaseException:
            self.close()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self._timeout
        seen: list[str] = []
        assert self._proc is not None and self._proc.stdout is not None
        os.set_blocking(self._proc.stdout.fileno(), False)
        while time.monotonic() < deadline:
            line = self._proc.stdout.readline()
            if line:
                seen.append(line.rstrip())
                if "Server ready" in line:
                    return
                continue
            if self._proc.poll() is not None:
                break
            time.sleep(0.05)
        tail = "\n".join(seen[-15:])
        raise AdapterUnavailable(f"pdc_server did not report 'Server ready' within "
                                 f"{self._timeout:.0f} s; its output ends with:\n{tail}")

    def close(self) -> None:
        for obj, _, _ in self._objects.values():
            try:
                obj.delete()
            except Exception:
                pass
        self._objects.clear()
        self._used = 0
        if self._container is not None:
            try:
                self._container.delete()
            except Exception:
                pass
            self._container = None
        stop_process(self._proc)
        if self._proc is not None and self._proc.stdout is not None:
            self._proc.stdout.close()
        self._proc = None
        if self._workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = ""

    # -- blocks -----------------------------------------------------------------------
    def put(self, block_id: str, key: Buffer, value: Buffer) -> None:
        import numpy as np
        if block_id in self._objects:
            return
        kv = byte_view(key, "key")
        vv = byte_view(value, "value")
        size = kv.nbytes + vv.nbytes
        if self._used + size > self.capacity_bytes:
            raise OSError(errno.ENOSPC, f"pdc adapter full: {self._used} + {size} bytes "
                                        f"> capacity {self.capacity_bytes}")
        data = np.empty(max(size, 1), dtype=np.int8)
        data[:kv.nbytes] = np.frombuffer(kv, np.int8)
        data[kv.nbytes:size] = np.frombuffer(vv, np.int8)
        pdc = self._pdc
        props = pdc.Object.Properties(dims=(data.size,), type=pdc.Type.INT8)
        obj = self._container.create_object(f"{self._container_name}/{block_id}", props)
        _wait(obj.set_data(data))
        self._objects[block_id] = (obj, kv.nbytes, vv.nbytes)
        self._used += size

    def _read(self, block_id: str):
        entry = self._objects.get(block_id)
        if entry is None:
            return None
        obj, klen, vlen = entry
        import numpy as np
        data = np.asarray(_wait(obj.get_data())).view(np.uint8).reshape(-1)
        return data, klen, vlen

    def get(self, block_id: str) -> tuple[bytes, bytes] | None:
        got = self._read(block_id)
        if got is None:
            return None
        data, klen, vlen = got
        return data[:klen].tobytes(), data[klen:klen + vlen].tobytes()

    def get_into(self, block_id: str, key_out: Buffer, value_out: Buffer) -> bool:
        import numpy as np
        kv = writable_view(key_out, "key_out")
        vv = writable_view(value_out, "value_out")
        entry = self._objects.get(block_id)
        if entry is None:
            return False
        self._check_sizes(block_id, kv, vv, entry[1], entry[2])
        data, klen, vlen = self._read(block_id)
        np.frombuffer(kv, np.uint8)[:] = data[:klen]
        np.frombuffer(vv, np.uint8)[:] = data[klen:klen + vlen]
        return True

    def contains(self, block_id: str) -> bool:
        return block_id in self._objects

    def delete(self, block_id: str) -> None:
        entry = self._objects.pop(block_id, None)
        if entry is not None:
            entry[0].delete()
            self._used -= entry[1] + entry[2]

    def clear(self) -> None:
        for block_id in list(self._objects):
            self.delete(block_id)

    def server_pids(self) -> list[int]:
        return [self._proc.pid] if self._proc is not None else []

    def versions(self) -> dict[str, str]:
        from importlib import metadata
        for dist in ("pdcpy", "PDCpy", "pdc"):
            try:
                return {"pdcpy": metadata.version(dist)}
            except metadata.PackageNotFoundError:
                continue
        return {}


def _wait(request):
    """Complete a PDCpy transfer request (``wait`` in newer PDCpy, ``wait_for_result`` before)."""
    for method in ("wait", "wait_for_result"):
        fn = getattr(request, method, None)
        if callable(fn):
            return fn()
    return getattr(request, "result", None)
