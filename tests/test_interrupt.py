"""Ctrl-C in the middle of gets inside ``with CascadeStore(...)``: the process ends
promptly (close() does not hang on what the interrupted get held) and the store opens
again afterwards (its locks and slab were given back)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from cascade import CascadeStore
from cascade.testing import interrupted_reader

def test_ctrl_c_during_gets_ends_the_process_and_leaves_the_store_openable(tmp_path):
    file_dir, shm_dir = tmp_path / "files", tmp_path / "shm"
    shm_dir.mkdir(mode=0o700)
    for attempt in range(5):  # the repro hung 5 runs of 5
        proc = subprocess.Popen([sys.executable, "-m", "cascade.testing.interrupted_reader", str(file_dir), str(shm_dir)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        time.sleep(0.05 * attempt)  # land the interrupt at different points of the loop
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(f"attempt {attempt}: still running 60 s after Ctrl-C (close() hung)")
        assert proc.returncode != 0 and err.rstrip().endswith("KeyboardInterrupt"), err[-2000:]  # no other error
        assert not os.listdir(shm_dir), os.listdir(shm_dir)  # the slab went with the store
    with CascadeStore(interrupted_reader.config(str(file_dir), str(shm_dir))) as store:  # the file-tier lock was released; kept blocks are there
        assert len(store) > 0
