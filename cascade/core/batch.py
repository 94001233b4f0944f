"""The batch and non-blocking calls of :class:`~cascade.store.CascadeStore` (mixed into
it): each is the store's own single-block call, run for many blocks on the store's I/O
threads, or later on its non-blocking-call threads (ordering and buffer rules:
:mod:`cascade.async_ops`), and the batched lookups (one directory round for many ids).
Thread-safe, local."""
from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from typing import Any

from ..buffers import DeviceView, one_sync, view
from ..buffers.hostcopy import refuse_overlaps
from ..errors import InvalidBlock
from ..identity import DEFAULT_NAMESPACE, check_id
from ..tiers.base import Memory
from .batch_reads import LEASED_STEP_BYTES
from .pools import check_workers


def pair_list(items: Iterable[Any], what: str) -> list[Any]:
    """``items`` as a list whose elements are each a ``(key, value)`` pair (a tuple of two
    as it is; another iterable of two made one); :class:`InvalidBlock` naming the first
    element that is not a pair, before anything is done with the others."""
    pairs = list(items)
    for i, item in enumerate(pairs):
        if type(item) is tuple and len(item) == 2:
            continue
        try:
            key, value = item
        except (TypeError, ValueError):
            raise InvalidBlock(f"{what}: element {i} is not a (key, value) pair "
                               f"(got {type(item).__name__})") from None
        pairs[i] = (key, value)
    return pairs


class BatchCalls:
    """Batch and non-blocking forms of the store's calls (uses the store's checks and
    layers: ``_pools``, ``_async``, ``_index``, ``_chain``, ``_lock``)."""

    def put_many(
        self,
        pairs: Iterable[tuple[Any, Any]],
        *,
        namespace: str = DEFAULT_NAMESPACE,
        chain: bool = False,
        parent: str | None = None,
        block_ids: Sequence[str] | None = None,
        max_workers: int | None = None,
    ) -> list[str]:
        """Put each (key, value), up to ``max_workers`` (default ``config.io_threads``)
        at once; returns the ids in order. ``block_ids`` gives each block's id (no
        hashing); without it the ids are content digests. With ``chain=True`` each
        block's parent is the one before it (the first one's is ``parent``). Each put is
        its own operation: when one fails, the others still complete and the first error
        is raised. With ids known, device inputs bound for a device tier are one batch
        (:meth:`~cascade.core.writes.WritePath.put_device_many`): their copies are
        synchronised once per stream before any of them is committed, and a failed copy
        or synchronisation stores none of them. With ids known and no ``max_workers``,
        host blocks bound for the SHM tier above the hot size are claimed, copied in one
        compiled call (on two cores where the copy helper runs) and committed in the
        calling thread (:meth:`~cascade.core.writes.WritePath.put_host_many`). An element
        that is not a ``(key, value)`` pair fails the whole batch at once
        (:class:`InvalidBlock`, nothing stored). Local."""
        check_workers(max_workers, "put_many")
        pairs = pair_list(pairs, "put_many")
        if block_ids is not None:
            block_ids = [check_id(b) for b in block_ids]
            if len(block_ids) != len(pairs):
                raise InvalidBlock(f"put_many: {len(pairs)} blocks but {len(block_ids)} block_ids")
        elif chain:  # parents must be known up front: hash first, in parallel
            for key, value in pairs:
                self._check_pair(key, value)
            block_ids = self._pools.parallel(self._writes.content_id, pairs, max_workers)
        ids = block_ids if block_ids is not None else [None] * len(pairs)
        parents = ([parent] + list(ids[:-1])) if chain else [None] * len(pairs)

        def put_one(i: int) -> str:
            return self.put(*pairs[i], namespace=namespace, parent=parents[i], block_id=ids[i])

        results: list[Any] = [None] * len(pairs)
        rest = range(len(pairs))
        if block_ids is not None:  # small blocks: one locked step for all that fit as they are
            self._check_put_options(namespace, parent, 0, None)
            hot = self._plain_pairs(pairs)
            stored = self._writes.put_hot_many([(pairs[i], ids[i], parents[i]) for i in hot], namespace,
                                               ttl=None, priority=0)
            for i, got in zip(hot, stored):
                results[i] = got
            rest = [i for i, got in enumerate(results) if got is None]
            device = [i for i in rest if self._device_pair(*pairs[i])]
            if device:  # device inputs into a device tier: one synchronisation per stream, then the commits
                items, device = self._checked_puts(pairs, ids, parents, device, namespace, results)
                try:
                    stored = self._writes.put_device_many(items, namespace, ttl=None, priority=0)
                except Exception as exc:  # a copy or synchronisation failed: none of these was stored
                    stored = [exc] * len(items)
                for i, got in zip(device, stored):
                    results[i] = got
                self._tick()
                rest = [i for i in rest if results[i] is None]
        in_memory = self._chain.tiers[0].copies_without_gil  # into the SHM tier, unless it is full
        if block_ids is not None and in_memory and max_workers is None and rest:
            self._put_host_many(pairs, ids, parents, rest, namespace, results)
            rest = []
        errors = [r for r in results if isinstance(r, BaseException)]
        try:
            for i, got in zip(rest, self._pools.parallel(put_one, rest, max_workers, item_bytes=self.spec.block_bytes,
                                                         in_memory=in_memory)):
                results[i] = got
        except BaseException as exc:
            errors.append(exc)
        if errors:
            raise errors[0]
        return results

    def _put_host_many(self, pairs: list[tuple[Any, Any]], ids: Sequence[str], parents: Sequence[str | None],
                       indices: Sequence[int], namespace: str, results: list[Any]) -> None:
        """The puts ``indices`` of a batch with ids into an SHM tier, each checked, in
        :meth:`~cascade.core.writes.WritePath.put_host_many` calls of at most
        :meth:`_host_chunk` blocks: each call's copies made in one compiled call, on two
        cores where the copy helper runs. A call holds its claims until it commits, so
        a batch bigger than the tier still makes room for its last blocks by evicting
        its first ones, as the same puts one by one do. Each put's id or error goes into
        ``results``."""
        items, checked = self._checked_puts(pairs, ids, parents, indices, namespace, results)
        step = self._host_chunk()
        for lo in range(0, len(items), step):
            for i, got in zip(checked[lo:lo + step],
                              self._writes.put_host_many(items[lo:lo + step], namespace, ttl=None, priority=0)):
                results[i] = got
        self._tick()

    def _checked_puts(self, pairs: list[tuple[Any, Any]], ids: Sequence[str], parents: Sequence[str | None],
                      indices: Sequence[int], namespace: str, results: list[Any]
                      ) -> tuple[list[tuple[list[Any], str, str | None]], list[int]]:
        """The puts ``indices`` of a batch checked (options and pair): ``(parts, id,
        parent)`` of each that passed, and their indices; each one's own error goes
        into ``results`` (the others still run)."""
        items, checked = [], []
        for i in indices:
            try:
                self._check_put_options(namespace, parents[i], 0, None)
                items.append((self._check_pair(*pairs[i]), ids[i], parents[i]))
                checked.append(i)
            except Exception as exc:
                results[i] = exc
        return items, checked

    def _host_chunk(self) -> int:
        """Blocks one :meth:`~cascade.core.writes.WritePath.put_host_many` call claims at
        once: a quarter of the fastest tier, at most :data:`~.batch_reads.LEASED_STEP_BYTES`
        (at least one block)."""
        room = min(LEASED_STEP_BYTES, self._chain.tiers[0].capacity // 4)
        return max(1, room // self.spec.block_bytes)

    def _device_pair(self, key: Any, value: Any) -> bool:
        """Whether a put of ``(key, value)`` is a copy from device memory into a device tier."""
        if self._chain.tiers[0].memory is not Memory.DEVICE:
            return False
        try:
            return all(isinstance(view(a, "block part"), DeviceView) for a in (key, value))
        except InvalidBlock:
            return False  # put() reports it

    def get_many(self, block_ids: Iterable[str], *, namespace: str = DEFAULT_NAMESPACE,
                 max_workers: int | None = None) -> list[tuple[Any, Any] | None]:
        """``get`` of each id, in order, up to ``max_workers`` (default
        ``config.io_threads``) reads in flight. Local."""
        check_workers(max_workers, "get_many")
        return self._pools.parallel(lambda b: self.get(b, namespace=namespace), list(block_ids), max_workers,
                                    item_bytes=self.spec.block_bytes)

    def get_many_into(self, block_ids: Sequence[str], outs: Sequence[tuple[Any, Any]], *,
                      namespace: str = DEFAULT_NAMESPACE, max_workers: int | None = None) -> list[bool]:
        """``get_into`` of each id into the matching ``(key_out, value_out)`` of ``outs``,
        up to ``max_workers`` (default ``config.io_threads``) reads in flight. Copies into
        device outputs are enqueued on their streams and each stream is synchronised once
        at the end (:func:`cascade.buffers.one_sync`). Hot small blocks are copied in one
        locked step (:meth:`~cascade.core.reads.ReadPath.read_hot_many`), blocks in the file
        tier leased in one and counted in another
        (:meth:`~cascade.core.batch_reads.LeasedBatchReads.read_leased_many`), and so are the SHM and GPU
        blocks of a batch with device outputs, whose copies this thread only enqueues. An
        element of ``outs`` that is not a pair fails the whole batch before anything is
        read (:class:`InvalidBlock`), as bad outputs do. Local."""
        check_workers(max_workers, "get_many_into")
        block_ids, outs = list(block_ids), pair_list(outs, "get_many_into")
        if len(block_ids) != len(outs):
            raise InvalidBlock(f"get_many_into: {len(block_ids)} ids but {len(outs)} output pairs")
        checked = self._checked_out_pairs(outs)  # all checked before anything is read
        refuse_overlaps([o for pair in checked for o in pair], "get_many_into")
        if len(block_ids) == 1 and max_workers is None:  # a batch's set-up costs more than one get (2x at 4 KiB)
            return [self.get_into(block_ids[0], *outs[0], namespace=namespace)]  # the caller's arrays, not views
        outs = checked
        hits = [False] * len(block_ids)
        rest = range(len(block_ids))
        keys = None
        if type(namespace) is str and {*map(type, block_ids)} <= {str}:
            keys = [(namespace, b) for b in block_ids]
            self._async.wait_for_puts(keys)  # a get after a put_async of an id sees it
            hits = self._reads.read_hot_many(keys, outs)  # small blocks: one locked step for every hot hit
            rest = [i for i, hit in enumerate(hits) if not hit]
            if rest:  # blocks in the file tier: leased in one locked step, counted in another
                leased = self._reads.read_leased_many(
                    [keys[i] for i in rest], [outs[i] for i in rest],
                    lambda fn, items, in_memory=False, item_bytes=self.spec.block_bytes: self._pools.parallel(
                        fn, items, max_workers, item_bytes=item_bytes, in_memory=in_memory))
                for i, hit in zip(rest, leased):
                    if hit is not None:
                        hits[i] = hit
                rest = [i for i, hit in zip(rest, leased) if hit is None]
                self._tick()
        if rest:
            with one_sync([o for i in rest for o in outs[i]]) as batch:  # device outputs: one sync per stream
                if batch.device and keys is not None:  # SHM and GPU blocks: copies enqueued in this thread
                    leased = self._reads.read_leased_many(
                        [keys[i] for i in rest], [outs[i] for i in rest],
                        lambda fn, items, **_: [batch.bind(fn)(j) for j in items], any_outputs=True)
                    for i, hit in zip(rest, leased):
                        if hit is not None:
                            hits[i] = hit
                    rest = [i for i, hit in zip(rest, leased) if hit is None]
                # (keys: the batch waited for its ids' puts above; on the I/O workers a wait
                # would also wait for puts submitted after this call, queued behind it)
                read = batch.bind(lambda i: self._read(block_ids[i], namespace, list(outs[i]), wait=keys is None))
                for i, hit in zip(rest, self._pools.parallel(read, rest, max_workers, item_bytes=self.spec.block_bytes)):
                    hits[i] = hit
        return hits

    # -- non-blocking calls (ordering and buffer rules: cascade/async_ops.py) ----------------
    def put_async(self, key: Any, value: Any, *, parent: str | None = None, namespace: str = DEFAULT_NAMESPACE,
                  block_id: str | None = None, verify: bool = False, ttl: float | None = None,
                  priority: int = 0) -> Future:
        """:meth:`put` without waiting: returns a future of the block's id at once. Bad
        input raises here; TierFull and other errors of the put come from
        ``future.result()``. ``key`` and ``value`` must stay unchanged until it is done."""
        self._check_pair(key, value)
        self._check_put_options(namespace, parent, priority, ttl)
        puts = [self._key(block_id, namespace)] if block_id is not None else []
        return self._async.submit(lambda: self.put(key, value, parent=parent, namespace=namespace, block_id=block_id,
                                                   verify=verify, ttl=ttl, priority=priority), puts=puts)

    def put_many_async(self, pairs: Iterable[tuple[Any, Any]], *, block_ids: Sequence[str] | None = None,
                       **options: Any) -> Future:
        """:meth:`put_many` without waiting: a future of the list of ids. Pairs, ids and
        options are checked here; the pairs must stay unchanged until the future is done."""
        unknown = set(options) - {"namespace", "chain", "parent", "max_workers"}
        if unknown:
            raise TypeError(f"put_many_async: unexpected keyword argument(s) {sorted(unknown)}")
        check_workers(options.get("max_workers"), "put_many_async")
        self._check_put_options(options.get("namespace", DEFAULT_NAMESPACE), options.get("parent"), 0, None)
        pairs = pair_list(pairs, "put_many_async")
        for key, value in pairs:
            self._check_pair(key, value)
        if block_ids is not None and len(block_ids) != len(pairs):
            raise InvalidBlock(f"put_many_async: {len(pairs)} pairs but {len(block_ids)} block_ids")
        namespace = options.get("namespace", DEFAULT_NAMESPACE)
        puts = [self._key(b, namespace) for b in block_ids] if block_ids is not None else []
        return self._async.submit(lambda: self.put_many(pairs, block_ids=block_ids, **options), puts=puts)

    def get_into_async(self, block_id: str, key_out: Any, value_out: Any, *,
                       namespace: str = DEFAULT_NAMESPACE) -> Future:
        """:meth:`get_into` without waiting: a future of True (hit) or False (miss). The
        outputs hold the block only once the future is done with True."""
        self._check_outs(key_out, value_out)
        bkey = self._key(block_id, namespace)
        return self._async.submit(lambda: self.get_into(block_id, key_out, value_out, namespace=namespace),
                                  after=[bkey])

    def get_many_into_async(self, block_ids: Sequence[str], outs: Sequence[tuple[Any, Any]], *,
                            namespace: str = DEFAULT_NAMESPACE, max_workers: int | None = None) -> Future:
        """:meth:`get_many_into` without waiting: a future of the list of hits."""
        check_workers(max_workers, "get_many_into_async")
        block_ids, outs = list(block_ids), pair_list(outs, "get_many_into_async")
        if len(block_ids) != len(outs):
            raise InvalidBlock(f"get_many_into_async: {len(block_ids)} ids but {len(outs)} output pairs")
        for key_out, value_out in outs:
            self._check_outs(key_out, value_out)
        keys = [self._key(b, namespace) for b in block_ids]
        return self._async.submit(
            lambda: self.get_many_into(block_ids, outs, namespace=namespace, max_workers=max_workers), after=keys)

    def put_pending(self, block_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> bool:
        """Whether a ``put_async`` of this id has not finished yet. Local."""
        return self._async.pending(self._key(block_id, namespace))

    def contains_many(self, block_ids: Iterable[str], *, namespace: str = DEFAULT_NAMESPACE) -> list[bool]:
        """``contains`` of each id; ids not cached here are looked up in the cluster
        directory in one batch (multi-rank runs)."""
        keys = self._keys(block_ids, namespace, "contains_many")
        self._async.wait_for_puts(keys)  # a lookup after a put_async of an id sees it
        with self._lock:
            now = time.monotonic()
            found = [(m := self._index.get(k)) is not None and not self._index.expired(m, now) for k in keys]
            rest = [i for i, hit in enumerate(found) if not hit]
            if rest:
                for i, there in zip(rest, self._chain.peers.found_elsewhere([keys[i] for i in rest])):
                    found[i] = there
            return found

    def longest_prefix(self, block_ids: Sequence[str] | None = None, *, tokens: Any = None,
                       model_fingerprint: Any = None, namespace: str = DEFAULT_NAMESPACE) -> int:
        """How many leading blocks of a chain are cached (cluster-wide in multi-rank
        runs): of ``block_ids``, or of the token-prefix ids of ``tokens`` (token ids,
        blocks of ``config.block_tokens``, :func:`cascade.prefix_ids` with
        ``model_fingerprint``). Cached tokens = the result x ``config.block_tokens``.
        Local; one batched directory lookup."""
        if (block_ids is None) == (tokens is None):
            raise InvalidBlock("longest_prefix: pass either block_ids or tokens (with model_fingerprint)")
        if tokens is not None:
            from ..prefix import prefix_ids

            block_ids = prefix_ids(tokens, block_tokens=self.config.block_tokens, model_fingerprint=model_fingerprint)
        found = self.contains_many(block_ids, namespace=namespace)
        return found.index(False) if False in found else len(found)
