"""Hostile and careless input: planted blocks, bad arguments, use after close, restarts."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from cascade import CascadeStore, Config, ConfigError, InvalidBlock
from cascade.config import parse_size
from cascade.errors import BlockNotFound, StoreClosed
from cascade.testing.pids import invisible_pid
from cascade.tiers.file_tier import FileTier
from cascade.tiers.shm import ShmPeerSlabs, ShmTier, remove_stale_slabs


def _block(store, fill: int):
    k, v = store.spec.empty()
    k[...] = fill
    v[...] = fill + 1
    return k, v


def _file_only(tmp_path, **kw) -> Config:
    return Config(model="tiny", shm_bytes=0, file_bytes=256 * 8192, file_dir=str(tmp_path / "files"),
                  file_segment_bytes=1 << 20, **kw)


# -- item 7: planted blocks ----------------------------------------------------------------
def test_file_dir_writable_by_others_is_refused(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o777)
    with pytest.raises(ConfigError, match=f"chmod 700 {d}"):
        FileTier(1 << 20, str(d))
    os.chmod(d, 0o700)
    FileTier(1 << 20, str(d)).close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_file_dir_of_another_user_is_refused(tmp_path):
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)
    with pytest.raises(ConfigError, match="not by you"):
        CascadeStore(_file_only(tmp_path).replace(file_dir=str(d)))


def test_file_dir_under_a_shared_parent_and_missing_parents(tmp_path):
    shared = tmp_path / "open"
    shared.mkdir()
    os.chmod(shared, 0o777)  # others could rename our directory away: refused
    with pytest.raises(ConfigError, match="sticky"):
        FileTier(1 << 20, str(shared / "a" / "b"))
    assert not (shared / "a").exists()  # and no parent was created
    deep = tmp_path / "x" / "y" / "z"
    FileTier(1 << 20, str(deep)).close()
    for p in (tmp_path / "x", tmp_path / "x" / "y", deep):
        assert os.stat(p).st_mode & 0o777 == 0o700


def test_file_dir_symlink_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(ConfigError, match="symbolic link"):
        FileTier(1 << 20, str(link))


def test_record_copied_under_another_id_is_a_miss(tmp_path):
    cfg = _file_only(tmp_path)
    with CascadeStore(cfg) as store:
        a = store.put(*_block(store, 1))
        b = store.put(*_block(store, 2))
        files = sorted((tmp_path / "files").glob("agg_rank000_*.bin"))
    # Plant: rewrite b's header so it names a's id (with a valid header check: the
    # directory's own key, as someone who can write its files could read).
    from cascade.tiers.record_io import header_key
    from cascade.tiers.records import HEADER_BYTES, unpack_header

    path = files[0]
    key = header_key(str(path.parent))
    data = bytearray(path.read_bytes())
    offsets = []
    off = 0
    while off + HEADER_BYTES <= len(data):
        h = unpack_header(bytes(data[off:off + HEADER_BYTES]), key)
        if h is None:
            off += 4096
            continue
        offsets.append((off, h))
        off += h.record_bytes
    (off_a, ha), (off_b, hb) = [(o, h) for o, h in offsets if not h.tombstone][:2]
    assert (ha.block_id, hb.block_id) == (a, b)
    import dataclasses

    forged = dataclasses.replace(hb, block_id=a).pack(key)
    data[off_a:off_a + HEADER_BYTES] = forged  # a's header now fronts a copy of b's payload ...
    data[off_a + HEADER_BYTES:off_b] = data[off_b + HEADER_BYTES:off_b + HEADER_BYTES + (off_b - off_a - HEADER_BYTES)]
    path.write_bytes(bytes(data))
    with CascadeStore(cfg) as store:
        # ... but its checksum is bound to b's (namespace, id): a's lookup is a miss, not b's bytes.
        assert store.get(a) is None
        k, v = store.get(b)
        assert (k == 2).all()


def test_a_header_planted_in_a_payload_is_not_adopted_after_a_damaged_header(tmp_path):
    """A tenant's payload may hold bytes that look like a whole record of another
    namespace, both checksums right (the format is public); a damaged header before it
    makes the restart scan resynchronise page by page through that payload. The planted
    header fails the directory's keyed check: the other namespace reads nothing, and the
    records after the damage are adopted."""
    import xxhash

    from cascade import BlockSpec
    from cascade.tiers.record_io import header_key
    from cascade.tiers.records import HEADER_BYTES, RecordHeader, key_seed

    spec = BlockSpec.flat(64 << 10)
    cfg = Config(shm_bytes=0, remote_bytes=0, file_bytes=8 << 20, file_dir=str(tmp_path / "files"))
    rng = np.random.default_rng(3)
    victim_id, first, second = "77" * 16, "a1" * 16, "a2" * 16
    payload = bytearray(rng.integers(0, 256, spec.block_bytes, dtype=np.uint8).tobytes())
    planted = bytes(payload[2 * HEADER_BYTES:]) + bytes(2 * HEADER_BYTES)  # what the scan would take as its payload
    guess = 0x5EED  # the key a planter must guess
    payload[HEADER_BYTES:2 * HEADER_BYTES] = RecordHeader(
        "victim", victim_id, len(planted), xxhash.xxh3_64_intdigest(planted, seed=key_seed("victim", victim_id))
    ).pack(guess)
    other = rng.integers(0, 256, spec.block_bytes, dtype=np.uint8)
    half = spec.block_bytes // 2
    with CascadeStore(cfg, block_spec=spec) as store:
        store.put(np.frombuffer(payload[:half], np.uint8), np.frombuffer(payload[half:], np.uint8),
                  block_id=first, namespace="tenant")
        store.put(other[:half], other[half:], block_id=second, namespace="tenant")
        path = store.tiers[0].record_span(("tenant", first))[0]
    assert header_key(str(tmp_path / "files")) != guess
    with open(path, "r+b") as f:  # one flipped bit in the first record's header
        f.seek(12)
        byte = f.read(1)
        f.seek(12)
        f.write(bytes([byte[0] ^ 1]))
    with CascadeStore(cfg, block_spec=spec) as store:
        k, v = spec.empty()
        assert not store.get_into(victim_id, k, v, namespace="victim")
        assert not store.get_into(first, k, v, namespace="tenant")  # its header is damaged: lost
        assert store.get_into(second, k, v, namespace="tenant") and np.array_equal(np.concatenate([k, v]), other)
        assert store.stats()["tiers"]["file"]["bad_headers"] == 1 + spec.block_bytes // HEADER_BYTES


def test_the_header_key_is_made_once_private_and_a_damaged_one_is_refused(tmp_path):
    from cascade.tiers.record_io import HEADER_KEY_FILE, header_key

    cfg = _file_only(tmp_path)
    with CascadeStore(cfg) as store:
        b = store.put(*_block(store, 5))
    path = tmp_path / "files" / HEADER_KEY_FILE
    assert path.stat().st_mode & 0o777 == 0o600
    key = header_key(str(tmp_path / "files"))
    with CascadeStore(cfg) as store:  # the same key: the records read back
        assert header_key(str(tmp_path / "files")) == key and (store.get(b)[0] == 5).all()
    path.write_bytes(b"short")
    with pytest.raises(ConfigError, match="header key"):
        CascadeStore(cfg)


def test_a_header_key_that_cannot_be_made_leaves_nothing_behind_and_names_its_path(tmp_path, monkeypatch):
    import errno
    import os

    cfg = _file_only(tmp_path)
    sync = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    for _ in range(2):
        with pytest.raises(ConfigError, match="cannot make .*header.key: No space left on device"):
            CascadeStore(cfg)
    monkeypatch.setattr(os, "fsync", sync)
    assert not [n for n in os.listdir(tmp_path / "files") if n.startswith("header.key")]
    with CascadeStore(cfg) as store:  # with room again, it is made
        assert (store.get(store.put(*_block(store, 5)))[0] == 5).all()


def test_a_file_dir_below_a_regular_file_is_refused_as_a_directory_not_as_a_manifest(tmp_path):
    (tmp_path / "afile").write_bytes(b"")
    cfg = _file_only(tmp_path).replace(file_dir=str(tmp_path / "afile" / "sub"))
    with pytest.raises(ConfigError, match="file_dir: cannot create .*Not a directory; choose another directory"):
        CascadeStore(cfg)


def test_a_file_of_an_earlier_record_format_is_dropped_whole(tmp_path):
    cfg = _file_only(tmp_path)
    with CascadeStore(cfg) as store:
        b = store.put(*_block(store, 5))
    old = tmp_path / "files" / "agg_rank000_000009.bin"
    old.write_bytes(b"CASCREC2" + bytes(3 * 4096))
    with CascadeStore(cfg) as store:
        file = store.stats()["tiers"]["file"]
        assert (file["old_files"], file["bad_headers"]) == (1, 0)
        assert not old.exists() and (store.get(b)[0] == 5).all()


def test_put_never_dedups_onto_a_planted_record(tmp_path):
    cfg = _file_only(tmp_path)
    with CascadeStore(cfg) as store:
        k, v = _block(store, 7)
        bid = store.put(k, v, block_id="ab" * 16)  # stands for a record someone else wrote
    with CascadeStore(cfg) as store:
        k2, v2 = _block(store, 9)  # the victim's real bytes under that id
        assert store.put(k2, v2, block_id="ab" * 16) == bid
        assert store.stats()["replaced_unconfirmed"] == 1
        got_k, got_v = store.get(bid)
        assert (got_k == 9).all() and (got_v == 10).all()
        assert store.put(k2, v2, block_id="ab" * 16) == bid  # now confirmed: a plain dedup
        assert store.stats()["deduped"] == 1


def test_files_replaced_by_directories_or_symlinks_are_skipped(tmp_path):
    cfg = _file_only(tmp_path)
    with CascadeStore(cfg) as store:
        store.put(*_block(store, 1))
    d = tmp_path / "files"
    (d / "agg_rank000_000050.bin").mkdir()
    target = tmp_path / "elsewhere.bin"
    target.write_bytes(b"x" * 8192)
    (d / "agg_rank000_000051.bin").symlink_to(target)
    with CascadeStore(cfg) as store:
        assert len(store) == 1
        assert store.stats()["tiers"]["file"]["bad_files"] == 2
        store.put(*_block(store, 3))  # the active file is a new one, not the planted names
    assert target.read_bytes() == b"x" * 8192


# -- item 8: validation --------------------------------------------------------------------
@pytest.mark.parametrize("priority", [1024, 65, -65, 1.5, True, None, "3", float("nan")])
def test_bad_priority_stores_nothing(tiny_config, priority):
    with CascadeStore(tiny_config) as store:
        with pytest.raises(InvalidBlock, match="priority"):
            store.put(*_block(store, 1), priority=priority)
        assert len(store) == 0 and store.stats()["puts"] == 0
        bid = store.put(*_block(store, 1), priority=64)
        with pytest.raises(InvalidBlock, match="priority"):
            store.set_priority(bid, priority)


@pytest.mark.parametrize("ttl", ["10", -1, float("nan"), float("inf"), True, [1]])
def test_bad_ttl_stores_nothing(tiny_config, ttl):
    with CascadeStore(tiny_config) as store:
        with pytest.raises(InvalidBlock, match="ttl"):
            store.put(*_block(store, 1), ttl=ttl)
        assert len(store) == 0
        bid = store.put(*_block(store, 1), ttl=np.float32(2.5))
        with pytest.raises(InvalidBlock, match="ttl"):
            store.set_ttl(bid, ttl)
        with pytest.raises(InvalidBlock, match="ttl"):
            store.set_ttl(bid, None)


@pytest.mark.parametrize("kwargs,match", [
    ({"shm_bytez": 1}, "shm_bytez"), ({"file_dir": ""}, "file_dir"), ({"file_dir": "   "}, "file_dir"),
    ({"stats_interval": float("nan")}, "stats_interval"), ({"stats_interval": -1}, "stats_interval"),
    ({"stats_interval": 0}, "stats_interval"), ({"default_ttl": float("nan")}, "default_ttl"),
    ({"default_ttl": "inf"}, "default_ttl"), ({"compact_dead_fraction": float("nan")}, "compact_dead_fraction"),
    # values that used to fail late (OOM, offsets past 40 bits, lfs refusing) or bound nothing
    ({"compact_dead_fraction": 1.0}, "compact_dead_fraction"), ({"directory_slots": int(2e8)}, "directory_slots"),
    ({"file_segment_bytes": "2T"}, "file_segment_bytes"), ({"lustre_stripe_size": 0}, "lustre_stripe_size"),
    ({"lustre_stripe_size": "100K"}, "lustre_stripe_size"), ({"lustre_stripe_size": "4G"}, "lustre_stripe_size"),
    ({"lustre_stripe_count": 5000}, "lustre_stripe_count"),
])
def test_bad_config_values_are_config_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        Config(**kwargs)


def test_file_dir_that_is_a_file(tmp_path):
    f = tmp_path / "afile"
    f.write_text("")
    with pytest.raises(ConfigError, match="not a directory"):
        Config(file_dir=str(f))


@pytest.mark.parametrize("text", ["1iB", "4KB B", "1e3", "K", "1.5", "4 KiBB", "-1K", "0x10"])
def test_strict_size_grammar(text):
    with pytest.raises(ConfigError):
        parse_size(text)


@pytest.mark.parametrize("text,expected", [("123", 123), ("4K", 4096), ("4KiB", 4096), ("4kb", 4096),
                                           ("4G", 4 << 30), ("1.5G", 3 << 29), ("8B", 8), ("0.5K", 512)])
def test_size_grammar_accepts(text, expected):
    assert parse_size(text) == expected


def test_every_call_after_close_is_store_closed(tiny_config):
    store = CascadeStore(tiny_config)
    k, v = _block(store, 1)
    bid = store.put(k, v)
    store.close()
    store.close()  # idempotent
    calls = [lambda: store.put(k, v), lambda: store.get(bid), lambda: store.get_into(bid, k, v),
             lambda: store.contains(bid), lambda: store.delete(bid), lambda: store.pin(bid),
             lambda: store.unpin(bid), lambda: store.set_ttl(bid, 1), lambda: store.set_priority(bid, 1),
             lambda: store.longest_prefix([bid]), lambda: store.stats(), lambda: store.flush(),
             lambda: store.clear(), lambda: store.get_many([bid]), lambda: store.put_many([(k, v)])]
    for call in calls:
        with pytest.raises(StoreClosed):
            call()


def test_file_ids_past_999999_survive_restart(tmp_path):
    d = str(tmp_path / "files")
    block = np.full(600 << 10, 3, dtype=np.uint8)
    keys = [("default", f"{i:032x}") for i in range(5)]
    tier = FileTier(1 << 24, d)
    tier.put(keys[0], [block])
    tier.close()
    os.rename(os.path.join(d, "agg_rank000_000001.bin"), os.path.join(d, "agg_rank000_999999.bin"))
    tier = FileTier(1 << 24, d, segment_bytes=1 << 20)
    for key in keys[1:]:  # 600 KiB records in 1 MiB segments: rolls to file 1000000 and beyond
        tier.put(key, [block])
    assert any(f.file_id >= 1_000_000 for f in tier._files.values())
    tier.close()
    tier = FileTier(1 << 24, d, segment_bytes=1 << 20)
    assert sorted(tier) == sorted(keys)
    out = np.empty_like(block)
    tier.read_parts_into(keys[-1], [out])
    assert (out == 3).all()
    tier.close()


def test_ttl_is_persisted_and_wall_clock_based(tmp_path):
    cfg = _file_only(tmp_path)
    with CascadeStore(cfg) as store:
        short = store.put(*_block(store, 1), ttl=0.3)
        long = store.put(*_block(store, 2), ttl=3600)
        later = store.put(*_block(store, 3))
        store.set_ttl(later, 0.3)  # set after the put: persisted too
        forever = store.put(*_block(store, 4))
    time.sleep(0.5)
    with CascadeStore(cfg) as store:
        assert store.get(short) is None and store.get(later) is None
        assert store.get(long) is not None and store.get(forever) is not None
        assert store.stats()["expired"] == 2


def test_ttl_survives_demotion_to_the_file_tier(tmp_path):
    cfg = Config(model="tiny", shm_bytes=2 * 4096, file_bytes=256 * 8192, file_dir=str(tmp_path / "files"),
                 file_segment_bytes=1 << 20)
    with CascadeStore(cfg) as store:
        first = store.put(*_block(store, 1), ttl=0.3)
        for i in range(2, 8):  # push `first` down to the file tier
            store.put(*_block(store, i))
        assert store.stats()["tiers"]["file"]["blocks"] >= 1
        store.flush()
    time.sleep(0.5)
    with CascadeStore(cfg) as store:
        assert store.get(first) is None



def test_reads_keep_a_last_use_ttl_alive_across_a_restart(tmp_path):
    """ttl_mode=last_use: the expiry a read moves is written to disk (in batches, not
    once per read), so a restart keeps a block that reads kept alive."""
    cfg = _file_only(tmp_path)
    assert cfg.ttl_mode == "last_use"
    with CascadeStore(cfg) as store:
        bid = store.put(*_block(store, 1), ttl=3.0)
        time.sleep(2.0)
        assert store.get(bid) is not None  # expires 3 s from now, no longer 1 s from now
        before = store.stats()["tiers"]["file"]["expiry_writes"]
        for _ in range(100):
            assert store.get(bid) is not None
        assert store.stats()["tiers"]["file"]["expiry_writes"] - before <= 10  # not one write per read
    time.sleep(1.5)  # past the expiry the put wrote (3 s after it), before the refreshed one (5 s)
    with CascadeStore(cfg) as store:
        assert store.get(bid) is not None


# -- issue 21: shared /dev/shm, planted names, lazy SHM ------------------------------------
def test_stale_slab_cleanup_keeps_slabs_locked_by_another_pid_namespace(tmp_path):
    d = tmp_path / "shm"
    d.mkdir(mode=0o700)
    pid = invisible_pid()
    live, stale = d / f"cascade-{pid}-{'a' * 32}", d / f"cascade-{pid}-{'b' * 32}"
    live.write_bytes(b"\0" * 4096)
    stale.write_bytes(b"\0" * 4096)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, sys
        fd = os.open({str(live)!r}, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("locked", flush=True)
        sys.stdin.read()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        removed = remove_stale_slabs(str(d))
        assert removed == [str(stale)]  # the unlocked one of a dead process goes
        assert live.exists()  # the one its owner holds stays, though its PID is not visible
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert remove_stale_slabs(str(d)) == [str(live)]  # once released, it is stale too


def test_a_vanished_peer_slab_is_a_miss(tmp_path):
    peers = ShmPeerSlabs()
    out = bytearray(64)
    with pytest.raises(BlockNotFound):
        peers.read_into(str(tmp_path / ("cascade-1-" + "0" * 32)), 0, [out])
    (tmp_path / "shm").mkdir(mode=0o700)
    tier = ShmTier(1 << 20, str(tmp_path / "shm"))
    with pytest.raises(BlockNotFound):  # past its end: an owner that restarted smaller
        peers.read_into(tier.path, (1 << 20) - 32, [out])
    tier.close()
    peers.close()


@pytest.mark.parametrize("kind", ["shared", "symlink", "foreign"])
def test_shm_dir_gets_the_same_privacy_checks_as_file_dir(tmp_path, kind):
    target = tmp_path / "real"
    target.mkdir(mode=0o700)
    shm = tmp_path / "shm"
    if kind == "shared":
        shm.mkdir()
        shm.chmod(0o777)
    elif kind == "symlink":
        shm.symlink_to(target)
    else:
        shm.mkdir(mode=0o700)
        os.chown(shm, 12345, 12345) if os.geteuid() == 0 else pytest.skip("chown needs root")
    cfg = Config(model="tiny", shm_bytes=1 << 20, shm_dir=str(shm), file_bytes=0)
    with pytest.raises(ConfigError, match="shm_dir"):
        CascadeStore(cfg)
    assert os.listdir(target) == []


def test_a_shared_sticky_shm_dir_stands_for_a_private_subdirectory(tmp_path):
    """shm_dir = /dev/shm (the old default, sticky and writable by all): the slab goes to
    /dev/shm-like/cascade-<uid>, created 0700, never into the shared directory itself."""
    shared = tmp_path / "shm"
    shared.mkdir()
    shared.chmod(0o1777)
    cfg = Config(model="tiny", shm_bytes=1 << 20, shm_dir=str(shared), file_bytes=0)
    with CascadeStore(cfg) as store:
        private = shared / f"cascade-{os.getuid()}"
        assert os.path.dirname(store.tiers[0].path) == str(private)
        assert private.stat().st_mode & 0o777 == 0o700
        assert [p.name for p in shared.iterdir()] == [private.name]


def test_shm_tier_commits_memory_lazily(tmp_path):
    capacity = 256 << 20
    (tmp_path / "shm").mkdir(mode=0o700)
    tier = ShmTier(capacity, str(tmp_path / "shm"))
    try:
        assert os.stat(tier.path).st_blocks == 0  # an empty tier holds no memory
        tier.put(("ns", "0" * 32), [bytes(4096)])
        held = os.stat(tier.path).st_blocks * 512
        assert 4096 <= held <= tier.stats()["backed_bytes"] < capacity
    finally:
        tier.close()


def test_a_planted_file_just_above_the_last_record_file_does_not_block_opening(tmp_path):
    cfg = _file_only(tmp_path)
    with CascadeStore(cfg) as store:
        bid = store.put(*_block(store, 1))
    d = tmp_path / "files"
    files = sorted(p.name for p in d.glob("agg_rank000_*.bin"))
    last = int(files[-1][len("agg_rank000_"):-len(".bin")])
    (d / f"agg_rank000_{last + 1:06d}.bin").symlink_to(tmp_path / "elsewhere.bin")
    (d / f"agg_rank000_{last + 2:06d}.bin").mkdir()
    with CascadeStore(cfg) as store:  # the new active file takes an id above every name seen
        assert store.get(bid) is not None
        store.put(*_block(store, 2))
    assert not (tmp_path / "elsewhere.bin").exists()
