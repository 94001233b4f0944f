"""Registry of the storage systems the benchmark compares, loaded lazily by name.

Each adapter's module is imported only when that adapter is asked for, so a machine
without torch/LMCache can still run the Redis or HDF5 adapter. Names:

==================  =====================================================================
name                system
==================  =====================================================================
cascade             Cascade itself, SHM (DRAM) tier (``cascade_adapter.py``)
cascade_file        Cascade itself, file (Lustre) tier with O_DIRECT reads
lmcache_cpu         LMCache 0.5.x StorageManager, LocalCPUBackend only
lmcache_disk        LMCache 0.5.x StorageManager, LocalDiskBackend (CPU tier as staging)
lmcache_cpu_disk    LMCache 0.5.x StorageManager, CPU tier in front of the disk tier
redis               Debian ``redis-server`` on 127.0.0.1, redis-py client
hdf5                h5py, one aggregated file per rank
mooncake            Mooncake Store (non-CUDA wheel), ``mooncake_master`` on 127.0.0.1, TCP
pdc                 PDC through its Python bindings (needs a PDC server built with Mercury)
==================  =====================================================================

Usage::

    from benchmark.adapters import load_adapter, AdapterUnavailable
    with load_adapter("redis") as store:
        store.initialize(capacity_bytes=1 << 30, data_dir="/tmp/bench")
        store.put(block_id, key, value)
"""
from __future__ import annotations

import importlib
import inspect
import tempfile
from dataclasses import dataclass, field
from typing import Any

from .base import AdapterUnavailable, StorageAdapter

__all__ = [
    "ADAPTER_NAMES",
    "AdapterUnavailable",
    "StorageAdapter",
    "adapter_class",
    "available_adapters",
    "load_adapter",
]


@dataclass(frozen=True)
class _Entry:
    module: str            # relative to this package
    cls: str | None        # class name; None: the module's StorageAdapter subclass named `name`
    options: dict[str, Any] = field(default_factory=dict)  # fixed constructor options


_REGISTRY: dict[str, _Entry] = {
    "cascade": _Entry(".cascade_adapter", "CascadeAdapter"),
    "cascade_file": _Entry(".cascade_adapter", "CascadeFileAdapter"),
    "lmcache_cpu": _Entry(".lmcache_adapter", "LMCacheCPUAdapter"),
    "lmcache_disk": _Entry(".lmcache_adapter", "LMCacheDiskAdapter"),
    "lmcache_cpu_disk": _Entry(".lmcache_adapter", "LMCacheCPUDiskAdapter"),
    "redis": _Entry(".redis_adapter", "RedisAdapter"),
    "hdf5": _Entry(".hdf5_adapter", "HDF5Adapter"),
    "mooncake": _Entry(".mooncake_adapter", "MooncakeAdapter"),
    "pdc": _Entry(".pdc_adapter", "PDCAdapter"),
}

#: Every registered adapter name, in the order results list them.
ADAPTER_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def adapter_class(name: str) -> tuple[type[StorageAdapter], dict[str, Any]]:
    """The adapter class for ``name`` and the fixed options the name implies.

    Imports the adapter's module (only that one). Raises ``KeyError`` for an unknown
    name and :class:`AdapterUnavailable` when the module cannot be imported.
    """
    try:
        entry = _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown adapter {name!r}; known: {', '.join(ADAPTER_NAMES)}") from None
    try:
        module = importlib.import_module(entry.module, __name__)
    except ImportError as exc:
        raise AdapterUnavailable(f"cannot import {__name__}{entry.module}: {exc}") from exc
    if entry.cls is not None:
        return getattr(module, entry.cls), dict(entry.options)
    for _, obj in inspect.getmembers(module, inspect.isclass):
        if issubclass(obj, StorageAdapter) and obj is not StorageAdapter and obj.name == name:
            return obj, dict(entry.options)
    raise AdapterUnavailable(f"{module.__name__} defines no StorageAdapter named {name!r}")


def load_adapter(name: str, **options: Any) -> StorageAdapter:
    """A new, not yet initialized adapter for ``name``.

    ``options`` go to the adapter's constructor (e.g. ``chunk_tokens`` for LMCache);
    options implied by the name (the LMCache backend mix) cannot be overridden.
    Raises ``KeyError`` (unknown name) or :class:`AdapterUnavailable` (cannot import).
    """
    cls, fixed = adapter_class(name)
    clash = set(fixed) & set(options)
    if clash:
        raise TypeError(f"{name}: options {sorted(clash)} are fixed by the adapter name")
    return cls(**options, **fixed)


def available_adapters(start: bool = False,
                       capacity_bytes: int = 64 << 20) -> list[tuple[str, bool, str]]:
    """``(name, ok, reason)`` for every registered adapter.

    With ``start=False`` (cheap) an adapter is ok when its module imports and its
    class-level ``probe()`` finds what it needs (packages, binaries, libraries).
    With ``start=True`` each adapter is really initialized with ``capacity_bytes`` in a
    temporary directory and closed again, which is the only proof that it runs (it
    starts servers for a moment: seconds, not milliseconds). ``reason`` is ``""`` when ok.
    """
    report: list[tuple[str, bool, str]] = []
    for name in ADAPTER_NAMES:
        try:
            cls, fixed = adapter_class(name)
            probe = getattr(cls, "probe", None)
            reason = probe() if callable(probe) else None
            if reason:
                raise AdapterUnavailable(reason)
            if start:
                adapter = cls(**fixed)
                try:
                    with tempfile.TemporaryDirectory(prefix=f"probe_{name}_") as tmp:
                        adapter.initialize(capacity_bytes, tmp)
                        adapter.close()
                finally:
                    adapter.close()
        except AdapterUnavailable as exc:
            report.append((name, False, str(exc)))
        except Exception as exc:  # a broken install is a reason too, not a crash of the report
            report.append((name, False, f"{type(exc).__name__}: {exc}"))
        else:
            report.append((name, True, ""))
    return report
