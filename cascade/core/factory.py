"""The tiers a configuration asks for, built fastest first."""
from __future__ import annotations

import logging

from .. import manifest
from ..config import Config
from ..distributed.agree import agree
from ..errors import TierFull
from ..tiers.adoption import adopt_orphans
from ..tiers.base import Tier
from ..tiers.file_tier import FileTier
from ..tiers.gpu import GpuTier, cupy_module
from ..tiers.shm import ShmTier, remove_stale_slabs

log = logging.getLogger(__name__)


def build_tiers(config: Config, *, rank: int = 0, array_module=None, comm=None,
                layout: manifest.Layout | None = None, world_size: int | None = None) -> list[Tier]:
    """The tiers ``config`` asks for, fastest first. Collective when ``comm`` (of more
    than one rank) is given: the ranks agree that every rank opened its local tiers
    (a rank that failed, e.g. because another job holds its file-tier lock, raises its
    own error and every other rank :class:`~cascade.distributed.agree.PeerStepFailed`),
    then the REMOTE tier allocates its MPI window.

    ``layout``: the block layout the file tier's records must have (checked against the
    directory's manifest). ``world_size``: the job's size when known; the file tier then
    adopts the files of ranks at or beyond it (a restart on fewer ranks).

    ``array_module`` forces the GPU tier's array module (numpy in tests); by default the
    GPU tier uses cupy and is off, with a log line, when no GPU is usable.
    """
    fast: list[Tier] = []
    slow: list[Tier] = []
    try:
        if config.gpu_bytes > 0:
            xp = array_module if array_module is not None else cupy_module()
            if xp is not None:
                fast.append(GpuTier(config.gpu_bytes, xp, verify=config.verify_dram_reads))
        for path in remove_stale_slabs(config.shm_dir):  # left by a crashed process of ours
            log.info("removed stale SHM slab %s (its process is gone)", path)
        if config.shm_bytes > 0:
            try:
                fast.append(ShmTier(config.shm_bytes, config.shm_dir, verify=config.verify_dram_reads,
                                    prefault=config.shm_prefault, split_copies=config.split_copies,
                                    stream_copies=config.stream_copies))
            except (TierFull, OSError) as exc:  # a full or missing /dev/shm: run on the other tiers
                log.warning("SHM tier off: %s", exc)
        if config.file_bytes > 0:
            if layout is not None:
                manifest.check(config.file_dir, layout, world_size)
            slow.append(open_file_tier(config, rank))
            if world_size is not None:
                adopted = adopt_orphans(slow[0], world_size, lambda old: open_file_tier(config, old, capacity=1 << 62))
                counters = slow[0].counters
                counters["adopted"], counters["adoption_deferred"] = adopted.blocks, adopted.deferred
                counters["adoption_dropped"], counters["adoption_expired"] = adopted.dropped, adopted.expired
                counters["corrupt_reads"] += adopted.corrupt  # read through the old rank's tier, closed since
        opened = True
    except BaseException:
        opened = False
        for tier in fast + slow:
            tier.close()
        if comm is None:
            raise
        agree(comm, False, "opening the local tiers")
        raise
    if comm is None:
        return fast + slow
    try:
        agree(comm, opened, "opening the local tiers")
        from ..distributed.remote_tier import RemoteTier

        # every rank takes part in the window, even one exposing 0 bytes; always
        # verified: its reads cross ranks (the end-to-end check, like peers' reads). One
        # chunk size for all: the smallest window lent sets it (ranks may lend different sizes)
        lent = [n for n in comm.allgather(config.remote_bytes) if n > 0]
        remote = RemoteTier(comm, config.remote_bytes, chunk_bytes=remote_chunk_bytes(min(lent, default=0)),
                            verify=True)
    except BaseException:
        for tier in fast + slow:
            tier.close()
        raise
    return fast + [remote] + slow


def open_file_tier(config: Config, rank: int, *, capacity: int | None = None) -> FileTier:
    """Rank ``rank``'s file tier as ``config`` sets it up (``capacity`` overrides
    ``file_bytes``: adopting another rank's files reads them whatever their size)."""
    return FileTier(
        config.file_bytes if capacity is None else capacity, config.file_dir, rank=rank,
        segment_bytes=config.file_segment_bytes, odirect=config.file_odirect, read_mode=config.file_read_mode,
        fsync=config.file_fsync, compact_dead_fraction=config.compact_dead_fraction,
        stripe_count=config.lustre_stripe_count, stripe_size=config.lustre_stripe_size,
    )


def remote_chunk_bytes(exposed: int) -> int:
    """Lease unit of the REMOTE tier for windows of ``exposed`` bytes: 16 MiB, smaller for
    small windows (at least 64 chunks per window, so a window is shared fairly among
    writers). Multi-rank, ``exposed`` is the smallest window any rank lends."""
    chunk = 16 << 20
    while chunk > 4096 and exposed // chunk < 64:
        chunk //= 2
    return chunk
