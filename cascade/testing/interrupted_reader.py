"""A process for Ctrl-C tests: ``python -m cascade.testing.interrupted_reader FILE_DIR SHM_DIR``.

Inside ``with CascadeStore(...)`` it puts :data:`BLOCKS` blocks (:func:`block`) into a
small SHM tier over a file tier, prints ``ready``, then reads them in a loop forever
(blocks move between the tiers all the time), until a signal ends it. SIGINT raises
KeyboardInterrupt, as in an interactive process, even when it was started with SIGINT
ignored (a background job of a non-interactive shell, e.g. under ``nohup ... &``: the
ignored disposition is inherited, and Python then installs no handler).
"""
from __future__ import annotations

import signal
import sys

from cascade import CascadeStore, Config

BLOCKS = 64


def config(file_dir: str, shm_dir: str) -> Config:
    return Config(model="tiny", shm_bytes=16 * 4096, file_bytes=4 << 20, file_dir=file_dir, shm_dir=shm_dir)


def block(spec, i: int):
    """Block ``i``: its key all ``i``, its value all ``-i``."""
    key, value = spec.empty()
    key[...], value[...] = i, -i
    return key, value


def main(file_dir: str, shm_dir: str) -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with CascadeStore(config(file_dir, shm_dir)) as store:
        ids = [store.put(*block(store.spec, i)) for i in range(BLOCKS)]
        key_out, value_out = store.spec.empty()
        print("ready", flush=True)
        while True:
            for bid in ids:
                store.get_into(bid, key_out, value_out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
