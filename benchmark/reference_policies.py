"""Reference hit ratios of pure-Python block caches: LRU, the offline optimum (Belady) and
a lookahead oracle that sees only the next ``depth`` requests (what a scheduler's queue shows).

Replay semantics (they reproduce every figure quoted for the shared trace, see below):

1. Requests are replayed in order (trace file order; the trace is sorted by timestamp),
   and within a request its hash ids in order. Every id is one reference.
2. A reference hits when its block is cached at that moment, whether or not the request's
   earlier blocks hit (in the shared trace cached ids are always a leading prefix, so
   counting only a request's leading run of hits gives the same numbers).
3. Right after the reference the block is cached: one reference at a time, not one request
   at a time, so a long request may evict its own first blocks. LRU makes it the most
   recent block; Belady (demand paging, no bypass) inserts it too. When the cache then
   holds more than ``capacity`` blocks, LRU drops the least recently referenced one and
   Belady the one, other than the block just referenced, whose next reference is furthest
   in the future (never-again first). ``capacity=None`` is unbounded. The lookahead oracle
   at depth ``k`` sees the references of the request being served and of the next ``k``
   requests (none at ``k = 0``, as the replay's queue: :mod:`cascade.replay`); it drops,
   other than the block just referenced, the least recently referenced block that the
   window does not reference, and when the window references every cached block, the one
   the window references last (Belady within the window). At ``k = 0`` it is LRU.
4. Block hit ratio = hits / references. Token hit ratio = tokens of the hit blocks / tokens
   of all referenced blocks, a block holding ``tokens_per_block`` tokens except a request's
   last, which holds the remainder of ``input_length``.

On ``../shared/data/conversation_trace.jsonl`` (288,500 references, 182,790 distinct ids)
this gives block hit ratios, exactly (hits in brackets):

=========  ==================  ==================
capacity   LRU                 Belady
=========  ==================  ==================
1,000      4.4475% (12,831)    19.0620% (54,994)
5,000      11.0364% (31,840)   34.1227% (98,444)
20,000     28.7484% (82,939)   36.6412% (105,710)
unbounded  36.6412% (105,710)  36.6412% (105,710)
=========  ==================  ==================

The data README's 36.6 / 11.0 / 34.1 and the Belady 19.1 / 34.1 / 36.6 are these rounded to
0.1%. The LRU 4.5 and 28.8 quoted alongside are 4.45% and 28.75% (as :func:`main` prints them)
rounded half-up again. No other semantics tried matches all three: looking a whole request up
before inserting its blocks gives LRU 4.45 / 11.16 / 28.78%, and capacity +-2 or reversed
in-request order change nothing. A Belady allowed to bypass (not cache a block whose next use
is later than every cached block's) hits 19.07 / 34.12 / 36.64%, the same to 0.1%. Token hit
ratios run 0.1-0.7 points above the block ones. All eight runs take ~4 s here.

Run ``python -m benchmark.reference_policies [--trace PATH | --seed N]`` from the repo root.
"""
from __future__ import annotations

import argparse
import heapq
import itertools
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from cascade.errors import ConfigError
from cascade.trace import DEFAULT_TRACE, TOKENS_PER_BLOCK, Request, read_trace
from cascade.workload import WorkloadParams, generate

POLICIES = ("lru", "belady", "lookahead")


@dataclass(frozen=True)
class HitStats:
    """Outcome of one replay."""

    policy: str
    capacity: int | None
    references: int
    hits: int
    tokens: int
    hit_tokens: int

    @property
    def block_hit_ratio(self) -> float:
        return self.hits / self.references if self.references else 0.0

    @property
    def token_hit_ratio(self) -> float:
        return self.hit_tokens / self.tokens if self.tokens else 0.0


def references(
    requests: Iterable[Request], tokens_per_block: int = TOKENS_PER_BLOCK
) -> tuple[list[int], list[int]]:
    """The replay's reference string: every request's hash ids in order, and each block's tokens."""
    ids: list[int] = []
    tokens: list[int] = []
    for request in requests:
        ids.extend(request.hash_ids)
        tokens.extend(request.block_tokens(tokens_per_block))
    return ids, tokens


def lru_hits(ids: Sequence[Hashable], capacity: int | None) -> list[bool]:
    """Per reference, whether an LRU cache of ``capacity`` blocks hit. O(1) per reference."""
    _check_capacity(capacity)
    cache: OrderedDict[Hashable, None] = OrderedDict()
    hits = []
    for block in ids:
        hit = block in cache
        hits.append(hit)
        if hit:
            cache.move_to_end(block)
        else:
            cache[block] = None
            if capacity is not None and len(cache) > capacity:
                cache.popitem(last=False)
    return hits


def belady_hits(ids: Sequence[Hashable], capacity: int | None) -> list[bool]:
    """Per reference, whether Belady's offline-optimal cache of ``capacity`` blocks hit.

    Next-use positions are precomputed in one backward pass; cached blocks sit in a max-heap
    keyed by next use, where an entry is stale once its block was referenced again or evicted
    (checked when popped). O(log n) per reference, O(n) memory.
    """
    _check_capacity(capacity)
    if capacity == 0:
        return [False] * len(ids)
    next_use = _next_uses(ids)
    cached: dict[Hashable, int] = {}  # block -> position of its next reference
    heap: list[tuple[int, int, Hashable]] = []  # (-next use, tie-break, block)
    hits = []
    for i, block in enumerate(ids):
        hit = block in cached
        hits.append(hit)
        if not hit and capacity is not None and len(cached) >= capacity:
            while True:
                neg_next, _, victim = heapq.heappop(heap)
                if cached.get(victim) == -neg_next:
                    del cached[victim]
                    break
        cached[block] = next_use[i]
        heapq.heappush(heap, (-next_use[i], i, block))
    return hits


def lookahead_hits(requests: Sequence[Sequence[Hashable]], capacity: int | None, depth: int) -> list[bool]:
    """Per reference (requests' ids in order), whether the lookahead oracle of ``capacity``
    blocks at queue depth ``depth`` hit (module docstring, rule 3).

    A cached block sits either outside the window (an LRU list, plus a min-heap by next
    reference to move it in once the window reaches it) or inside (a max-heap by next
    reference); heap entries are stale once the block's next reference changed or it left.
    O(log n) per reference, O(n) memory.
    """
    _check_capacity(capacity)
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        raise ConfigError(f"depth: expected an integer >= 0, got {depth!r}")
    ids = [block for request in requests for block in request]
    ends = list(itertools.accumulate(len(request) for request in requests))  # ends[i]: end of request i
    next_use = _next_uses(ids)
    cached: dict[Hashable, int] = {}  # block -> position of its next reference
    outside: OrderedDict[Hashable, None] = OrderedDict()  # not referenced in the window, LRU first
    entering: list[tuple[int, Hashable]] = []  # (next use, block) of the outside ones
    inside: list[tuple[int, Hashable]] = []  # (-next use, block) of the ones the window references
    hits = []
    position = 0
    for r, request in enumerate(requests):
        window = ends[min(r + depth, len(ends) - 1)] if depth else 0  # references before it are seen
        while entering and entering[0][0] < window:
            use, block = heapq.heappop(entering)
            if cached.get(block) == use and block in outside:
                del outside[block]
                heapq.heappush(inside, (-use, block))
        for block in request:
            hit = block in cached
            hits.append(hit)
            outside.pop(block, None)
            use = cached[block] = next_use[position]
            position += 1
            if use < window:
                heapq.heappush(inside, (-use, block))
            else:
                outside[block] = None
                heapq.heappush(entering, (use, block))
            if capacity is not None and len(cached) > capacity:
                _drop_one(block, cached, outside, inside)
    return hits


def _drop_one(current: Hashable, cached: dict[Hashable, int], outside: OrderedDict[Hashable, None],
              inside: list[tuple[int, Hashable]]) -> None:
    """Drop the lookahead oracle's victim: the LRU block outside the window, else the one
    the window references last; never ``current`` (the block just referenced)."""
    for block in outside:
        if block != current:
            del outside[block], cached[block]
            return
    kept = None
    while True:
        neg_use, block = heapq.heappop(inside)
        if cached.get(block) != -neg_use or block in outside:
            continue  # stale
        if block == current:
            kept = (neg_use, block)
            continue
        del cached[block]
        if kept is not None:
            heapq.heappush(inside, kept)
        return


def simulate(
    requests: Iterable[Request],
    policy: str,
    capacity: int | None,
    tokens_per_block: int = TOKENS_PER_BLOCK,
    *,
    depth: int = 0,
) -> HitStats:
    """Replay ``requests`` through ``policy`` ("lru", "belady" or "lookahead" at queue
    ``depth``) at ``capacity`` blocks."""
    if policy not in POLICIES:
        raise ConfigError(f"policy: expected one of {POLICIES}, got {policy!r}")
    requests = list(requests)
    ids, tokens = references(requests, tokens_per_block)
    if policy == "lookahead":
        hits = lookahead_hits([r.hash_ids for r in requests], capacity, depth)
    else:
        hits = {"lru": lru_hits, "belady": belady_hits}[policy](ids, capacity)
    return HitStats(
        policy=policy,
        capacity=capacity,
        references=len(ids),
        hits=sum(hits),
        tokens=sum(tokens),
        hit_tokens=sum(t for t, hit in zip(tokens, hits) if hit),
    )


def _next_uses(ids: Sequence[Hashable]) -> list[int]:
    """Per position in ``ids``, the position of the same id's next reference
    (``len(ids)`` where there is none)."""
    never = len(ids)
    next_use = [never] * len(ids)
    seen: dict[Hashable, int] = {}
    for i in range(len(ids) - 1, -1, -1):
        next_use[i] = seen.get(ids[i], never)
        seen[ids[i]] = i
    return next_use


def _check_capacity(capacity: int | None) -> None:
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0):
        raise ConfigError(f"capacity: expected an integer >= 0 or None, got {capacity!r}")


def main(argv: Sequence[str] | None = None) -> None:
    """Print LRU and Belady hit ratios of a trace (default: the shared one) or the generated workload."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--trace", help=f"Mooncake-format JSONL trace (default {DEFAULT_TRACE})")
    source.add_argument("--seed", type=int, help="replay cascade.workload.generate(seed=SEED) instead")
    parser.add_argument("--capacity", type=int, nargs="+", default=[1000, 5000, 20000], help="blocks")
    args = parser.parse_args(argv)
    if args.seed is None and (args.trace or DEFAULT_TRACE) is None:
        parser.error("no shared trace here: pass --trace PATH or --seed N")
    if args.seed is not None:
        requests, tokens_per_block = generate(WorkloadParams(), args.seed), WorkloadParams().tokens_per_block
    else:
        requests, tokens_per_block = read_trace(args.trace or DEFAULT_TRACE), TOKENS_PER_BLOCK
    print(f"{'policy':<8}{'capacity':>10}{'block hit':>11}{'token hit':>11}")
    for policy in POLICIES:
        for capacity in [*args.capacity, None]:
            s = simulate(requests, policy, capacity, tokens_per_block)
            cap = "unbounded" if capacity is None else f"{capacity:,}"
            print(f"{policy:<8}{cap:>10}{s.block_hit_ratio:>11.2%}{s.token_hit_ratio:>11.2%}")


if __name__ == "__main__":
    main()
