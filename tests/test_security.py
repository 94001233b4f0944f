"""Security: tenants are isolated, files are private, the runtime listens on nothing."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap

import numpy as np

from cascade import CascadeStore, Config


def listening_sockets_of_this_process() -> list[str]:
    """Local addresses of TCP/UDP sockets in LISTEN state (or bound UDP) this process owns."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6", "udp", "udp6"):
        try:
            with open(f"/proc/self/net/{table}") as f:
                next(f)
                for line in f:
                    cols = line.split()
                    listening = cols[3] == "0A" if table.startswith("tcp") else cols[3] == "07"
                    if listening and cols[9] in inodes:
                        found.append(f"{table} {cols[1]}")
        except FileNotFoundError:
            continue
    return found


def test_runtime_opens_no_listening_socket(tmp_path):
    """In a fresh process (this one hosts other tests' servers): store work, then no
    socket of that process listens."""
    script = textwrap.dedent(f"""
        import numpy as np, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_security import listening_sockets_of_this_process
        from cascade import CascadeStore, Config
        cfg = Config(model="tiny", shm_bytes=16 * 4096, file_bytes=64 * 8192, file_dir={str(tmp_path)!r},
                     stats_dir={str(tmp_path / "st")!r})
        with CascadeStore(cfg) as s:
            for i in range(40):
                k = np.full(s.spec.shape, i, s.spec.dtype)
                s.get(s.put(k, k))
            print(listening_sockets_of_this_process())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_tenants_see_nothing_of_each_other(tmp_path):
    cfg = Config(model="tiny", shm_bytes=16 * 4096, file_bytes=64 * 8192, file_dir=str(tmp_path))
    with CascadeStore(cfg) as s:
        k = np.full(s.spec.shape, 3, s.spec.dtype)
        secret = s.put(k, k, namespace="tenant-a")
        # b knows the id: no get, contains, prefix, pin or delete reaches a's block
        assert s.get(secret, namespace="tenant-b") is None
        assert not s.contains(secret, namespace="tenant-b")
        assert s.longest_prefix([secret], namespace="tenant-b") == 0
        for op in (s.pin, s.delete):
            try:
                op(secret, namespace="tenant-b")
                raise AssertionError(f"{op.__name__} crossed namespaces")
            except KeyError:
                pass
        # a put of the same content by b is a full store, never a (timing-visible) dedup
        s.put(k, k, namespace="tenant-b")
        stats = s.stats()
        assert stats["deduped"] == 0 and stats["stored"] == 2
        assert s.contains(secret, namespace="tenant-a")


def test_files_are_private_and_no_slab_outlives_the_store(tmp_path):
    cfg = Config(model="tiny", shm_bytes=16 * 4096, file_bytes=64 * 8192, file_dir=str(tmp_path / "agg"),
                 stats_dir=str(tmp_path / "stats"))
    with CascadeStore(cfg) as s:
        k = np.zeros(s.spec.shape, s.spec.dtype)
        for i in range(30):
            k[0, 0, 0, 0] = i
            s.put(k, k)
        slab = s.tiers[0].path
        assert stat.S_IMODE(os.stat(slab).st_mode) == 0o600
    assert not os.path.exists(slab)
    assert stat.S_IMODE(os.stat(tmp_path / "agg").st_mode) == 0o700
    for name in os.listdir(tmp_path / "agg"):
        assert stat.S_IMODE(os.stat(tmp_path / "agg" / name).st_mode) == 0o600, name
    assert stat.S_IMODE(os.stat(tmp_path / "stats").st_mode) == 0o700
