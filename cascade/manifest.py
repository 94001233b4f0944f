"""The job-layout manifest of a file-tier directory: which job wrote its files.

``cascade-manifest.json`` beside the aggregated files records the world size and node
count of the last job that opened the directory, and the block layout its records hold
(shape, dtype, tokens per block, model preset). A restart checks the layout before it
reads a record: blocks of another shape, dtype or model are refused with a
:class:`~cascade.errors.ConfigError` naming both layouts, never served. A different world
size is expected (elastic restart: see :mod:`cascade.tiers.adoption`) and only logged.

Rank 0 rewrites the manifest once the store is open on every rank (atomically: a
temporary file renamed over it), so a job cut short while starting leaves the last
complete one. On a full file system (its blocks fill it to the last page) a directory
that already has a manifest keeps it: the open checked its layout, only the world size
and node count it records are then stale (they are only logged).
"""
from __future__ import annotations

import errno
import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

from .errors import ConfigError

log = logging.getLogger(__name__)

NAME = "cascade-manifest.json"
FORMAT = 1


@dataclass(frozen=True)
class Layout:
    """What must match for a restart to read a directory's records."""

    shape: tuple[int, ...]
    dtype: str
    block_tokens: int
    model: str


def read(directory: str) -> dict[str, Any] | None:
    """The manifest in ``directory`` (None when there is none yet). :class:`ConfigError`
    when it cannot be parsed: a damaged manifest is not guessed around."""
    path = os.path.join(directory, NAME)
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (FileNotFoundError, NotADirectoryError):  # no manifest (the directory's own check says why)
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is unreadable ({exc}): remove it only if the files beside it "
                          "hold blocks of this store's layout") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or "layout" not in manifest:
        raise ConfigError(f"{path} is not a Cascade manifest of format {FORMAT}")
    return manifest


def check(directory: str, layout: Layout, world_size: int | None) -> dict[str, Any] | None:
    """Refuse (:class:`ConfigError`) a directory whose manifest names another block
    layout; log a restart at another world size. Returns the manifest (None if absent)."""
    manifest = read(directory)
    if manifest is None:
        return None
    theirs = manifest["layout"]
    mine = asdict(layout) | {"shape": list(layout.shape)}
    if theirs != mine:
        raise ConfigError(
            f"{os.path.join(directory, NAME)}: its blocks were written with layout {theirs}, this store "
            f"uses {mine}; use another file_dir (or the same model, dtype and block_tokens)")
    if world_size is not None and manifest.get("world_size") != world_size:
        log.info("%s was written by a job of %s ranks on %s node(s); this job has %d ranks: "
                 "orphaned ranks' files are adopted", directory, manifest.get("world_size"),
                 manifest.get("nodes"), world_size)
    elif world_size is None and (manifest.get("world_size") or 1) > 1:
        log.warning("%s was written by a job of %s ranks; a store opened without comm serves only "
                    "its own rank's files there (open it with comm= to adopt the others')",
                    directory, manifest.get("world_size"))
    return manifest


def write(directory: str, layout: Layout, *, world_size: int, nodes: int) -> None:
    """Record this job's layout (rank 0 only, once the store is open everywhere)."""
    manifest = {"format": FORMAT, "layout": asdict(layout) | {"shape": list(layout.shape)},
                "world_size": world_size, "nodes": nodes, "written": time.time()}
    path = os.path.join(directory, NAME)
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        if os.path.exists(temporary):
            os.unlink(temporary)
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not os.path.exists(path):
            raise
        log.warning("%s: cannot rewrite it (%s); the one there, of this layout, stays", path, exc.strerror)
        return
    os.replace(temporary, path)
