"""Warm restart: what a closing store keeps in its persistent tier, and what an opening
store adopts from it.

Both run under the store's lock, at open (before any other call) and at close (after
every operation ended).
"""
from __future__ import annotations

import logging
import time

from ..errors import ConfigError, CorruptBlock, TierFull
from ..policy import BlockMeta
from ..tiers.base import Memory
from .chain import Busy, MoveFailed, TierChain

log = logging.getLogger(__name__)


def adopt_found_blocks(chain: TierChain, *, block_bytes: int, default_ttl: float, what: str) -> None:
    """Enter the blocks the tiers hold at open (persistent tiers' records) in the index,
    unconfirmed until a put of the same bytes: expired ones are deleted, corrupt ones
    (or ones another rank's copy wins over, multi-rank) dropped, and a tier now smaller
    than its contents sheds blocks. :class:`ConfigError` when a tier holds blocks of
    another size than ``block_bytes`` (``what`` names the store's block shape).
    Local, except the multi-rank layer's publishing."""
    now, wall = time.monotonic(), time.time()
    found: list[BlockMeta] = []
    for t, tier in enumerate(chain.tiers):
        keys = list(tier)
        sizes = {tier.length(key) for key in keys}
        if sizes - {block_bytes}:
            raise ConfigError(
                f"{tier.name} tier in {getattr(tier, 'directory', '?')} holds blocks of {sorted(sizes)} bytes "
                f"but this store's blocks are {block_bytes} bytes ({what}): use another file_dir")
        for key in keys:
            expires = tier.expires_of(key)
            if expires and expires <= wall:  # its TTL ran out while no store was open
                del tier[key]
                chain.metrics.counters.expired += 1
                continue
            found.append(BlockMeta(key, tier.length(key), t, parent=tier.parent_of(key),
                                   ttl=expires - wall if expires else default_ttl))
    chain.index.adopt(found, now)
    for meta in found:
        try:
            kept = chain.peers.recovered(meta)
        except CorruptBlock as exc:
            log.warning("%s", exc)
            kept = False
        if not kept:  # corrupt, or another rank's copy won
            chain.drop(meta)
    for t, tier in enumerate(chain.tiers):  # a smaller capacity than last time: shed blocks
        while tier.free < 0 and (victim := chain.index.victim(t)) is not None:
            chain.demote(victim)


def keep_hot_blocks(chain: TierChain) -> None:
    """At close: move the blocks of memory tiers (GPU, SHM) to the persistent tier while
    it has room, without evicting anything, heads of sequences first. The rest are
    lost (as are REMOTE-tier blocks: they live in other ranks' memory)."""
    slow = next((t for t, tier in enumerate(chain.tiers) if tier.persistent), None)
    if slow is None:
        return
    kept = lost = 0
    for meta in sorted(chain.index, key=lambda m: m.depth):
        if chain.tiers[meta.tier].memory not in (Memory.HOST, Memory.DEVICE):
            continue
        try:
            if not chain.tiers[slow].fits(meta.nbytes):
                raise TierFull(f"{chain.tiers[slow].name} tier full")
            chain.run_move(chain.begin_move(meta, slow))
        except (Busy, MoveFailed, OSError):  # TierFull included; Busy: pinned elsewhere
            pass
        if meta.tier == slow and chain.index.holds(meta):
            kept += 1
        else:
            lost += 1
    if kept:
        chain.tiers[slow].sync()
    log.info("close: kept %d hot blocks in the %s tier, %d lost", kept, chain.tiers[slow].name, lost)
