"""The whole store against a dict: random sequences of every put and get form (one by
one, batches of one and of several, non-blocking, content-addressed, views) with numpy,
torch CPU and device (host memory behind ``__cuda_array_interface__``) buffers, in two
namespaces, with hints (promotions in the background), pins, deletes, injected device
copy failures and flipped bytes in file records. The SHM tier (after a GPU tier in two
variants) holds a few blocks and the file tier the rest; two variants run the background
demoter, one reads files O_DIRECT, one checksums SHM reads too. Nothing is ever evicted
there, so every block put and not deleted must read back byte-exact, every other id
must miss, and a block whose record was damaged must only ever miss. (A batch of one block with device outputs once raised InvalidBlock: no
test had combined that form with that buffer kind.)"""
from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from cascade import CascadeStore, Config, buffers
from cascade.errors import BlockNotFound, BlockPinned
from cascade.models import BlockSpec
from cascade.tiers.records import HEADER_BYTES
from cascade.testing.device_buffers import HostCudaArray, HostDeviceModule, HostMemoryCopier

IDS = 24
KINDS = ["numpy", "torch", "device"]
NAMESPACES = ["default", "b"]


class InjectedFault(Exception):
    """What the device copier raises when a rule injects a failure."""


def _bid(i: int) -> str:
    return f"{i:032x}"


def _content(spec: BlockSpec, i: int, generation: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1000 * generation + i)
    key = rng.standard_normal(spec.shape).astype(spec.np_dtype)
    return key, (key * -2).astype(spec.np_dtype)


def _as(kind: str, array: np.ndarray):
    if kind == "torch":
        return torch.from_numpy(array.copy())
    if kind == "device":
        return HostCudaArray(array.copy(), stream=7)
    return array.copy()


def _empty(kind: str, spec: BlockSpec):
    return _as(kind, np.zeros(spec.shape, spec.np_dtype))


def _host(buf) -> np.ndarray:
    if isinstance(buf, HostCudaArray):
        return buf.array
    if isinstance(buf, torch.Tensor):
        return buf.numpy()
    return np.asarray(buf)


class StoreVersusDict(RuleBasedStateMachine):
    spec: BlockSpec  # set by subclasses
    demote_high = 1.0  # 1.0: no background demoter
    gpu_blocks = 0  # a GPU tier (device memory stood in for by host memory) of this many blocks
    config_settings: dict = {}  # more Config settings

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="store-model-")
        block = self.spec.block_bytes
        self.copier_in_use = buffers.use_device_copier(HostMemoryCopier())
        self.copier = self.copier_in_use.__enter__()
        self.store = CascadeStore(
            Config(gpu_bytes=self.gpu_blocks * (block + 4096), shm_bytes=6 * (block + 4096),
                   file_bytes=16 * IDS * (block + 8192), file_segment_bytes=1 << 20,
                   file_dir=f"{self.dir}/files", shm_dir=self.dir, demote_high=self.demote_high,
                   demote_low=min(self.demote_high, 0.5), remote_bytes=0, **self.config_settings),
            block_spec=self.spec, array_module=HostDeviceModule() if self.gpu_blocks else None)
        assert [t.name for t in self.store.tiers][:2] == (["gpu", "shm"] if self.gpu_blocks else ["shm", "file"])
        assert self.store.tiers[-1].read_mode == self.config_settings.get("file_read_mode", "buffered")
        self.model: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}  # (namespace, id) -> block
        self.content_ids: list[str] = []  # ids a put without block_id returned
        self.pins: dict[tuple[str, str], int] = {}
        self.damaged: set[tuple[str, str]] = set()  # blocks whose file record had a byte flipped
        self.generation = 0

    def teardown(self) -> None:
        try:
            self.store.close()
        finally:
            self.copier_in_use.__exit__(None, None, None)
            shutil.rmtree(self.dir, ignore_errors=True)

    def _fresh(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        self.generation += 1
        return _content(self.spec, i, self.generation)

    def _block(self, ns: str, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Block ``i``'s content: the stored one (a re-put is a dedup), else a new one."""
        return self.model.get((ns, _bid(i))) or self._fresh(i)

    @staticmethod
    def _pick(data, items: list):
        """One of ``items`` (None if empty). The draw does not depend on them: after an
        injected fault, whether a block got stored may differ from run to run, and
        hypothesis replays a failure only if every draw asks for the same range."""
        n = data.draw(st.integers(0, 1 << 16))
        return items[n % len(items)] if items else None

    def _some_id(self, data, ns: str) -> str:
        """An id to read: mostly one stored in ``ns``, else any fixed id or one a
        content-addressed put returned."""
        stored = sorted(b for n, b in self.model if n == ns)
        if data.draw(st.integers(0, 3)) and stored:
            return self._pick(data, stored)
        return self._pick(data, [_bid(i) for i in range(IDS)] + self.content_ids)

    def _stored(self, key: tuple[str, str], block: tuple[np.ndarray, np.ndarray]) -> None:
        """A put of ``block`` as ``key`` returned: the model holds it, unless the store
        holds a damaged record of that id, onto which the put was deduplicated."""
        if key not in self.damaged:
            self.model[key] = block

    def _gone_if_dropped(self, key: tuple[str, str]) -> None:
        """A damaged block the store dropped (a read found it): forget it and its pins."""
        if key in self.damaged and not self.store.contains(key[1], namespace=key[0]):
            self.damaged.discard(key)
            self.pins.pop(key, None)

    def _check(self, key: tuple[str, str], hit: bool, key_out, value_out) -> None:
        if key in self.damaged:
            assert not hit, f"block {key}'s damaged record was served"
            self._gone_if_dropped(key)
            return
        if key not in self.model:
            assert not hit, f"block {key} was never put (or was deleted) but read as a hit"
            return
        assert hit, f"block {key} is stored but missed"
        k, v = self.model[key]
        assert _host(key_out).tobytes() == k.tobytes(), f"key of block {key} differs"
        assert _host(value_out).tobytes() == v.tobytes(), f"value of block {key} differs"

    # -- puts --------------------------------------------------------------------------
    @rule(i=st.integers(0, IDS - 1), kind=st.sampled_from(KINDS), ns=st.sampled_from(NAMESPACES))
    def put(self, i, kind, ns):
        key, value = self._block(ns, i)
        assert self.store.put(_as(kind, key), _as(kind, value), block_id=_bid(i), namespace=ns) == _bid(i)
        self._stored((ns, _bid(i)), (key, value))

    @rule(i=st.integers(0, IDS - 1), kind=st.sampled_from(["numpy", "torch"]), ns=st.sampled_from(NAMESPACES))
    def put_content_addressed(self, i, kind, ns):
        key, value = _content(self.spec, i, 0)  # the same bytes every time: the same id
        bid = self.store.put(_as(kind, key), _as(kind, value), namespace=ns)
        if bid not in self.content_ids:
            self.content_ids.append(bid)
        self._stored((ns, bid), (key, value))

    @rule(ids=st.lists(st.integers(0, IDS - 1), min_size=1, max_size=4, unique=True),
          kind=st.sampled_from(KINDS), asynchronous=st.booleans(), ns=st.sampled_from(NAMESPACES))
    def put_many(self, ids, kind, asynchronous, ns):
        blocks = [self._block(ns, i) for i in ids]
        pairs = [(_as(kind, k), _as(kind, v)) for k, v in blocks]
        bids = [_bid(i) for i in ids]
        if asynchronous:
            got = self.store.put_many_async(pairs, block_ids=bids, namespace=ns).result(timeout=60)
        else:
            got = self.store.put_many(pairs, block_ids=bids, namespace=ns)
        assert got == bids
        for bid, block in zip(bids, blocks):
            self._stored((ns, bid), block)

    # -- gets --------------------------------------------------------------------------
    @rule(data=st.data(), kind=st.sampled_from(KINDS), asynchronous=st.booleans(), ns=st.sampled_from(NAMESPACES))
    def get_into(self, data, kind, asynchronous, ns):
        bid = self._some_id(data, ns)
        key_out, value_out = _empty(kind, self.spec), _empty(kind, self.spec)
        if asynchronous:
            hit = self.store.get_into_async(bid, key_out, value_out, namespace=ns).result(timeout=60)
        else:
            hit = self.store.get_into(bid, key_out, value_out, namespace=ns)
        self._check((ns, bid), hit, key_out, value_out)

    @rule(data=st.data(), kind=st.sampled_from(KINDS), workers=st.sampled_from([None, 1, 3]),
          ns=st.sampled_from(NAMESPACES))
    def get_many_into(self, data, kind, workers, ns):
        bids = [self._some_id(data, ns) for _ in range(data.draw(st.integers(1, 5)))]
        outs = [(_empty(kind, self.spec), _empty(kind, self.spec)) for _ in bids]
        hits = self.store.get_many_into(bids, outs, max_workers=workers, namespace=ns)
        assert len(hits) == len(bids)
        for bid, hit, (key_out, value_out) in zip(bids, hits, outs):
            self._check((ns, bid), hit, key_out, value_out)

    @rule(data=st.data(), like=st.sampled_from(["numpy", "torch"]), ns=st.sampled_from(NAMESPACES))
    def get(self, data, like, ns):
        bid = self._some_id(data, ns)
        if like == "numpy":
            got = self.store.get(bid, namespace=ns)
        else:
            got = self.store.get(bid, namespace=ns, like=torch.zeros(1, dtype=torch.float16))
        self._check((ns, bid), got is not None, *(got or (None, None)))

    @rule(data=st.data(), ns=st.sampled_from(NAMESPACES))
    def view(self, data, ns):
        bid = self._some_id(data, ns)
        with self.store.view(bid, namespace=ns) as block:
            self._check((ns, bid), block is not None, *((_host(block[0]), _host(block[1])) if block else
                                                          (None, None)))

    # -- hints, pins and deletes -------------------------------------------------------
    @rule(data=st.data(), ns=st.sampled_from(NAMESPACES), withdraw=st.booleans())
    def hint(self, data, ns, withdraw):
        bids = [self._some_id(data, ns) for _ in range(data.draw(st.integers(1, 4)))]
        taken = self.store.hint(bids, namespace=ns)  # promotions run in the background
        assert 0 <= taken <= sum((ns, b) in self.model or (ns, b) in self.damaged for b in bids)
        if withdraw:
            assert 0 <= self.store.unhint(bids, namespace=ns) <= taken

    @precondition(lambda self: self.demote_high >= 1.0)  # (else the demoter's thread may take the fault)
    @rule(data=st.data(), ns=st.sampled_from(NAMESPACES), fault=st.sampled_from(["copy", "sync"]),
          op=st.sampled_from(["put", "put_many", "get_into", "get_many_into"]))
    def a_device_copy_fails(self, data, ns, fault, op):
        """The next device copy (or stream synchronisation) raises: the call that made it
        raises that error or completes; either way every block stored is whole and the
        others are absent, and nothing stays held (close() at the end would time out)."""
        self.store.flush()  # no hinted promotion may take the fault in the background
        if fault == "copy":
            self.copier.fail = InjectedFault("injected copy failure")
        else:
            self.copier.fail_sync = InjectedFault("injected synchronisation failure")
        try:
            if op in ("put", "put_many"):
                ids = data.draw(st.lists(st.integers(0, IDS - 1), min_size=1, max_size=1 if op == "put" else 4,
                                         unique=True))
                blocks = [self._block(ns, i) for i in ids]
                pairs = [(_as("device", k), _as("device", v)) for k, v in blocks]
                try:
                    if op == "put":
                        self.store.put(*pairs[0], block_id=_bid(ids[0]), namespace=ns)
                    else:
                        self.store.put_many(pairs, block_ids=[_bid(i) for i in ids], namespace=ns)
                except InjectedFault:
                    pass
                for i, block in zip(ids, blocks):  # stored or not, as a whole: reads check the bytes
                    if self.store.contains(_bid(i), namespace=ns):
                        self._stored((ns, _bid(i)), block)
                    else:
                        assert (ns, _bid(i)) not in self.model, f"block {i} was stored before and is gone"
            else:
                bids = [self._some_id(data, ns) for _ in range(1 if op == "get_into" else data.draw(st.integers(1, 4)))]
                outs = [(_empty("device", self.spec), _empty("device", self.spec)) for _ in bids]
                try:
                    if op == "get_into":
                        hits = [self.store.get_into(bids[0], *outs[0], namespace=ns)]
                    else:
                        hits = self.store.get_many_into(bids, outs, namespace=ns)
                except InjectedFault:
                    return  # the outputs hold nothing valid
                for bid, hit, (key_out, value_out) in zip(bids, hits, outs):
                    self._check((ns, bid), hit, key_out, value_out)
        finally:
            self.copier.fail = self.copier.fail_sync = None  # (unused when no device copy ran)

    @precondition(lambda self: self.demote_high >= 1.0)  # (blocks stay where they are meanwhile)
    @rule(data=st.data())
    def damage_a_file_record(self, data):
        """Flip one payload byte of a block's record in the file tier: from then on the
        block may only miss (its checksum fails), never be read as data."""
        self.store.flush()  # no hinted promotion in flight
        files = self.store.tiers[-1]
        key = self._pick(data, sorted(k for k in self.model if k in files))
        if key is None:
            return
        loc = files._index[key]
        pos = loc.offset + HEADER_BYTES + data.draw(st.integers(0, 1 << 20)) % loc.length
        fd = os.open(files._file_path(loc.file_id), os.O_RDWR)
        try:
            os.pwrite(fd, bytes([os.pread(fd, 1, pos)[0] ^ 0xFF]), pos)
        finally:
            os.close(fd)
        del self.model[key]
        self.damaged.add(key)

    @rule()
    def flush(self):
        self.store.flush()

    @rule(data=st.data())
    def pin(self, data):
        key = self._pick(data, sorted(self.model))
        if key is None:
            return
        self.store.pin(key[1], namespace=key[0])
        self.pins[key] = self.pins.get(key, 0) + 1

    @rule(data=st.data())
    def unpin(self, data):
        key = self._pick(data, sorted(self.pins))
        if key is None:
            return
        self._gone_if_dropped(key)  # (a hinted promotion may have found it damaged)
        if key not in self.pins:
            return
        self.store.unpin(key[1], namespace=key[0])
        self.pins[key] -= 1
        if not self.pins[key]:
            del self.pins[key]

    @rule(data=st.data(), ns=st.sampled_from(NAMESPACES))
    def delete(self, data, ns):
        key = (ns, self._some_id(data, ns))
        self._gone_if_dropped(key)
        if key in self.damaged:
            if key in self.pins:
                with pytest.raises(BlockPinned):
                    self.store.delete(key[1], namespace=ns)
            else:
                self.store.delete(key[1], namespace=ns)
                self.damaged.discard(key)
        elif key not in self.model:
            with pytest.raises(BlockNotFound):
                self.store.delete(key[1], namespace=ns)
        elif key in self.pins:
            with pytest.raises(BlockPinned):
                self.store.delete(key[1], namespace=ns)
        else:
            self.store.delete(key[1], namespace=ns)
            del self.model[key]

    @invariant()
    def contents_agree(self):
        for ns in NAMESPACES:
            bids = [_bid(i) for i in range(IDS)] + self.content_ids
            held = {b for b, h in zip(bids, self.store.contains_many(bids, namespace=ns)) if h}
            damaged = {b for n, b in self.damaged if n == ns}  # held until a read finds them
            assert held - damaged == {b for n, b in self.model if n == ns}, ns


class SmallBlocks(StoreVersusDict):
    spec = BlockSpec((2, 2, 16, 16), np.float16)  # 4 KiB: the hot paths


class LargeBlocks(StoreVersusDict):
    spec = BlockSpec((2, 4, 64, 64), np.float16)  # 128 KiB: leased and generic paths


class SmallBlocksDemoted(SmallBlocks):
    demote_high = 0.6  # the background demoter moves blocks while the calls run


class LargeBlocksDirectReads(LargeBlocks):
    config_settings = {"file_read_mode": "direct"}  # O_DIRECT file reads, as on Lustre


class SmallBlocksVerified(SmallBlocks):
    config_settings = {"verify_dram_reads": True}  # SHM reads checksummed too


class GpuTierBlocks(StoreVersusDict):
    spec = BlockSpec((2, 2, 32, 32), np.float16)  # 16 KiB
    gpu_blocks = 4  # GPU, then SHM, then file: device-tier puts, batches and demotions


class GpuTierBlocksDemoted(GpuTierBlocks):
    demote_high = 0.6


_SETTINGS = settings(max_examples=40, stateful_step_count=40, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])


def _case(machine: type[StoreVersusDict]) -> type:
    """``machine``'s pytest case, at the sizes CI runs."""
    case = machine.TestCase
    case.settings = _SETTINGS
    return case


TestSmallBlocksVersusDict = _case(SmallBlocks)
TestLargeBlocksVersusDict = _case(LargeBlocks)
TestSmallBlocksDemotedVersusDict = _case(SmallBlocksDemoted)
TestLargeBlocksDirectReadsVersusDict = _case(LargeBlocksDirectReads)
TestSmallBlocksVerifiedVersusDict = _case(SmallBlocksVerified)
TestGpuTierBlocksVersusDict = _case(GpuTierBlocks)
TestGpuTierBlocksDemotedVersusDict = _case(GpuTierBlocksDemoted)
