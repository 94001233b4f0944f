"""Ctrl-C in the middle of gets inside ``with CascadeStore(...)``: the process ends
promptly (close() does not hang on what the interrupted get held) and the store opens
again afterwards (its locks and slab were given back)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from cascade import CascadeStore, Config

PROGRAM = textwrap.dedent("""
    import sys
    from cascade import CascadeStore, Config
    cfg = Config(model="tiny", shm_bytes=16 * 4096, file_bytes=4 << 20, file_dir=sys.argv[1], shm_dir=sys.argv[2])
    with CascadeStore(cfg) as store:
        ids = []
        for i in range(64):  # more than the SHM tier holds: gets promote and demote all the time
            key, value = store.spec.empty()
            key[...], value[...] = i, -i
            ids.append(store.put(key, value))
        key_out, value_out = store.spec.empty()
        print("ready", flush=True)
        while True:
            for bid in ids:
                store.get_into(bid, key_out, value_out)
""")


def test_ctrl_c_during_gets_ends_the_process_and_leaves_the_store_openable(tmp_path):
    file_dir, shm_dir = tmp_path / "files", tmp_path / "shm"
    shm_dir.mkdir(mode=0o700)
    for attempt in range(5):  # the repro hung 5 runs of 5
        proc = subprocess.Popen([sys.executable, "-c", PROGRAM, str(file_dir), str(shm_dir)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        time.sleep(0.05 * attempt)  # land the interrupt at different points of the loop
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(f"attempt {attempt}: still running 60 s after Ctrl-C (close() hung)")
        assert proc.returncode != 0 and "KeyboardInterrupt" in err, err[-2000:]
        assert not os.listdir(shm_dir), os.listdir(shm_dir)  # the slab went with the store
    cfg = Config(model="tiny", shm_bytes=16 * 4096, file_bytes=4 << 20, file_dir=str(file_dir), shm_dir=str(shm_dir))
    with CascadeStore(cfg) as store:  # the file-tier lock was released; kept blocks are there
        assert len(store) > 0
