"""Property-based tests: every tier behaves like a dict; bad input is a clear error."""
from __future__ import annotations

import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from cascade import CascadeStore, Config, InvalidBlock, TierFull
from cascade.errors import BlockNotFound
from cascade.tiers.file_tier import FileTier
from cascade.tiers.gpu import GpuTier
from cascade.tiers.shm import ShmTier

CAPACITY = 256 << 10


class TierVersusDict(RuleBasedStateMachine):
    """Random put/replace/delete/read sequences; the tier must agree with a dict."""

    make = None  # set by subclasses: () -> Tier
    keys = Bundle("keys")

    def __init__(self):
        super().__init__()
        self.tier = type(self).make()
        self.model: dict = {}

    @rule(target=keys, i=st.integers(0, 30), ns=st.sampled_from(["a", "b"]))
    def key(self, i, ns):
        return (ns, f"{i:032x}")

    @rule(key=keys, data=st.binary(min_size=1, max_size=20_000))
    def put(self, key, data):
        try:
            self.tier.put(key, [data[: len(data) // 2], data[len(data) // 2:]])
        except TierFull:
            return  # a full tier refuses and keeps what it had (checked by the invariant)
        self.model[key] = data

    @rule(key=keys)
    def delete(self, key):
        if key in self.model:
            del self.tier[key]
            del self.model[key]
        else:
            with pytest.raises(BlockNotFound):
                del self.tier[key]

    @rule(key=keys, offset=st.integers(0, 100), size=st.integers(1, 100))
    def partial_read(self, key, offset, size):
        if key not in self.model or offset + size > len(self.model[key]):
            return
        out = bytearray(size)
        self.tier.read_into(key, out, offset)
        assert bytes(out) == self.model[key][offset:offset + size]

    @invariant()
    def agrees_with_dict(self):
        assert set(self.tier) == set(self.model)
        for key, data in self.model.items():
            assert self.tier[key] == data
        assert self.tier.used == sum(map(len, self.model.values()))

    def teardown(self):
        self.tier.close()
        directory = getattr(self.tier, "directory", None)
        if directory is not None:  # the file tier's mkdtemp directory
            shutil.rmtree(directory, ignore_errors=True)


class ShmVersusDict(TierVersusDict):
    make = staticmethod(lambda: ShmTier(CAPACITY, verify=True))


class GpuNumpyVersusDict(TierVersusDict):
    make = staticmethod(lambda: GpuTier(CAPACITY, np))


class FileVersusDict(TierVersusDict):
    make = staticmethod(lambda: FileTier(CAPACITY * 4, tempfile.mkdtemp(prefix="cascade-prop-"), segment_bytes=1 << 20))


_settings = settings(max_examples=25, stateful_step_count=30, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])
TestShmVersusDict = ShmVersusDict.TestCase
TestShmVersusDict.settings = _settings
TestGpuNumpyVersusDict = GpuNumpyVersusDict.TestCase
TestGpuNumpyVersusDict.settings = _settings
TestFileVersusDict = FileVersusDict.TestCase
TestFileVersusDict.settings = _settings


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    cfg = Config(model="tiny", shm_bytes=64 * 4096, file_bytes=0, file_dir=str(tmp_path_factory.mktemp("f")))
    with CascadeStore(cfg) as s:
        yield s


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(0, 40), min_size=0, max_size=5),
       dtype=st.sampled_from(["float16", "float32", "int8", "uint8", "float64"]))
def test_any_wrong_shape_or_dtype_is_refused_and_loses_nothing(store, shape, dtype):
    good = store.spec.empty()
    good[0][...] = 1
    bid = store.put(*good)
    before = store.stats()["stored"]
    arr = np.zeros(shape, dtype=dtype)
    if tuple(shape) == store.spec.shape and dtype == store.spec.dtype:
        return
    with pytest.raises(InvalidBlock):
        store.put(arr, good[1])
    with pytest.raises(InvalidBlock):
        store.put(good[0], arr)
    assert store.stats()["stored"] == before and store.get(bid) is not None


@settings(max_examples=80, deadline=None)
@given(text=st.text(max_size=40))
def test_malformed_ids_are_refused(store, text):
    if len(text) == 32 and all(c in "0123456789abcdef" for c in text):
        return
    with pytest.raises(InvalidBlock):
        store.get(text)
    with pytest.raises(InvalidBlock):
        store.contains(text)


def test_read_only_and_non_contiguous_outputs_are_refused(store):
    k, v = store.spec.empty()
    bid = store.put(k, v)
    ro_k, ro_v = store.spec.empty()
    ro_k.flags.writeable = False
    with pytest.raises(InvalidBlock, match="writable"):
        store.get_into(bid, ro_k, ro_v)
    wide = np.empty(store.spec.shape[:-1] + (store.spec.shape[-1] * 2,), store.spec.dtype)[..., ::2]
    with pytest.raises(InvalidBlock, match="contiguous|shape"):
        store.get_into(bid, wide, v)


def test_unknown_namespace_is_a_miss_not_an_error(store):
    assert store.get("0" * 32, namespace="never-used") is None
    assert store.longest_prefix(["0" * 32], namespace="never-used") == 0


def test_empty_and_huge_blocks(tmp_path):
    from cascade import ConfigError

    with pytest.raises(ConfigError, match="block_tokens"):
        Config(model="tiny", block_tokens=0)
    cfg = Config(model="llama3-70b", block_tokens=64, shm_bytes=16 << 20, file_bytes=0, file_dir=str(tmp_path))
    with CascadeStore(cfg) as s:  # a 20 MiB block cannot fit a 16 MiB tier
        k, v = s.spec.empty()
        with pytest.raises(TierFull, match="exceeds"):
            s.put(k, v)
        assert s.stats()["rejected"] == 1 and len(s) == 0
