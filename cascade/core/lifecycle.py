"""Opening and closing a store's layers: joining the other ranks, warm restart (what a
closing store keeps in its persistent tier, and what an opening store adopts from it),
and giving the tiers back.

Multi-rank, both are collective and end in an agreement
(:func:`~cascade.distributed.agree.agree`): every rank learns whether every rank's part
went well, so a failure on one rank raises on all of them instead of leaving them
waiting. Both run under the store's lock, at open before any other call and at close
after every operation ended.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from .. import manifest
from ..config import Config
from ..distributed.agree import PeerStepFailed, agree
from ..distributed.directory import DirectoryFull
from ..distributed.store_layer import Joined, Solo
from ..errors import ConfigError, CorruptBlock, RankFailure, TierFull, UnreadableBlock
from ..policy import BlockMeta
from ..tiers.base import Tier, TierKind
from . import interrupts
from .chain import Busy, MoveFailed, TierChain

log = logging.getLogger(__name__)


def adopt_found_blocks(chain: TierChain, *, block_bytes: int, default_ttl: float, what: str,
                       directory_slots: int) -> None:
    """Enter the blocks the tiers hold at open (persistent tiers' records) in the index,
    unconfirmed until a put of the same bytes: expired ones are deleted, corrupt ones
    (or ones another rank's copy wins over, multi-rank) dropped and counted; multi-rank,
    one whose read for its checksum fails with an I/O error (:class:`UnreadableBlock`)
    is kept as this rank's private copy (not published, counted in ``read_errors``);
    and a tier now smaller
    than its contents sheds blocks; multi-rank, blocks the directory has no slot for
    (``directory_slots`` per rank) are dropped, heads of prefixes kept first. :class:`ConfigError` when a tier holds blocks of
    another size than ``block_bytes`` (``what`` names the store's block shape).
    Local, except the multi-rank layer's publishing."""
    now, wall = time.monotonic(), time.time()
    found: list[BlockMeta] = []
    for t, tier in enumerate(chain.tiers):
        keys = list(tier)
        sizes = {tier.length(key) for key in keys}
        if sizes - {block_bytes}:
            raise ConfigError(
                f"the {tier.name} tier holds blocks of {sorted(sizes)} bytes but this store's blocks are "
                f"{block_bytes} bytes ({what}): use another file_dir")
        for key in keys:
            expires = tier.expires_of(key)
            if expires and expires <= wall:  # its TTL ran out while no store was open
                del tier[key]
                chain.metrics.counters.expired += 1
                continue
            found.append(BlockMeta(key, tier.length(key), t, parent=tier.parent_of(key),
                                   ttl=expires - wall if expires else default_ttl))
    chain.index.adopt(found, now)
    unlisted = 0
    for meta in sorted(found, key=lambda m: m.depth):  # heads first: prefixes survive
        try:
            kept = chain.peers.recovered(meta)
        except UnreadableBlock as exc:  # an I/O error, perhaps passing: kept here, unpublished
            log.warning("%s (kept on this rank, not published)", exc)
            chain.metrics.tiers[meta.tier].read_errors += 1
            kept = True
        except CorruptBlock as exc:
            log.warning("%s", exc)
            chain.metrics.tiers[meta.tier].corruptions += 1
            kept = False
        except DirectoryFull:  # serve what fits: the rest could not be found by other ranks
            unlisted += 1
            kept = False
        if not kept:  # corrupt, no directory slot, or another rank's copy won
            chain.drop(meta)
    if unlisted:
        chain.metrics.counters.dropped_at_restart += unlisted
        log.warning("warm restart: the directory had no slot for %d blocks (directory_slots=%d per rank): "
                    "dropped; raise directory_slots to keep them", unlisted, directory_slots)
    for t, tier in enumerate(chain.tiers):  # a smaller capacity than last time: shed blocks
        while tier.free < 0 and (victim := chain.index.victim(t)) is not None:
            chain.demote(victim)


def keep_hot_blocks(chain: TierChain) -> None:
    """At close: move every block outside the persistent tier (GPU, SHM, and REMOTE:
    those live in other ranks' DRAM, readable until every rank has entered close) to it
    while it has room, without evicting anything, heads of sequences first; count the
    rest as lost."""
    slow = next((t for t, tier in enumerate(chain.tiers) if tier.persistent), None)
    kept = lost = 0
    for meta in sorted(chain.index, key=lambda m: m.depth):
        if meta.tier == slow:
            continue
        if slow is not None:
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
    chain.metrics.counters.kept_at_close += kept
    chain.metrics.counters.lost_at_close += lost
    log.info("close: kept %d blocks of the GPU, SHM and REMOTE tiers in the file tier, %d lost%s",
             kept, lost, "" if slow is not None else " (no file tier)")


def open_layers(chain: TierChain, built: list[Tier], config: Config, *, block_bytes: int, rank: int,
                comm: Any = None, layout: manifest.Layout | None = None) -> None:
    """Join the ranks of ``comm`` (when it has more than one: collective) and adopt the
    blocks the tiers kept; rank 0 then records ``layout`` (the block layout of the
    configured file tier, if any) in the file directory's manifest. Ready, multi-rank,
    only when every rank's republished blocks are visible. On failure every tier in
    ``built`` is given back (windows only where every rank fails too) and the error
    raised."""
    together = comm is not None  # whether every rank takes the same way out if this fails
    interrupts.held()  # Ctrl-C waits for a step that changes a tier and the index to end
    try:
        if comm is not None:
            from ..distributed.cluster import Cluster

            shm = next((t for t in chain.tiers if t.kind is TierKind.SHM), None)
            remote = next((t for t in built if t.kind is TierKind.REMOTE), None)
            cluster = Cluster(comm, shm_path=shm.path if shm is not None else None, file_dir=config.file_dir,
                              shm_buffer=shm.mapping if shm is not None else None,
                              remote=remote, directory_slots=config.directory_slots,
                              mpi_progress=config.mpi_progress)
            chain.peers = Joined(cluster, chain.tiers, rank)
        try:
            adopt_found_blocks(chain, block_bytes=block_bytes, default_ttl=config.default_ttl,
                               what=f"{config.model}, {config.block_tokens} tokens; file_dir {config.file_dir}",
                               directory_slots=config.directory_slots)
            if layout is not None and rank == 0 and any(t.kind is TierKind.FILE for t in chain.tiers):
                manifest.write(config.file_dir, layout, world_size=comm.Get_size() if comm is not None else 1,
                               nodes=chain.peers.cluster.nodes if comm is not None else 1)
        except BaseException:
            if comm is not None:  # the others learn it, and no rank waits for us forever
                together = False
                agree(comm, False, "warm restart")
                together = True
            raise
        if comm is not None:
            # Ready only when every rank's republished blocks are visible: a rank
            # leaving before the others finish republishing misses their blocks.
            together = False
            agree(comm, True, "warm restart")
            try:  # every parent is listed now: count the children (a head whose tail another rank caches stays)
                chain.peers.count_recovered_children()
            except BaseException:
                agree(comm, False, "warm restart: child counts")
                together = True
                raise
            agree(comm, True, "warm restart: child counts")
    except PeerStepFailed:  # the agreement itself completed: every rank is failing
        _abandon(chain, built, collective=True)
        raise
    except BaseException:
        _abandon(chain, built, collective=together)
        raise


def _abandon(chain: TierChain, built: list[Tier], *, collective: bool) -> None:
    """A failed open: release what it took. ``collective``: every rank is here too (it
    failed, or learnt that a rank failed), so windows can be freed."""
    peers, chain.peers = chain.peers, Solo()
    try:
        if collective:
            peers.close(ok=False)
    except PeerStepFailed:
        pass  # we know: this open is failing everywhere
    finally:
        release_tiers(chain, built, collective=collective)


def release_tiers(chain: TierChain, built: list[Tier], *, collective: bool) -> None:
    """Close every tier built (a REMOTE tier's window only when ``collective``: every
    rank is closing too) and forget every block."""
    try:
        for tier in built:
            if collective or not tier.collective:
                tier.close()
        chain.index.clear()
    finally:
        interrupts.released()


def close_layers(chain: TierChain, built: list[Tier], *, keep: bool, write_stats: Callable[[], None],
                 ranks_timeout: float) -> None:
    """Keep hot blocks (with ``keep``), write the last stats, agree with every rank on
    how its close went (collective, waiting up to ``ranks_timeout`` seconds for them),
    then give every tier back. Raises this rank's
    error, or :class:`PeerStepFailed` when another rank's close failed (after every rank
    released its tiers); :class:`RankFailure` when some rank never arrived (its windows
    kept: freeing them would hang)."""
    error: BaseException | None = None
    try:
        if keep and len(chain.index):
            keep_hot_blocks(chain)
        elif len(chain.index):  # close(keep=False): nothing outside the file tier is kept
            chain.metrics.counters.lost_at_close += sum(not chain.tiers[m.tier].persistent for m in chain.index)
        write_stats()
    except BaseException as exc:  # still take part in the collective end below
        error = exc
    # first (collective): every rank learns whether every rank's close went well, no
    # rank reads our slab or windows after this, and the slab window maps the SHM slab
    peers, chain.peers = chain.peers, Solo()
    together = True
    try:
        peers.close(ok=error is None, timeout=ranks_timeout)
    except PeerStepFailed as exc:  # every rank took part: the windows are free
        error = error or exc
    except RankFailure:  # some rank never arrived: freeing MPI windows would hang
        together = False
        raise
    finally:
        release_tiers(chain, built, collective=together)
    if error is not None:
        raise error
