"""Contract tests for every benchmark adapter (benchmark/adapters).

One test body per property, run against each registered adapter. An adapter whose
system cannot start here is skipped with its reason — unless its name is listed in
``CASCADE_REQUIRE_ADAPTERS`` (comma-separated, or ``installed`` for redis, hdf5,
mooncake, the LMCache backends and every variant), which CI sets after third_party/install.sh so a
broken install fails instead of skipping.
"""
from __future__ import annotations

import errno
import os
import socket

import blake3
import numpy as np
import pytest

from benchmark.adapters import ADAPTER_NAMES, AdapterUnavailable, available_adapters, load_adapter

CAPACITY = 32 << 20
_INSTALLED_HERE = ("redis", "redis_unix", "hdf5", "hdf5_nocache", "mooncake", "lmcache_cpu", "lmcache_disk",
                   "lmcache_disk_odirect", "lmcache_cpu_disk")


def _required() -> set[str]:
    raw = os.environ.get("CASCADE_REQUIRE_ADAPTERS", "")
    names = {n.strip() for n in raw.split(",") if n.strip()}
    if "installed" in names:
        names = (names - {"installed"}) | set(_INSTALLED_HERE)
    return names


def _block(rng: np.random.Generator, klen: int, vlen: int | None = None):
    """``(block_id, key, value)`` of random bytes; the id is the content id (DESIGN 2)."""
    vlen = klen if vlen is None else vlen
    key = rng.integers(0, 256, klen, dtype=np.uint8)
    value = rng.integers(0, 256, vlen, dtype=np.uint8)
    h = blake3.blake3(key.tobytes())
    h.update(value.tobytes())
    return h.hexdigest()[:32], key, value


_ABSENT = "f" * 32


@pytest.fixture(scope="module", params=ADAPTER_NAMES)
def adapter(request, tmp_path_factory):
    """One initialized adapter per name for the whole module (starting servers is slow)."""
    name = request.param
    data_dir = tmp_path_factory.mktemp(f"adapter_{name}")
    try:
        store = load_adapter(name)
        store.initialize(CAPACITY, str(data_dir))
    except AdapterUnavailable as exc:
        if name in _required():
            pytest.fail(f"{name} is required (CASCADE_REQUIRE_ADAPTERS) but unavailable: {exc}")
        pytest.skip(f"{name}: {exc}")
    yield store
    store.close()


@pytest.fixture()
def store(adapter):
    adapter.clear()
    yield adapter


# -- the contract ---------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_put_get_byte_exact(store):
    rng = np.random.default_rng(1)
    sizes = (4096,) * 4 if store.uniform_blocks else (1, 4096, 65536, 300_001)
    blocks = [_block(rng, n) for n in sizes]
    for bid, k, v in blocks:
        store.put(bid, k, v)
    for bid, k, v in blocks:
        got = store.get(bid)
        assert got is not None, bid
        assert got[0] == k.tobytes() and got[1] == v.tobytes()


@pytest.mark.timeout(60)
def test_blocks_survive_dropping_the_process_cache(store):
    """What read_throughput does before a cold pass: every block still reads back
    byte-exact afterwards, and the store still takes puts (HDF5 reopens its file)."""
    rng = np.random.default_rng(5)
    first = [_block(rng, 4096) for _ in range(3)]
    for bid, k, v in first:
        store.put(bid, k, v)
    store.flush()
    assert all(store.get(bid) == (k.tobytes(), v.tobytes()) for bid, k, v in first)
    store.drop_process_cache()
    later = _block(rng, 4096)
    store.put(*later)
    for bid, k, v in [*first, later]:
        assert store.get(bid) == (k.tobytes(), v.tobytes()), bid


@pytest.mark.timeout(60)
def test_accepts_bytes_memoryview_and_unequal_halves(store):
    rng = np.random.default_rng(2)
    uniform = store.uniform_blocks  # a KV store sized for one model: K and V of one size
    bid, k, v = _block(rng, 1000, 1000 if uniform else 3000)
    store.put(bid, k.tobytes(), memoryview(v.tobytes()))
    assert store.get(bid) == (k.tobytes(), v.tobytes())
    bid2, k2, v2 = _block(rng, 48, 48 if uniform else 16)
    store.put(bid2, bytearray(k2.tobytes()), v2)
    assert store.get(bid2) == (k2.tobytes(), v2.tobytes())


@pytest.mark.timeout(60)
def test_get_into_fills_callers_buffers(store):
    rng = np.random.default_rng(3)
    bid, k, v = _block(rng, 1 << 20)
    store.put(bid, k, v)
    kout, vout = np.zeros_like(k), np.zeros_like(v)
    assert store.get_into(bid, kout, vout) is True
    np.testing.assert_array_equal(kout, k)
    np.testing.assert_array_equal(vout, v)
    # A bytearray works as well as a numpy array.
    kb, vb = bytearray(k.nbytes), bytearray(v.nbytes)
    assert store.get_into(bid, kb, vb) and bytes(kb) == k.tobytes() and bytes(vb) == v.tobytes()
    with pytest.raises(ValueError):
        store.get_into(bid, np.zeros(10, np.uint8), vout)


@pytest.mark.timeout(60)
def test_miss_is_none_or_false(store):
    buf = np.zeros(16, np.uint8)
    assert store.get(_ABSENT) is None
    assert store.get_into(_ABSENT, buf, buf.copy()) is False
    assert store.contains(_ABSENT) is False


@pytest.mark.timeout(60)
def test_contains_delete_clear(store):
    rng = np.random.default_rng(4)
    blocks = [_block(rng, 8192) for _ in range(5)]
    for bid, k, v in blocks:
        store.put(bid, k, v)
    ids = [b[0] for b in blocks]
    assert all(store.contains(b) for b in ids)
    store.delete(ids[0])
    assert not store.contains(ids[0]) and store.get(ids[0]) is None
    store.delete(ids[0])          # deleting a missing id is not an error
    store.delete(_ABSENT)
    assert store.contains(ids[1])
    store.clear()
    assert not any(store.contains(b) for b in ids)
    assert store.get(ids[3]) is None


@pytest.mark.timeout(60)
def test_put_same_id_twice_keeps_one_good_copy(store):
    rng = np.random.default_rng(5)
    bid, k, v = _block(rng, 20000)
    store.put(bid, k, v)
    store.put(bid, k, v)
    store.flush()
    assert store.get(bid) == (k.tobytes(), v.tobytes())
    store.delete(bid)
    assert store.get(bid) is None


@pytest.mark.timeout(60)
def test_overflowing_capacity_never_returns_wrong_bytes(store):
    """Past capacity, an evicting system forgets blocks; a non-evicting one refuses them."""
    rng = np.random.default_rng(6)
    half = 256 << 10
    kept = []
    refused = 0
    for _ in range(3 * CAPACITY // (2 * half)):
        bid, k, v = _block(rng, half)
        try:
            store.put(bid, k, v)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
            refused += 1
            continue
        kept.append((bid, k, v))
    store.flush()
    if store.has_eviction:
        assert refused == 0
    else:
        assert refused > 0
    hits = 0
    for bid, k, v in kept:
        got = store.get(bid)
        if got is not None:
            hits += 1
            assert got == (k.tobytes(), v.tobytes()), bid
    assert hits > 0
    assert hits * 2 * half <= 1.05 * CAPACITY + (2 * half)


# -- servers: loopback only, stopped at close ------------------------------------------
def _listening_addresses(pid: int) -> list[str]:
    """Listening TCP addresses of ``pid`` as seen from this test's network namespace."""
    try:
        if os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net"):
            return []  # in a private namespace: unreachable from here by construction
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except (FileNotFoundError, PermissionError, ProcessLookupError):
        return []
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        with open(f"/proc/{pid}/net/{table}") as f:
            next(f)
            for line in f:
                cols = line.split()
                if cols[3] != "0A" or cols[9] not in inodes:  # 0A = LISTEN
                    continue
                addr_hex = cols[1].split(":")[0]
                raw = bytes.fromhex(addr_hex)
                if family == socket.AF_INET:
                    raw = raw[::-1]
                else:  # four little-endian 32-bit words
                    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                found.append(socket.inet_ntop(family, raw))
    return found


def _is_loopback(addr: str) -> bool:
    return addr.startswith("127.") or addr == "::1" or addr.startswith("::ffff:127.")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["redis", "redis_unix", "mooncake"])
def test_servers_listen_on_loopback_only_and_stop_at_close(name, tmp_path):
    try:
        store = load_adapter(name)
        store.initialize(16 << 20, str(tmp_path))
    except AdapterUnavailable as exc:
        if name in _required():
            pytest.fail(f"{name} is required but unavailable: {exc}")
        pytest.skip(f"{name}: {exc}")
    try:
        server_pids = store.server_pids()
        assert server_pids, f"{name} reports no server process"
        pids = list(server_pids)
        if name == "mooncake":
            pids.append(os.getpid())  # the in-process client's transfer engine
            assert store.describe()["network_isolation"].startswith("private"), store.describe()
        for pid in pids:
            exposed = [a for a in _listening_addresses(pid) if not _is_loopback(a)]
            assert not exposed, f"{name} pid {pid} listens on {exposed}"
    finally:
        store.close()
    assert store.server_pids() == []
    for pid in server_pids:
        assert not os.path.exists(f"/proc/{pid}") or _is_zombie(pid), f"{name} pid {pid} still runs"


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


# -- registry --------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_registry_names_and_cheap_availability_report():
    assert set(ADAPTER_NAMES) == {"cascade", "cascade_file", "lmcache_cpu", "lmcache_disk", "lmcache_disk_odirect",
                                  "lmcache_cpu_disk", "redis", "redis_unix", "hdf5", "hdf5_nocache", "mooncake", "pdc"}
    report = {name: (ok, reason) for name, ok, reason in available_adapters()}
    assert set(report) == set(ADAPTER_NAMES)
    for name, (ok, reason) in report.items():
        assert ok or reason, f"{name} is not ok but gives no reason"
    for name in _required():
        assert report[name][0], f"{name}: {report[name][1]}"
    with pytest.raises(KeyError):
        load_adapter("no_such_system")


def test_variants_name_their_family_and_carry_their_setting(tmp_path):
    """A variant is its family's adapter with one documented setting fixed: it reports its
    own name, the setting shows in describe(), and a caller cannot override the setting."""
    from benchmark.adapters import default_variants, family, variant_note

    expect = {"hdf5_nocache": ("hdf5", "rdcc_nbytes", 0), "redis_unix": ("redis", "unix_socket", True),
              "lmcache_disk_odirect": ("lmcache_disk", "use_odirect", True)}
    for name, (fam, option, value) in expect.items():
        assert family(name) == fam and family(fam) == fam and variant_note(name) and variant_note(fam)
        store = load_adapter(name)
        assert store.name == name and getattr(store, "_" + {"rdcc_nbytes": "rdcc"}.get(option, option)) == value
        with pytest.raises(TypeError, match="fixed by the adapter name"):
            load_adapter(name, **{option: value})
    assert default_variants(list(ADAPTER_NAMES)) == [n for n in ADAPTER_NAMES if n not in expect]
    assert family("cascade_lru") == "cascade_lru"  # names outside the registry are their own family


@pytest.mark.timeout(60)
def test_variant_settings_take_effect(tmp_path):
    """What each variant sets reaches the system: LMCache writes its files with O_DIRECT (none
    of their pages cached), HDF5 opens with no chunk cache, Redis answers on its Unix socket."""
    import numpy as np

    from benchmark.machine import files_under, resident_bytes

    ran = 0
    for name in ("lmcache_disk_odirect", "hdf5_nocache", "redis_unix"):
        try:
            store = load_adapter(name)
            store.initialize(CAPACITY, str(tmp_path / name))
        except AdapterUnavailable as exc:
            if name in _required():
                pytest.fail(f"{name} is required but unavailable: {exc}")
            continue
        try:
            rng = np.random.default_rng(3)
            bid, k, v = _block(rng, 1 << 20)
            store.put(bid, k, v)
            store.flush()
            desc = store.describe()
            if name == "lmcache_disk_odirect":
                files = [p for p in files_under(desc["disk_dir"]) if p.endswith(".pt")]
                assert files and desc["read_mode"] == "direct"
                assert resident_bytes(files)[0] == 0, "O_DIRECT writes left pages in the page cache"
            elif name == "hdf5_nocache":
                assert store._file.id.get_access_plist().get_cache()[2] == 0
            else:
                assert desc["unix_socket"] and store._client.connection_pool.connection_kwargs.get("path")
            got = store.get(bid)
            assert got is not None and got[1] == v.tobytes()
            ran += 1
        finally:
            store.close()
    if not ran:
        pytest.skip("no variant's system is installed here")


@pytest.mark.timeout(30)
def test_pdc_unavailable_says_why_and_writes_nothing(tmp_path):
    try:
        store = load_adapter("pdc")
    except AdapterUnavailable as exc:  # pragma: no cover - registry import failure
        pytest.fail(f"the pdc adapter module must import without PDC: {exc}")
    if store.probe() is None:
        pytest.skip("PDC is installed here; the contract tests cover it")
    with pytest.raises(AdapterUnavailable, match="Mercury"):
        store.initialize(1 << 20, str(tmp_path))
    store.close()
    assert os.listdir(tmp_path) == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", ["cascade", "cascade_file"])
def test_cascade_prepare_opens_the_store_before_any_put(name, tmp_path):
    """prepare() opens Cascade's store for the block size (the SHM slab prefaulted), so
    that the first put, timed by the benchmarks even at --warmup 0, pays for no set-up;
    a put of that size then uses that store."""
    size = 64 << 10
    with load_adapter(name) as store:
        store.initialize(4 * size, str(tmp_path))
        assert store.describe()["block_bytes"] is None
        store.prepare(size)
        desc = store.describe()
        assert desc["block_bytes"] == size and desc.get("read_mode", "buffered") == "buffered"
        bid, k, v = _block(np.random.default_rng(5), size // 2)
        store.put(bid, k, v)
        store.prepare(size)  # the same size again: the store and its blocks stay
        assert store.get(bid) == (k.tobytes(), v.tobytes())
        with pytest.raises(ValueError, match="equal size"):
            store.prepare(size + 1)


@pytest.mark.timeout(30)
def test_quick_check_refuses_unknown_names_and_bad_counts(capsys):
    from benchmark.adapters.__main__ import main

    for argv, message in ((["--quick", "nosuch"], "unknown adapters ['nosuch']; choose from cascade,"),
                          (["--quick", "cascade", "--blocks", "0"], "--blocks must be >= 1, got 0"),
                          (["--quick", "cascade", "--warmup", "-1"], "--warmup must be >= 0, got -1")):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2 and message in capsys.readouterr().err.splitlines()[-1]
