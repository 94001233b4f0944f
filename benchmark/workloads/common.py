"""What the comparison workloads share: choosing and starting systems, the machine's
limits per block size, page-aligned buffers, cross-system ratios and target checks.

A system that cannot start here is recorded with its reason (``skipped``); one that
fails while measured is recorded with the error (``failed``); nothing is substituted.
"""
from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..adapters import ADAPTER_NAMES, AdapterUnavailable, StorageAdapter, adapter_class, family, load_adapter
from ..machine import memcpy_gbps, raw_file_gbps

PAGE = 4096
#: Systems (and their variants) whose blocks live in files: the ones a cold (page cache
#: dropped) read means something for.
FILE_BACKED = ("cascade_file", "lmcache_disk", "hdf5")


class OptionError(ValueError):
    """An option a workload cannot run as given; the runner reports it as a usage error."""


def count_option(options: dict[str, Any], name: str, default: int, least: int = 1) -> int:
    """``options[name]`` when given (0 is a value, never replaced by ``default``), else
    ``default``; :class:`OptionError` when it is below ``least``."""
    value = options.get(name)
    if value is None:
        return default
    if int(value) < least:
        raise OptionError(f"{name} must be >= {least}, got {value}")
    return int(value)


def one_size(options: dict[str, Any], default: int, workload: str) -> int:
    """The block size of a workload that runs one: ``options["sizes"]`` (a single size)
    or ``default``; :class:`OptionError` for more than one."""
    sizes = options.get("sizes") or [default]
    if len(sizes) != 1:
        raise OptionError(f"{workload} runs one block size; got {len(sizes)} sizes ({', '.join(map(str, sizes))})")
    return sizes[0]


def file_backed(name: str) -> bool:
    """Whether ``name`` or the peer it is a variant of keeps its blocks in files."""
    return family(name) in FILE_BACKED
#: File-backed, but a DRAM tier in front keeps every block of the run: reads never reach the files.
DRAM_FRONTED = {"lmcache_cpu_disk": "its CPU backend (capacity = the run's capacity) holds every block, "
                                    "so reads are served from DRAM whatever the page cache holds"}


def select(selection: str, allowed: Sequence[str]) -> list[str]:
    """``all`` -> every allowed system in registry order; else a comma list (each checked)."""
    if selection == "all":
        return list(allowed)
    names = [s.strip() for s in selection.split(",") if s.strip()]
    bad = [n for n in names if n not in allowed]
    if bad:
        raise ValueError(f"systems {bad} are not part of this workload; it runs {', '.join(allowed)}")
    return names


def with_eviction() -> list[str]:
    """Registered systems that evict on their own (``has_eviction``), importable or not."""
    out = []
    for name in ADAPTER_NAMES:
        try:
            cls, _ = adapter_class(name)
        except AdapterUnavailable:
            out.append(name)  # cannot tell; it will be skipped with its reason
            continue
        if cls.has_eviction:
            out.append(name)
    return out


@contextlib.contextmanager
def started(name: str, capacity_bytes: int, base_dir: str, *, block_bytes: int | None = None,
            **options: Any) -> Iterator[StorageAdapter]:
    """A started adapter in a fresh directory under ``base_dir``, prepared for blocks of
    ``block_bytes`` when given (:meth:`StorageAdapter.prepare`: set-up that no timed put
    may pay for); closed and removed after. Raises :class:`AdapterUnavailable` when the
    system cannot run here."""
    os.makedirs(base_dir, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix=f"bench_{name}_", dir=base_dir)
    adapter = None
    try:
        adapter = load_adapter(name, **options)
        adapter.initialize(capacity_bytes, workdir)
        if block_bytes is not None:
            adapter.prepare(block_bytes)
        yield adapter
    finally:
        if adapter is not None:
            adapter.close()
        shutil.rmtree(workdir, ignore_errors=True)


def run_system(name: str, fn: Callable[[], list[dict[str, Any]]]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Run ``fn`` (which starts and measures system ``name``); returns (rows, problem):
    ``problem`` is ``{"system", "status": "skipped"|"failed", "reason"}`` or None."""
    try:
        return fn(), None
    except AdapterUnavailable as exc:
        return [], {"system": name, "status": "skipped", "reason": str(exc)}
    except Exception as exc:  # the system under test failed: record it, go on with the others
        return [], {"system": name, "status": "failed", "reason": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc(limit=8)}


def aligned_pair(half: int) -> tuple[np.ndarray, np.ndarray]:
    """Two page-aligned, pre-touched uint8 buffers of ``half`` bytes (the read target)."""
    stride = (half + PAGE - 1) // PAGE * PAGE
    raw = np.frombuffer(mmap.mmap(-1, 2 * stride), dtype=np.uint8)
    raw[:] = 0
    return raw[:half], raw[stride:stride + half]


def machine_limits(block_bytes: int, file_dir: str, total_bytes: int) -> dict[str, Any]:
    """memcpy of one block (rotating over buffers larger than the cache); raw sequential
    write, O_DIRECT read (requests cut as Cascade's file tier cuts them) and cold buffered
    read (page cache evicted, readahead on, one request per block) of ``total_bytes`` on
    ``file_dir``'s file system."""
    os.makedirs(file_dir, exist_ok=True)
    mem = memcpy_gbps(block_bytes)
    raw = raw_file_gbps(file_dir, block_bytes, max(block_bytes, total_bytes))
    return {"memcpy_gbps": mem["gbps"], "memcpy_s_p50": mem["t_p50"], "memcpy_working_set_bytes": mem["working_set_bytes"],
            "streamed_copy_gbps": mem["streamed_gbps"],
            "raw_odirect_read_gbps": raw["read_gbps"], "raw_buffered_cold_read_gbps": raw["buffered_cold_read_gbps"],
            "raw_write_gbps": raw["write_gbps"], "raw_odirect": raw["odirect"], "raw_total_bytes": raw["total_bytes"],
            "raw_odirect_request_bytes": raw["odirect_request_bytes"], "raw_odirect_in_flight": raw["odirect_in_flight"],
            "measured_at": time.strftime("%H:%M:%S")}


def merge_limits(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The limit of a size as the better of the two measurements (start and end of its
    systems), both kept: ratios to the limit are then conservative."""
    keys = ("memcpy_gbps", "raw_odirect_read_gbps", "raw_buffered_cold_read_gbps", "raw_write_gbps")
    out = {k: max(before[k], after[k]) for k in keys}
    out["memcpy_s_p50"] = min(before["memcpy_s_p50"], after["memcpy_s_p50"])
    if before.get("streamed_copy_gbps") and after.get("streamed_copy_gbps"):
        out["streamed_copy_gbps"] = max(before["streamed_copy_gbps"], after["streamed_copy_gbps"])
    for how in ("memcpy_working_set_bytes", "raw_odirect_request_bytes", "raw_odirect_in_flight"):
        if how in before:  # how the limits were measured (the same both times)
            out[how] = before[how]
    # the limit's own noise: ratios to it are only as good as this spread
    out["spread"] = {k: [min(before[k], after[k]), max(before[k], after[k])] for k in (*keys, "memcpy_s_p50")}
    out["before"], out["after"] = before, after
    return out


def add_ratios(rows: list[dict[str, Any]], metric: str, group: Sequence[str], *,
               higher_is_better: bool = True) -> None:
    """Fill ``row["vs_systems"][other]`` for rows that share the ``group`` fields:
    ``metric / other's metric`` (or the inverse when lower is better), so > 1 always
    means this system did better."""
    buckets: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        buckets.setdefault(tuple(row.get(g) for g in group), []).append(row)
    for bucket in buckets.values():
        for row in bucket:
            vs = row.setdefault("vs_systems", {})
            for other in bucket:
                if other is row or not other.get(metric) or not row.get(metric):
                    continue
                a, b = row[metric], other[metric]
                vs[other["system"]] = a / b if higher_is_better else b / a


def add_best_variants(rows: list[dict[str, Any]], metric: str, group: Sequence[str], *,
                      higher_is_better: bool = True) -> dict[str, dict[str, dict[str, str]]]:
    """Pick, among rows that share the ``group`` fields, the best variant of every peer
    (:func:`benchmark.adapters.family`) by ``metric`` measured in this run; mark each row
    with its ``family`` and ``best_variant`` (bool) and give it ``vs_best[family]``: its
    ratio to that family's best variant (> 1: this row did better), for every other family.
    Returns ``{family: {group value(s): winner}}`` (the group values joined by ``/``)."""
    buckets: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        buckets.setdefault(tuple(row.get(g) for g in group), []).append(row)
    chosen: dict[str, dict[str, str]] = {}
    for key, bucket in buckets.items():
        winners: dict[str, dict[str, Any]] = {}
        for row in bucket:
            row["family"] = family(row["system"])
            if not row.get(metric):
                continue
            best = winners.get(row["family"])
            better = best is None or (row[metric] > best[metric] if higher_is_better else row[metric] < best[metric])
            if better:
                winners[row["family"]] = row
        for row in bucket:
            row["best_variant"] = winners.get(row["family"]) is row
            vs = row.setdefault("vs_best", {})
            for fam, win in winners.items():
                if fam != row["family"] and row.get(metric):
                    vs[fam] = row[metric] / win[metric] if higher_is_better else win[metric] / row[metric]
        label = "/".join(str(k) for k in key)
        for fam, win in winners.items():
            chosen.setdefault(fam, {})[label] = win["system"]
    return chosen


def find(rows: list[dict[str, Any]], **fields: Any) -> dict[str, Any] | None:
    return next((r for r in rows if all(r.get(k) == v for k, v in fields.items())), None)


def target(name: str, rows: list[dict[str, Any]], metric: str, system: str, other: str,
           threshold: float, **fields: Any) -> dict[str, Any]:
    """A stated target ``system's metric >= threshold x other's`` checked on this run;
    ``other`` is a peer, taken at its best variant of the run when it has several
    (:func:`add_best_variants`; ``other_variant`` names it)."""
    a = find(rows, system=system, **fields)
    b = find(rows, family=other, best_variant=True, **fields) or find(rows, system=other, **fields)
    out: dict[str, Any] = {"name": name, "system": system, "other": other, "metric": metric,
                           "threshold": threshold, **fields}
    if a is None or b is None or not b.get(metric):
        out.update(value=None, met=None, note="not measured in this run")
        return out
    value = a[metric] / b[metric]
    out.update(value=value, met=value >= threshold, other_variant=b["system"])
    return out


def loadavg() -> list[float]:
    return list(os.getloadavg())


def size_label(nbytes: int) -> str:
    """``2 MiB``, ``256 KiB``: a block size for tables."""
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def format_targets(targets: list[dict[str, Any]]) -> list[str]:
    lines = []
    for t in targets:
        where = f" @ {size_label(t['block_bytes'])}" if "block_bytes" in t else ""
        where += f" ({t['mode']})" if "mode" in t else ""
        value = "n/a" if t["value"] is None else f"{t['value']:.2f}x"
        verdict = {True: "MET", False: "MISSED", None: "not measured"}[t["met"]]
        lines.append(f"target {t['name']}{where}: {value} (>= {t['threshold']}x) {verdict}")
    return lines
