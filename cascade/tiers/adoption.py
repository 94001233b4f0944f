"""Warm restart at another job size: live ranks adopt the aggregated files of ranks that
no longer exist.

A job restarted on fewer ranks would otherwise never read the files of its missing ranks
(each rank scans only ``agg_rank{rank}``). Old rank ``o`` (``o >= world_size``) is adopted
by rank ``o % world_size``: it opens ``o``'s files as a file tier of their own (taking
``o``'s lock, so a process still writing them is never disturbed, and applying their
tombstones and checks as any warm restart does), copies every live, verified record into
its own files with its parent and expiry, makes them durable, and only then removes
``o``'s files. An adoption cut short leaves both copies; the next start finds the
block already adopted and finishes the job, so nothing is lost or served twice. So does
one that met an I/O error (a record it could not read, :class:`UnreadableBlock`, or a
write that failed, a full disk included, while the tier had room): ``o``'s files are
kept and the next start copies what is still missing. Blocks past their TTL are not
copied (counted as expired); each copy is written with its expiry in the same append.
A block the tier has no room for is dropped (counted in ``adoption_dropped``). A job
that grows needs no adoption: its old ranks keep their files and the new ranks start empty.

Cost: one verified read and one append per adopted block (see the note in docs/scale.md
for the measured rate).
"""
from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import CascadeError, CorruptBlock, UnreadableBlock
from .base import fsync_directory
from .file_tier import FileTier

log = logging.getLogger(__name__)

_RANK_FILE = re.compile(r"^agg_rank(\d{3,})_\d{6,}\.bin$")


@dataclass
class Adoption:
    """What one rank adopted at start (in the file tier's stats: ``adopted``,
    ``adoption_deferred``, ``adoption_dropped``, ``adoption_expired``; corrupt blocks in
    ``corrupt_reads``)."""

    ranks: list[int]
    blocks: int = 0
    bytes: int = 0
    corrupt: int = 0   # failed verification: never copied
    dropped: int = 0   # no room left in this rank's tier: logged, not served
    deferred: int = 0  # an I/O error reading or writing it: the old files are kept for the next start
    expired: int = 0   # past its TTL: not copied
    skipped_ranks: list[int] | None = None  # still locked by a live process


def ranks_with_files(directory: str) -> set[int]:
    """Ranks that have aggregated files in ``directory``."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return set()
    return {int(m.group(1)) for n in names if (m := _RANK_FILE.match(n))}


def orphans_of(rank: int, world_size: int, directory: str) -> list[int]:
    """Old ranks whose files ``rank`` adopts in a job of ``world_size`` ranks (those at or
    beyond ``world_size``, assigned round-robin: old rank ``o`` goes to ``o % world_size``)."""
    return sorted(o for o in ranks_with_files(directory) if o >= world_size and o % world_size == rank)


def adopt_orphans(own: FileTier, world_size: int, open_tier: Callable[[int], FileTier]) -> Adoption:
    """Copy the live blocks of every old rank that ``own.rank`` adopts into ``own``, then
    remove the old rank's files. ``open_tier(o)`` opens old rank ``o``'s files as a
    :class:`FileTier`. Local; costs one verified read and one append per block."""
    report = Adoption(ranks=orphans_of(own.rank, world_size, own.directory), skipped_ranks=[])
    for old_rank in report.ranks:
        try:
            old = open_tier(old_rank)
        except CascadeError as exc:  # e.g. its lock is held: a process still uses those files
            log.warning("not adopting rank %d's files: %s", old_rank, exc)
            report.skipped_ranks.append(old_rank)
            continue
        try:
            deferred = _copy_blocks(old, own, report)
            own.sync()  # durable here before the only other copy goes, the new files' names too
            fsync_directory(own.directory)
            if deferred:
                log.warning("adoption: %d of rank %d's blocks met an I/O error; its files are kept "
                            "and the next start copies them", deferred, old_rank)
            else:
                old.remove_files()
        finally:
            old.close()
        log.info("adopted rank %d's files in %s", old_rank, own.directory)
    if report.dropped:
        log.warning("adoption: %d blocks did not fit in rank %d's file tier and were dropped",
                    report.dropped, own.rank)
    return report


def _copy_blocks(old: FileTier, own: FileTier, report: Adoption) -> int:
    """Copy ``old``'s live blocks that ``own`` lacks, each with its parent and expiry in
    one append; returns how many met an I/O error (counted in ``report.deferred``: still
    in ``old``'s files only)."""
    deferred = 0
    asked, own.expiry_of = own.expiry_of, old.expires_of  # each copy's header carries the old record's expiry
    try:
        for key in list(old):
            if key in own:  # adopted by an earlier start that was cut short
                continue
            expires = old.expires_of(key)
            if 0 < expires <= time.time():
                report.expired += 1
                continue
            if not own.fits(old.length(key)):
                report.dropped += 1
                continue
            buf = np.empty(old.length(key), dtype=np.uint8)
            try:
                old.read_into(key, buf)
                own.put(key, [buf], parent=old.parent_of(key))
            except UnreadableBlock as exc:  # perhaps transient: left for the next start
                log.warning("adoption: %s", exc)
                deferred += 1
                continue
            except CorruptBlock as exc:
                log.warning("adoption: %s", exc)
                report.corrupt += 1
                continue
            except OSError as exc:  # a failed write (TierFull of a full disk included), with room in the tier
                log.warning("adoption: %s", exc)
                deferred += 1
                continue
            report.blocks += 1
            report.bytes += buf.nbytes
    finally:
        own.expiry_of = asked
    report.deferred += deferred
    return deferred
