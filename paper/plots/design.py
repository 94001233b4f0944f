"""Macros for the design section: constants and defaults read from the runtime's code.

The design section quotes sizes and limits of the implementation (tokens per block,
record header bytes, directory slots, ...). They are read here from the modules that
define them, so the text cannot drift from the code: if a constant is renamed or
removed, generation fails and names it (then re-read the code and update
``paper/3. Design.tex`` and this table).
"""
from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

from ..core import Context, FigureSpec
from ..macros import integer, size
from ..results import ResultsFile


class DesignDrift(Exception):
    """A constant the design section quotes is no longer where the paper reads it."""


def _attr(module: str, name: str) -> Callable[[], Any]:
    def read() -> Any:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise DesignDrift(f"the design section quotes {module}.{name}, which is gone ({exc}): re-read the "
                              f"code, then update paper/3. Design.tex and paper/plots/design.py") from exc
    return read


def _config_default(key: str) -> Callable[[], Any]:
    def read() -> Any:
        from cascade.config import Config

        return getattr(Config(file_dir="/nonexistent"), key)
    return read


def _default_block_bytes() -> int:
    from .common import default_block_bytes

    return default_block_bytes()


def _preset_kib_per_token(name: str) -> Callable[[], float]:
    def read() -> float:
        from cascade.models import MODEL_PRESETS

        return MODEL_PRESETS[name].bytes_per_token / 1024
    return read


def _min_chunks_per_window() -> int:
    """Fewest chunks a window is cut into (``store.remote_chunk_bytes`` halves the
    chunk until a window holds this many): found by asking the function itself."""
    from cascade.distributed.window_chunks import CHUNK_BYTES
    from cascade.core.factory import remote_chunk_bytes

    return next(n for n in range(1, 1 << 16) if remote_chunk_bytes(n * CHUNK_BYTES) == CHUNK_BYTES)


def _bits(fn: Callable[[], int]) -> Callable[[], int]:
    return lambda: 8 * fn()


def _hex(fn: Callable[[], int]) -> Callable[[], str]:
    return lambda: f"0x{fn():08X}"


def _percent(fn: Callable[[], float]) -> Callable[[], str]:
    return lambda: f"{100 * fn():g}"


# macro -> (reader, formatter, where it lives)
FACTS: dict[str, tuple[Callable[[], Any], Callable[[Any], str], str]] = {
    "DBlockTokens": (_config_default("block_tokens"), integer, "cascade/config.py: Config.block_tokens default"),
    "DDefaultModel": (_config_default("model"), str, "cascade/config.py: Config.model default"),
    "DDefaultBlock": (_default_block_bytes, size, "cascade/models.py: BlockSpec.for_model(default model, tokens)"),
    "DSeventyBKiBPerToken": (_preset_kib_per_token("llama3-70b"), integer,
                             "cascade/models.py: MODEL_PRESETS['llama3-70b'].bytes_per_token / 1024"),
    "DIdHexChars": (_attr("cascade.identity", "ID_HEX_CHARS"), integer, "cascade/identity.py: ID_HEX_CHARS"),
    "DIdBits": (_bits(_attr("cascade.identity", "ID_BYTES")), integer, "cascade/identity.py: 8 * ID_BYTES"),
    "DBlakeThreaded": (_attr("cascade.identity", "_BLAKE3_THREADED_BYTES"), size,
                       "cascade/identity.py: _BLAKE3_THREADED_BYTES"),
    "DOverlapMin": (_attr("cascade.core.writes", "_OVERLAP_MIN_BYTES"), size, "cascade/core/writes.py: _OVERLAP_MIN_BYTES"),
    "DHistoryPerBlock": (_attr("cascade.store", "_HISTORY_PER_BLOCK"), integer,
                         "cascade/store.py: _HISTORY_PER_BLOCK (policy history = this x capacity in blocks)"),
    "DSlabAlign": (_attr("cascade.tiers.slab", "ALIGN"), integer, "cascade/tiers/slab.py: ALIGN"),
    "DShmDefault": (_config_default("shm_bytes"), size, "cascade/config.py: Config.shm_bytes default"),
    "DFileDefault": (_config_default("file_bytes"), size, "cascade/config.py: Config.file_bytes default"),
    "DSegment": (_config_default("file_segment_bytes"), size, "cascade/config.py: Config.file_segment_bytes default"),
    "DRecordHeader": (_attr("cascade.tiers.records", "HEADER_BYTES"), integer, "cascade/tiers/records.py: HEADER_BYTES"),
    "DMaxNamespaceBytes": (_attr("cascade.tiers.records", "MAX_NAMESPACE_BYTES"), integer,
                           "cascade/tiers/records.py: MAX_NAMESPACE_BYTES"),
    "DCompactDeadPct": (_percent(_config_default("compact_dead_fraction")), str,
                        "cascade/config.py: Config.compact_dead_fraction default"),
    "DStripeCount": (_config_default("lustre_stripe_count"), integer,
                     "cascade/config.py: Config.lustre_stripe_count default"),
    "DStripeSize": (_config_default("lustre_stripe_size"), size, "cascade/config.py: Config.lustre_stripe_size default"),
    "DParallelReadMin": (_attr("cascade.tiers.record_io", "PARALLEL_MIN"), size,
                         "cascade/tiers/record_io.py: PARALLEL_MIN (O_DIRECT records this big go as chunks)"),
    "DReadChunk": (_attr("cascade.tiers.record_io", "CHUNK"), size, "cascade/tiers/record_io.py: CHUNK"),
    "DReadersInFlight": (_attr("cascade.tiers.record_io", "READERS"), integer,
                         "cascade/tiers/record_io.py: READERS (reader pool, shared by the process)"),
    "DLustreMagic": (_hex(_attr("cascade.tiers.lustre_fs", "LUSTRE_SUPER_MAGIC")), str,
                     "cascade/tiers/lustre_fs.py: LUSTRE_SUPER_MAGIC"),
    "DRemoteChunk": (_attr("cascade.distributed.window_chunks", "CHUNK_BYTES"), size,
                     "cascade/distributed/window_chunks.py: CHUNK_BYTES"),
    "DMinChunksPerWindow": (_min_chunks_per_window, integer,
                            "cascade/core/factory.py: remote_chunk_bytes (fewest chunks per window, found by calling it)"),
    "DLeaseMaxChunks": (_attr("cascade.distributed.window_chunks", "WORD_BITS"), integer,
                        "cascade/distributed/window_chunks.py: WORD_BITS (one bitmap word per lease)"),
    "DDirectorySlots": (_config_default("directory_slots"), integer, "cascade/config.py: Config.directory_slots default"),
    "DBucketSlots": (_attr("cascade.distributed.layout", "BUCKET_SLOTS"), integer,
                     "cascade/distributed/layout.py: BUCKET_SLOTS"),
    "DEntryWords": (_attr("cascade.distributed.layout", "ENTRY_WORDS"), integer,
                    "cascade/distributed/layout.py: ENTRY_WORDS"),
    "DMaxProbe": (_attr("cascade.distributed.layout", "MAX_PROBE"), integer, "cascade/distributed/layout.py: MAX_PROBE"),
    "DRefsBits": (_attr("cascade.distributed.layout", "REFS_BITS"), integer, "cascade/distributed/layout.py: REFS_BITS"),
    "DChildrenBits": (_attr("cascade.distributed.layout", "CHILDREN_BITS"), integer,
                      "cascade/distributed/layout.py: CHILDREN_BITS"),
    "DVersionBits": (_attr("cascade.distributed.layout", "VERSION_BITS"), integer,
                     "cascade/distributed/layout.py: VERSION_BITS"),
    "DOwnerBytes": (lambda: _owner_bytes(), integer, "cascade/identity.py: id_owner (hex digits read / 2)"),
    "DStallSeconds": (_attr("cascade.distributed.rma", "STALL_SECONDS"), integer,
                      "cascade/distributed/rma.py: STALL_SECONDS"),
    "DLatencyBuckets": (_attr("cascade.histogram", "_BUCKETS"), integer, "cascade/histogram.py: _BUCKETS"),
    "DStatsInterval": (_config_default("stats_interval"), integer, "cascade/config.py: Config.stats_interval default"),
}


def _owner_bytes() -> int:
    """How many leading id bytes pick a block's directory owner: found by probing
    ``identity.id_owner`` with ids that differ in one byte at a time."""
    from cascade.identity import ID_BYTES, id_owner

    base = "00" * ID_BYTES
    size = (1 << 61) - 1  # a prime: any change of the integer read shows up in the remainder
    used = [i for i in range(ID_BYTES) if id_owner(base[: 2 * i] + "01" + base[2 * i + 2:], size) != id_owner(base, size)]
    if used != list(range(len(used))):
        raise DesignDrift(f"id_owner no longer reads a leading run of id bytes (reads bytes {used}): "
                          f"update paper/3. Design.tex")
    return len(used)


def build(ctx: Context) -> list[ResultsFile]:
    for macro, (read, fmt, where) in FACTS.items():
        value = read()
        if isinstance(value, float) and value == int(value):
            value = int(value)
        if isinstance(value, float) and not math.isfinite(value):
            raise DesignDrift(f"{where} is {value}")
        ctx.macros.add(macro, fmt(value) if fmt is not str else str(value), where)
    return []


SPEC = FigureSpec("design", "", "the runtime's code (always available)", build, macros=tuple(FACTS), figure=False)
