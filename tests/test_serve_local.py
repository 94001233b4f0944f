"""The rank server and its client in one process (no MPI): the store's API and errors
through the channel, batches larger than the staging region, per-client pins and hints,
socket paths. The multi-rank runs are in tests/test_serve.py."""
from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading

import numpy as np
import pytest

from cascade import (BlockNotFound, BlockPinned, CascadeStore, Config, ConfigError, InvalidBlock, RankFailure,
                     connect)
from cascade.errors import StoreClosed
from cascade.models import BlockSpec
from cascade.serve import attached as attached_module
from cascade.serve import client as client_module
from cascade.serve import protocol
from cascade.serve.attached import AttachedStore
from cascade.serve.paths import MAX_SOCKET_PATH, resolve_endpoint, socket_path
from cascade.serve.server import RankServer

SPEC = BlockSpec.flat(8192)


@pytest.fixture
def served(tmp_path):
    socket_dir = tempfile.mkdtemp(prefix="cs-", dir="/tmp")
    store = CascadeStore(Config(shm_bytes=1 << 20, file_bytes=0, shm_dir=str(tmp_path)), block_spec=SPEC)
    server = RankServer(store, socket_dir, 0)
    yield store, server
    server.close()
    store.close()
    os.rmdir(socket_dir)


def _eventually(check, tries: int = 1000) -> bool:
    """Whether ``check()`` holds within ``tries`` polls (the rank's thread acts on its own)."""
    for _ in range(tries):
        if check():
            return True
        threading.Event().wait(0.01)
    return False


def _blocks(n, seed=0):
    rng = np.random.default_rng(seed)
    return [tuple(rng.integers(0, 256, SPEC.shape, dtype=np.uint8) for _ in range(2)) for _ in range(n)]


def test_batches_larger_than_the_staging_region_round_trip_byte_exact(served):
    store, server = served
    with connect(server.path, staging_bytes=3 * 8192) as client:  # 3 slots: 10 blocks take 4 requests
        pairs = _blocks(10)
        ids = client.put_many(pairs, chain=True)
        assert ids == store.put_many(pairs, chain=True)  # same content ids as in-process (dedup there)
        assert client.longest_prefix(ids) == 10 and client.longest_prefix(ids[:3] + ["0" * 32]) == 3
        got = client.get_many(ids + ["f" * 32])
        assert got[-1] is None
        assert all(np.array_equal(g[0], k) and np.array_equal(g[1], v) for g, (k, v) in zip(got, pairs))
        assert len(client) == len(store) == 10


def test_the_stores_errors_come_back_as_the_same_classes(served):
    store, server = served
    with connect(server.path) as client:
        k, v = SPEC.empty()
        with pytest.raises(InvalidBlock, match="shape"):  # checked in the client, as by the store
            client.put(np.zeros(3, np.uint8), v)
        with pytest.raises(InvalidBlock, match="malformed block id"):  # checked by the rank's store
            client.get_into("zz", k, v)
        with pytest.raises(BlockNotFound):
            client.pin("a" * 32)
        with pytest.raises(BlockNotFound):
            client.delete("a" * 32)
        block_id = client.put(k, v)
        with pytest.raises(BlockPinned):  # this client holds no pin of it
            client.unpin(block_id)
        client.pin(block_id)
        with pytest.raises(BlockPinned):  # the store refuses deleting a pinned block
            client.delete(block_id)
    with pytest.raises(StoreClosed):
        client.contains(block_id)


def test_a_clients_pins_and_hints_are_its_own_and_go_when_it_leaves(served):
    store, server = served
    (k, v), = _blocks(1)
    block_id = store.put(k, v)
    first, second = connect(server.path), connect(server.path)
    first.pin(block_id)
    assert first.hint([block_id]) == 1
    with pytest.raises(BlockPinned):
        second.unpin(block_id)  # not its pin
    assert second.unhint([block_id]) == 0  # not its hint
    serve = second.stats()["serve"]
    assert (serve["clients"], serve["client_pins"], serve["client_hints"]) == (2, 1, 1)
    first.close()  # the rank gives back its pin and hint once it sees the hang-up
    assert _eventually(lambda: server.serve_stats()["clients"] == 1)
    assert server.serve_stats()["client_pins"] == 0 and server.serve_stats()["client_hints"] == 0
    store.delete(block_id)  # unpinned now
    assert store.stats()["hinted_bytes"] == 0
    second.close()


def test_a_gone_rank_is_a_rank_failure_and_a_miss_for_attached_stores(tmp_path):
    socket_dir = tempfile.mkdtemp(prefix="cs-", dir="/tmp")
    store = CascadeStore(Config(shm_bytes=1 << 20, file_bytes=0, shm_dir=str(tmp_path)), block_spec=SPEC)
    server = RankServer(store, socket_dir, 0)
    client = connect("auto", socket_dir=socket_dir)  # the node's only rank
    attached = AttachedStore("auto", socket_dir=socket_dir, retry_seconds=3600)
    k, v = SPEC.empty()
    block_id = attached.put(k, v)
    assert attached.contains(block_id) and attached.get_into(block_id, k, v)
    server.close()
    with pytest.raises(RankFailure, match="is gone"):
        client.contains(block_id)
    assert attached.contains(block_id) is False and attached.get_into(block_id, k, v) is False
    with pytest.raises(BlockNotFound):
        attached.pin(block_id)
    with pytest.raises(RankFailure):
        attached.put(k, v)
    store.close()
    with pytest.raises(RankFailure, match="no Cascade rank socket"):
        connect("auto", socket_dir=socket_dir)
    os.rmdir(socket_dir)


def test_one_socket_one_rank_and_paths_that_cannot_be_sockets(served, tmp_path):
    store, server = served
    with pytest.raises(ConfigError, match="already serves"):
        RankServer(store, os.path.dirname(server.path), 0)
    deep = "/tmp/" + "d" * (MAX_SOCKET_PATH - 10)
    with pytest.raises(ConfigError, match="shorter --socket-dir"):
        socket_path(deep, 0)
    with pytest.raises(ConfigError, match="at most 107"):
        resolve_endpoint(deep + "/r0.sock")
    with pytest.raises(ConfigError, match="holds no block"):
        connect(server.path, staging_bytes=100)


def _raw_session(path: str) -> socket.socket:
    """A connection to the rank past its hello (1 MiB of staging), speaking raw frames."""
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.connect(path)
    protocol.send(raw, {"op": "hello", "version": protocol.VERSION, "staging_bytes": 1 << 20})
    assert protocol.recv(raw)["ok"]
    os.close(socket.recv_fds(raw, 1, 1)[1][0])
    return raw


def test_a_malformed_request_is_refused_and_a_broken_frame_ends_only_that_client(served):
    store, server = served
    with connect(server.path) as good:
        raw = _raw_session(server.path)
        protocol.send(raw, {"op": "put", "ns": "default", "slot": 999})  # the region has 128 slots
        reply = protocol.recv(raw)
        assert reply["error"] == "InvalidBlock" and "slot 999" in reply["message"]
        raw.sendall(b"\xff\xff\xff\x7f")  # a frame longer than allowed: the rank hangs up
        assert raw.recv(1) == b""
        raw.close()
        assert good.contains_many(["a" * 32]) == [False]  # other clients carry on


def test_cascade_serve_refuses_a_socket_dir_too_long_before_opening_anything(tmp_path):
    long_dir = "/tmp/" + "s" * 110
    done = subprocess.run([sys.executable, "-m", "cascade", "serve", "--socket-dir", long_dir, "--block-bytes", "8192",
                           "--set", "file_bytes=0", "--set", "shm_bytes=1M", "--set", f"shm_dir={tmp_path}"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(__file__))})
    assert done.returncode == 2 and "Unix sockets allow at most 107" in done.stderr, done.stderr
    assert not os.path.exists(long_dir) and os.listdir(tmp_path) == []  # no directory, no SHM slab


def test_a_client_stalled_mid_request_does_not_hold_up_another(served):
    store, server = served
    stalled = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stalled.connect(server.path)
    protocol.send(stalled, {"op": "hello", "version": protocol.VERSION, "staging_bytes": 1 << 20})
    protocol.recv(stalled)
    os.close(socket.recv_fds(stalled, 1, 1)[1][0])
    stalled.sendall(b"\x40\x00")  # half a length prefix: its thread now waits for the rest
    with connect(server.path, timeout=30) as other:  # a hang here would be a RankFailure (timeout)
        (k, v), = _blocks(1)
        block_id = other.put(k, v)
        assert other.get(block_id) is not None and other.stats()["serve"]["clients"] == 2
    stalled.close()


def test_torch_bfloat16_tensors_go_through_the_client_like_through_the_store(tmp_path):
    torch = pytest.importorskip("torch")
    spec = BlockSpec((2, 2, 4, 8), "bfloat16")
    socket_dir = tempfile.mkdtemp(prefix="cs-", dir="/tmp")
    store = CascadeStore(Config(shm_bytes=1 << 20, file_bytes=0, shm_dir=str(tmp_path)), block_spec=spec)
    server = RankServer(store, socket_dir, 0)
    try:
        with connect(server.path) as client:
            assert client.spec == spec
            key = torch.randn(spec.shape, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
            value = torch.randn(spec.shape, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
            block_id = client.put(key, value)
            k_out, v_out = torch.empty(spec.shape, dtype=torch.bfloat16), torch.empty(spec.shape, dtype=torch.bfloat16)
            assert client.get_into(block_id, k_out, v_out)
            assert torch.equal(k_out.view(torch.int16), key.view(torch.int16))
            assert torch.equal(v_out.view(torch.int16), value.view(torch.int16))
            with pytest.raises(InvalidBlock, match="dtype"):  # the store's check, in the client
                client.put(key.to(torch.float16), value)
    finally:
        server.close()
        store.close()
        os.rmdir(socket_dir)


def test_reads_come_straight_from_the_ranks_slab_under_a_lease_until_the_next_request(served):
    store, server = served
    (k, v), = _blocks(1)
    with connect(server.path) as client:
        block_id = client.put(k, v)
        (key, value), missing = client.views([block_id, "f" * 32])
        assert missing is None and np.array_equal(key, k) and np.array_equal(value, v)
        assert not key.flags.writeable  # the slab is mapped read-only
        with pytest.raises(ValueError):
            key[0] = 1
        assert server.serve_stats()["client_leases"] == 1
        store.delete(block_id)  # deleted on the rank, and the slab then filled with other blocks
        for pair in _blocks(200, seed=1):
            store.put(*pair)
        assert np.array_equal(key, k) and np.array_equal(value, v)  # its bytes stayed in place
        assert client.stats()["serve"]["client_leases"] == 0  # that request gave the lease back
        out = SPEC.empty()
        assert client.get_into(store.put(k, v), *out) and np.array_equal(out[0], k) and np.array_equal(out[1], v)


def test_a_client_killed_while_holding_a_lease_leaks_nothing(served):
    store, server = served
    (k, v), = _blocks(1)
    block_id = store.put(k, v)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, cascade; c = cascade.connect(sys.argv[1]); "
         "assert c.views([sys.argv[2]])[0] is not None; print('leased', flush=True); sys.stdin.read()",
         server.path, block_id], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(__file__))})
    try:
        assert holder.stdout.readline().strip() == "leased"
        assert server.serve_stats()["client_leases"] == 1
        holder.kill()  # SIGKILL: no goodbye
        holder.wait(30)
        assert _eventually(lambda: server.serve_stats()["clients"] == 0)
        assert server.serve_stats()["client_leases"] == 0
        store.delete(block_id)
        assert store.stats()["tiers"]["shm"]["allocated"] == 0  # no lease holds its slot
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(30)


def test_blocks_outside_the_slab_come_through_staging(tmp_path):
    socket_dir = tempfile.mkdtemp(prefix="cs-", dir="/tmp")
    files = Config(shm_bytes=0, file_bytes=4 << 20, file_dir=str(tmp_path / "files"))
    both = Config(shm_bytes=SPEC.block_bytes * 4, file_bytes=4 << 20, file_dir=str(tmp_path / "both"),
                  shm_dir=str(tmp_path))
    for config in (files, both):  # no slab at all; a slab too small for every block
        store = CascadeStore(config, block_spec=SPEC)
        server = RankServer(store, socket_dir, 0)
        try:
            with connect(server.path) as client:
                pairs = _blocks(12, seed=2)
                ids = client.put_many(pairs)
                assert server.serve_stats()["client_leases"] == 0
                views = client.views(ids)
                assert all(not k.flags.writeable and np.array_equal(k, p[0]) and np.array_equal(v, p[1])
                           for (k, v), p in zip(views, pairs))
                got = client.get_many(ids)
                assert all(np.array_equal(g[0], p[0]) and np.array_equal(g[1], p[1]) for g, p in zip(got, pairs))
        finally:
            server.close()
            store.close()
    os.rmdir(socket_dir)


def test_a_read_in_place_uses_up_the_clients_hint(served):
    store, server = served
    (k, v), = _blocks(1)
    with connect(server.path) as client:
        block_id = client.put(k, v)
        assert client.hint([block_id]) == 1 and server.serve_stats()["client_hints"] == 1
        assert client.get(block_id) is not None  # the queued request came: its hint is used up
        assert server.serve_stats()["client_hints"] == 0 and store.stats()["hinted_bytes"] == 0


def test_an_interrupted_call_drops_the_connection_instead_of_reading_its_reply_later(served):
    store, server = served
    (ka, va), (kb, vb) = _blocks(2, seed=5)
    a, b = store.put(ka, va), store.put(kb, vb)
    entered, release = threading.Event(), threading.Event()
    view = store.view

    def slow_view(*args, **kwargs):  # the rank takes its time over the first request
        entered.set()
        release.wait(10)
        return view(*args, **kwargs)

    store.view = slow_view
    client = connect(server.path, timeout=30)
    real_recv = protocol.recv

    caller = threading.get_ident()

    def interrupted_recv(sock):  # Ctrl-C while the client waits for the reply (the rank's threads read on)
        if threading.get_ident() != caller:
            return real_recv(sock)
        entered.wait(10)
        raise KeyboardInterrupt

    protocol.recv = interrupted_recv
    try:
        with pytest.raises(KeyboardInterrupt):
            client.views([a])
    finally:
        protocol.recv = real_recv
        release.set()
        store.view = view
    with pytest.raises(RankFailure, match="earlier call failed"):  # never A's reply as B's
        client.views([b])
    with connect(server.path) as again:
        (k, v), = again.views([b])
        assert np.array_equal(k, kb) and np.array_equal(v, vb)
    client.close()


def test_a_request_over_the_frame_limit_is_invalid_and_keeps_the_connection(served):
    store, server = served
    (k, v), = _blocks(1)
    block_id = store.put(k, v)
    many = [f"{i:032x}" for i in range(protocol.MAX_FRAME // 32)]
    with connect(server.path) as client:
        client.pin(block_id)
        with pytest.raises(InvalidBlock, match="frame limit"):
            client.contains_many(many)
        assert client.contains_many([block_id]) == [True]  # the same connection, its pin kept
        with pytest.raises(BlockPinned):
            store.delete(block_id)
        client.unpin(block_id)


def test_unhint_withdraws_no_more_hints_than_the_client_took(served):
    store, server = served
    (k, v), = _blocks(1)
    block_id = store.put(k, v)
    with connect(server.path) as first, connect(server.path) as second:
        assert first.hint([block_id]) == 1 and second.hint([block_id]) == 1
        assert first.unhint([block_id, block_id]) == 1  # one of its own, not the other's
        assert store.stats()["hinted_bytes"] == SPEC.block_bytes
        assert first.hint([block_id]) == 1 and first.unhint([block_id]) == 1  # its count is still right
        assert second.unhint([block_id]) == 1 and store.stats()["hinted_bytes"] == 0


def test_arrays_of_views_put_back_store_their_own_bytes(tmp_path):
    socket_dir = tempfile.mkdtemp(prefix="cs-", dir="/tmp")
    store = CascadeStore(Config(shm_bytes=0, file_bytes=4 << 20, file_dir=str(tmp_path / "f")), block_spec=SPEC)
    server = RankServer(store, socket_dir, 0)  # no slab: views are staging slots
    try:
        with connect(server.path) as client:
            pairs = _blocks(2, seed=7)
            x, y = client.put_many(pairs)
            (kx, vx), (ky, vy) = client.views([x, y])
            copies = client.put_many([(ky, vy), (kx, vx)], namespace="copy")  # slots refilled in another order
            assert copies == [y, x]
            got = client.get_many([y, x], namespace="copy")
            assert all(np.array_equal(g[0], p[0]) and np.array_equal(g[1], p[1]) for g, p in zip(got, pairs[::-1]))
    finally:
        server.close()
        store.close()
    os.rmdir(socket_dir)


def test_an_attached_store_takes_iterators_and_a_refused_reattach_is_a_miss(tmp_path):
    socket_dir = tempfile.mkdtemp(prefix="cs-", dir="/tmp")
    store = CascadeStore(Config(shm_bytes=1 << 20, file_bytes=0, shm_dir=str(tmp_path)), block_spec=SPEC)
    server = RankServer(store, socket_dir, 0)
    attached = AttachedStore("auto", socket_dir=socket_dir, retry_seconds=0, staging_bytes=2 * SPEC.block_bytes)
    pairs = _blocks(3, seed=9)
    ids = attached.put_many(iter(pairs))
    assert len(ids) == 3 and all(store.contains(b) for b in ids)
    outs = [SPEC.empty() for _ in ids]
    assert attached.get_many_into(iter(ids), iter(outs)) == [True] * 3
    server.close()
    store.close()
    bigger = BlockSpec.flat(4 * SPEC.block_bytes)  # the rank back with blocks its staging cannot hold
    store = CascadeStore(Config(shm_bytes=1 << 20, file_bytes=0, shm_dir=str(tmp_path)), block_spec=bigger)
    server = RankServer(store, socket_dir, 0)
    try:
        k, v = SPEC.empty()
        assert attached.contains(ids[0]) is False and attached.get_into(ids[0], k, v) is False
    finally:
        attached.close()
        server.close()
        store.close()
    os.rmdir(socket_dir)


def test_hellos_and_requests_the_rank_cannot_take_get_an_error_reply_and_others_carry_on(served, tmp_path):
    store, server = served
    with pytest.raises(ConfigError, match="staging_bytes"):
        connect(server.path, staging_bytes=float("inf"))
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.connect(server.path)
    protocol.send(raw, {"op": "hello", "version": protocol.VERSION, "staging_bytes": float("inf")})
    reply = protocol.recv(raw)
    assert reply["ok"] is False and reply["error"] == "ConfigError"
    raw.close()
    with connect(server.path) as good:
        raw = _raw_session(server.path)
        protocol.send(raw, {"op": "put", "ns": "default", "slot": 1.7})  # a slot is an integer, never cut
        reply = protocol.recv(raw)
        assert reply["error"] == "InvalidBlock" and "integer" in reply["message"]
        nested = b"[" * 100_000 + b"]" * 100_000  # past the parser's depth: the rank hangs up, no traceback
        raw.sendall(len(nested).to_bytes(4, "little") + nested)
        assert raw.recv(1) == b""
        raw.close()
        assert good.contains_many(["a" * 32]) == [False]  # other clients carry on
        assert _eventually(lambda: server.serve_stats()["clients"] == 1)


def test_a_rank_never_removes_what_is_not_a_socket_at_its_path(tmp_path):
    store = CascadeStore(Config(shm_bytes=1 << 20, file_bytes=0, shm_dir=str(tmp_path)), block_spec=SPEC)
    try:
        for make in (lambda p: open(p, "w").close(), os.mkdir):
            socket_dir = tempfile.mkdtemp(prefix="cs-", dir="/tmp")
            path = socket_path(socket_dir, 0)
            make(path)
            with pytest.raises(ConfigError, match="not a socket"):
                RankServer(store, socket_dir, 0)
            assert os.path.lexists(path)  # left as it was
            (os.rmdir if os.path.isdir(path) else os.unlink)(path)
            os.rmdir(socket_dir)
    finally:
        store.close()


def test_a_lookup_that_took_the_client_just_before_another_thread_lost_the_rank_is_a_miss(tmp_path):
    socket_dir = tempfile.mkdtemp(prefix="cs-", dir="/tmp")
    store = CascadeStore(Config(shm_bytes=1 << 20, file_bytes=0, shm_dir=str(tmp_path)), block_spec=SPEC)
    server = RankServer(store, socket_dir, 0)
    attached = AttachedStore("auto", socket_dir=socket_dir, retry_seconds=3600)
    block_id = attached.put(*SPEC.empty())
    holding, lost, result = threading.Event(), threading.Event(), {}
    current = attached._current

    def held():  # B has the client in hand while A loses the rank (and closes that client)
        client = current()
        holding.set()
        lost.wait(10)
        return client

    def lookup():
        try:
            result["B"] = attached.contains(block_id)
        except Exception as exc:  # noqa: BLE001 - what the caller would see
            result["B"] = exc

    attached._current = held
    b = threading.Thread(target=lookup)
    b.start()
    try:
        assert holding.wait(10)
        del attached._current
        server.close()
        assert attached.contains(block_id) is False  # A: the rank is gone, its client closed
    finally:
        lost.set()
        b.join(10)
        attached.close()
        store.close()
        os.rmdir(socket_dir)
    assert result["B"] is False


def test_a_reply_over_the_frame_limit_is_an_error_reply_and_clients_cut_their_batches(served, monkeypatch):
    store, server = served
    monkeypatch.setattr(protocol, "MAX_FRAME", 2048)  # a put_many reply takes 35 bytes per id
    monkeypatch.setattr(protocol, "MAX_BATCH", 2048 // 64, raising=False)
    raw = _raw_session(server.path)
    protocol.send(raw, {"op": "put_many", "ns": "default", "slots": [0] * 200})  # a request of 600 bytes
    reply = protocol.recv(raw)
    assert reply["ok"] is False and "frame limit" in reply["message"]
    protocol.send(raw, {"op": "contains_many", "ns": "default", "ids": ["a" * 32]})
    assert protocol.recv(raw) == {"ok": True, "result": [False]}  # the connection was kept
    raw.close()
    with connect(server.path, staging_bytes=200 * SPEC.block_bytes) as client:  # 200 slots, batches of 32
        pairs = _blocks(100, seed=11)
        ids = client.put_many(pairs)
        assert ids == [store.put(k, v) for k, v in pairs]
        got = client.get_many(ids)
        assert all(np.array_equal(g[0], k) and np.array_equal(g[1], v) for g, (k, v) in zip(got, pairs))
        with pytest.raises(InvalidBlock, match="at most 32 ids"):
            client.views(ids)


def test_a_session_forgets_the_blocks_it_no_longer_pins_or_hints(served):
    store, server = served
    ids = [store.put(k, v) for k, v in _blocks(3, seed=12)]
    with connect(server.path) as client:
        (session,) = list(server._sessions)
        for block_id in ids:  # what the LMCache plugin does per chunk it looks up
            client.pin(block_id)
            client.unpin(block_id)
        assert client.hint(ids) == 3 and client.unhint(ids[:2]) == 2
        assert client.get(ids[2]) is not None  # the read uses up the last hint
        assert not session.pins and not session.hints


def test_a_client_used_after_fork_fails_in_the_child_and_works_in_its_own_process(served):
    store, server = served
    (ka, va), (kb, vb) = _blocks(2, seed=13)
    a, b = store.put(ka, va), store.put(kb, vb)
    client = connect(server.path, timeout=30)
    pid = os.fork()
    if pid == 0:  # the child: a call fails at once, touching neither the socket nor the staging region
        code = 1
        try:
            client.get(b)
        except RankFailure as exc:
            code = 0 if f"belongs to process {os.getppid()}" in str(exc) else 2
        except BaseException:  # noqa: BLE001 - any other outcome fails the test
            code = 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    got = client.get(a)
    assert got is not None and np.array_equal(got[0], ka) and np.array_equal(got[1], va)
    client.close()


def test_put_many_of_slab_views_over_several_batches_stores_the_viewed_bytes(tmp_path):
    socket_dir = tempfile.mkdtemp(prefix="cs-", dir="/tmp")
    store = CascadeStore(Config(shm_bytes=4 * SPEC.block_bytes, file_bytes=0, shm_dir=str(tmp_path)), block_spec=SPEC)
    server = RankServer(store, socket_dir, 0)
    (kx, vx), (ky, vy), (k3, v3), (k4, v4), (ke, ve), (kf, vf) = _blocks(6, seed=14)
    x, y = store.put(kx, vx), store.put(ky, vy)
    put_many, batches = store.put_many, []

    def put_many_then_reuse_the_slab(*args, **kwargs):  # between batch 1 and 2: x and y go, others take their bytes
        ids = put_many(*args, **kwargs)
        if not batches:
            store.delete(x)
            store.delete(y)
            store.put(ke, ve)
            store.put(kf, vf)
        batches.append(ids)
        return ids

    store.put_many = put_many_then_reuse_the_slab
    try:
        with connect(server.path, staging_bytes=2 * SPEC.block_bytes) as client:  # 2 slots
            (vkx, vvx), (vky, vvy) = client.views([x, y])
            assert not client._staging.holds(vkx)  # in the rank's slab
            client.put_many([(k3, v3), (k4, v4), (vkx, vvx), (vky, vvy)], namespace="copy",
                            block_ids=["3" * 32, "4" * 32, x, y])
            assert len(batches) == 2
            got = client.get_many([x, y], namespace="copy")
            assert all(g is not None and np.array_equal(g[0], k) and np.array_equal(g[1], v)
                       for g, (k, v) in zip(got, [(kx, vx), (ky, vy)]))
    finally:
        server.close()
        store.close()
        os.rmdir(socket_dir)


def test_a_hung_rank_costs_only_the_reattaching_thread_its_wait(tmp_path, monkeypatch):
    socket_dir = tempfile.mkdtemp(prefix="cs-", dir="/tmp")
    store = CascadeStore(Config(shm_bytes=1 << 20, file_bytes=0, shm_dir=str(tmp_path)), block_spec=SPEC)
    server = RankServer(store, socket_dir, 0)
    attached = AttachedStore("auto", socket_dir=socket_dir, retry_seconds=0.1)
    block_id = attached.put(*SPEC.empty())
    server.close()
    store.close()
    os.rmdir(socket_dir)
    assert attached.contains(block_id) is False  # lost
    trying, other_done, attempts = threading.Event(), threading.Event(), []

    def hung_connect(**kwargs):  # a rank that accepts and never answers, until the client's timeout
        attempts.append(kwargs)
        trying.set()
        other_done.wait(10)
        threading.Event().wait(0.15)  # the attempt outlasts retry_seconds
        raise RankFailure("did not answer hello within the timeout")

    monkeypatch.setattr(attached_module, "connect", hung_connect)
    threading.Event().wait(0.1)  # retry_seconds since the loss: the next lookup attaches again
    a = threading.Thread(target=attached.contains, args=(block_id,))
    a.start()
    try:
        assert trying.wait(10)
        other = threading.Thread(target=lambda: attached.contains(block_id) is False and other_done.set())
        other.start()
        assert other_done.wait(2)  # a miss at once, not after the other thread's attempt
    finally:
        other_done.set()
        a.join(10)
    assert attached.contains(block_id) is False and len(attempts) == 1  # retry_seconds from the failed attempt
    attached.close()


def test_new_clients_attach_after_the_slab_file_is_removed_and_a_failed_hello_is_logged(served, caplog):
    store, server = served
    (k, v), = _blocks(1, seed=15)
    block_id = store.put(k, v)
    os.unlink(store.stats()["tiers"]["shm"]["path"])  # RemoveIPC, a /dev/shm cleaner (our own tmp_path here)
    with connect(server.path) as client:
        got = client.get(block_id)
        assert got is not None and np.array_equal(got[0], k) and np.array_equal(got[1], v)
    caplog.set_level(logging.WARNING, logger="cascade.serve.server")

    def no_fd():
        raise OSError(24, "Too many open files")

    server._slab.read_only_fd = no_fd
    with pytest.raises(RankFailure, match="Too many open files"):
        connect(server.path)
    assert "cannot attach client pid" in caplog.text and "Too many open files" in caplog.text
    assert _eventually(lambda: server.serve_stats()["clients"] == 0)


def test_a_client_that_cannot_map_what_the_rank_sent_hangs_up(served, monkeypatch):
    store, server = served

    def no_map(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(client_module, "SlabMap", no_map)
    with pytest.raises(RankFailure, match="Cannot allocate memory"):
        connect(server.path)
    assert _eventually(lambda: server.serve_stats()["clients"] == 0)
