"""Read a record in chunks while hashing: the checksum of chunk k overlaps the read of k+1.

``os.preadv`` releases the GIL, so a one-thread pool reads ahead while the calling thread
verifies (and, through a bounce buffer, copies) the chunk before. A block then costs about
max(read, hash) instead of their sum.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import xxhash

from .records import PAGE, pad


def split_views(views: Sequence[memoryview], chunk: int) -> list[list[memoryview]]:
    """Cut consecutive buffers into runs of ``chunk`` bytes (the last run may be shorter)."""
    runs: list[list[memoryview]] = [[]]
    room = chunk
    for view in views:
        pos = 0
        while pos < view.nbytes:
            take = min(room, view.nbytes - pos)
            runs[-1].append(view[pos:pos + take])
            pos += take
            room -= take
            if room == 0:
                runs.append([])
                room = chunk
    return [r for r in runs if r]


def read_verified(fd: int, offset: int, views: Sequence[memoryview], pool: ThreadPoolExecutor,
                  chunk: int, bounce: memoryview | None = None) -> tuple[bool, int]:
    """Fill ``views`` from ``fd`` at ``offset``; return (complete, XXH3-64 of the bytes).

    Without ``bounce`` the reads land in ``views`` directly (with O_DIRECT they must be
    page-aligned). With ``bounce`` (page-aligned, at least the padded length) each chunk is
    read there, then copied out. ``chunk`` must be a multiple of the page size.
    """
    assert chunk % PAGE == 0
    h = xxhash.xxh3_64()
    length = sum(v.nbytes for v in views)
    runs = split_views(views, chunk)
    targets = runs if bounce is None else [
        [bounce[i * chunk:i * chunk + pad(sum(v.nbytes for v in run))]] for i, run in enumerate(runs)]
    pending = pool.submit(os.preadv, fd, targets[0], offset)
    pos = offset
    for i, run in enumerate(runs):
        got = pending.result()
        want = sum(v.nbytes for v in run)
        if got < want:
            return False, 0
        pos += sum(t.nbytes for t in targets[i])
        if i + 1 < len(runs):
            pending = pool.submit(os.preadv, fd, targets[i + 1], pos)
        if bounce is None:
            for v in run:
                h.update(v)
        else:
            src = targets[i][0]
            h.update(src[:want])
            at = 0
            for v in run:
                v[:] = src[at:at + v.nbytes]
                at += v.nbytes
    return length == sum(sum(v.nbytes for v in run) for run in runs), h.intdigest()
