"""Registry of the storage systems the benchmark compares, loaded lazily by name.

Each adapter's module is imported only when that adapter is asked for, so a machine
without torch/LMCache can still run the Redis or HDF5 adapter. Names:

==================  =====================================================================
name                system
==================  =====================================================================
cascade             Cascade itself, SHM (DRAM) tier (``cascade_adapter.py``)
cascade_file        Cascade itself, file (Lustre) tier (``file_read_mode="auto"``: O_DIRECT
                    on Lustre, page cache elsewhere)
lmcache_cpu         LMCache 0.5.x StorageManager, LocalCPUBackend only
lmcache_disk        LMCache 0.5.x StorageManager, LocalDiskBackend (CPU tier as staging)
lmcache_disk_odirect  the same with LMCache's ``use_odirect`` (O_DIRECT file reads/writes)
lmcache_cpu_disk    LMCache 0.5.x StorageManager, CPU tier in front of the disk tier
redis               Debian ``redis-server`` on 127.0.0.1, redis-py client over TCP loopback
redis_unix          the same server and client over a Unix socket
hdf5                h5py, one aggregated file per rank, 64 MiB chunk cache
hdf5_nocache        the same without HDF5's chunk cache (``rdcc_nbytes=0``)
mooncake            Mooncake Store (non-CUDA wheel), ``mooncake_master`` on 127.0.0.1, TCP
pdc                 PDC through its Python bindings (needs a PDC server built with Mercury)
==================  =====================================================================

Variants: a peer's documented settings that the comparison tries side by side (transport,
caches, O_DIRECT) are registered as names of one *family* (:func:`family`): every variant
runs as its own row, and each workload names the best variant of every family it ran
(:func:`variant_note` says what a variant changes).

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
    "default_variants",
    "family",
    "load_adapter",
    "variant_note",
]


@dataclass(frozen=True)
class _Entry:
    module: str            # relative to this package
    cls: str | None        # class name; None: the module's StorageAdapter subclass named `name`
    options: dict[str, Any] = field(default_factory=dict)  # fixed constructor options
    family: str = ""       # the peer this is a variant of ("" = its own name)
    note: str = ""         # what this variant sets, for results and the paper


_REGISTRY: dict[str, _Entry] = {
    "cascade": _Entry(".cascade_adapter", "CascadeAdapter"),
    "cascade_file": _Entry(".cascade_adapter", "CascadeFileAdapter"),
    "lmcache_cpu": _Entry(".lmcache_adapter", "LMCacheCPUAdapter"),
    "lmcache_disk": _Entry(".lmcache_adapter", "LMCacheDiskAdapter", note="buffered file I/O"),
    "lmcache_disk_odirect": _Entry(".lmcache_adapter", "LMCacheDiskAdapter", {"use_odirect": True},
                                   family="lmcache_disk", note="use_odirect (O_DIRECT file I/O)"),
    "lmcache_cpu_disk": _Entry(".lmcache_adapter", "LMCacheCPUDiskAdapter"),
    "redis": _Entry(".redis_adapter", "RedisAdapter", note="TCP loopback"),
    "redis_unix": _Entry(".redis_adapter", "RedisAdapter", {"unix_socket": True}, family="redis",
                         note="Unix socket"),
    "hdf5": _Entry(".hdf5_adapter", "HDF5Adapter", note="64 MiB chunk cache"),
    "hdf5_nocache": _Entry(".hdf5_adapter", "HDF5Adapter", {"rdcc_nbytes": 0}, family="hdf5",
                           note="no chunk cache (rdcc_nbytes=0)"),
    "mooncake": _Entry(".mooncake_adapter", "MooncakeAdapter"),
    "pdc": _Entry(".pdc_adapter", "PDCAdapter"),
}

#: Every registered adapter name, in the order results list them.
ADAPTER_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def family(name: str) -> str:
    """The peer ``name`` is a variant of (``redis_unix`` -> ``redis``); itself otherwise,
    also for names outside the registry (``cascade_lru``)."""
    entry = _REGISTRY.get(name)
    return (entry.family or name) if entry else name


def variant_note(name: str) -> str:
    """What the variant ``name`` sets (``"Unix socket"``), ``""`` when nothing is noted."""
    entry = _REGISTRY.get(name)
    return entry.note if entry else ""


def default_variants(names: list[str] | tuple[str, ...]) -> list[str]:
    """``names`` without the non-default variants (those whose family is another name):
    for workloads whose figure a variant cannot change (hit ratios)."""
    return [n for n in names if family(n) == n]


def adapter_class(name: str) -> tuple[type[StorageAdapter], dict[str, Any]]:
    """The adapter class for ``name`` and the fixed options the name implies (a variant's
    settings).

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
    options implied by the name (a variant's settings) cannot be overridden.
    Raises ``KeyError`` (unknown name) or :class:`AdapterUnavailable` (cannot import).
    """
    cls, fixed = adapter_class(name)
    clash = set(fixed) & set(options)
    if clash:
        raise TypeError(f"{name}: options {sorted(clash)} are fixed by the adapter name")
    adapter = cls(**options, **fixed)
    adapter.name = name  # a variant reports its own name (the class is its family's)
    return adapter


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
