"""The benchmark's one shared data directory: KV blocks every system reads (DESIGN.md §6.2).

``python -m benchmark.data generate [--out DIR] [--model llama3-8b] [--block-bytes 2M,16M]
[--blocks N] [--seed S]`` writes, per block size, a few large aggregated files
``blocks_{block_bytes}_{part:03d}.bin`` and one ``index.json``::

    {"format": "cascade-bench-data/1", "seed": 0, "model": "llama3-8b", "dtype": "float16",
     "bytes_per_token": 131072, "file_bytes": 1073741824,
     "sets": {"2097152": {"block_bytes": 2097152, "block_tokens": 16,
                          "key_shape": [32, 8, 16, 128], "ids": [...], "files": [...]}},
     "blocks": {"<id>": {"file": "blocks_2097152_000.bin", "offset": 0,
                         "key_bytes": 1048576, "value_bytes": 1048576}}}

A block is the K and V tensors (fp16, ``(layers, kv_heads, tokens, head_dim)`` each) of
``block_bytes / bytes_per_token`` tokens of the model; values are normal, like real
activations, drawn from ``numpy.random.default_rng([seed, block_bytes, i])``, so block
``i`` of a size is the same whatever ``--blocks`` says. The key sits at ``offset``, the
value right after it; blocks start on 4 KiB boundaries. Block ids are the BLAKE3 content
ids (:func:`cascade.block_id`), so Cascade's ``put(verify=True)`` checks them.

Readers use :class:`BlockData` (read-only mmap of the files, no copy). ``verify`` re-hashes
every block against its id.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import mmap
import os
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from cascade import block_id
from cascade.config import parse_size
from cascade.models import MODEL_PRESETS
from cascade.report import human_bytes

FORMAT = "cascade-bench-data/1"
INDEX = "index.json"
PAGE = 4096
DEFAULT_SIZES = (2 << 20, 16 << 20)
DEFAULT_SET_BYTES = 512 << 20  # per block size when --blocks is not given
DEFAULT_FILE_BYTES = 1 << 30   # roll to the next aggregated file past this


def default_dir() -> str:
    """``$CASCADE_BENCH_DATA``, else ``$SCRATCH/cascade-bench-data``, else a per-user dir in
    the temp directory (the same file system the file-backed systems use by default)."""
    if os.environ.get("CASCADE_BENCH_DATA"):
        return os.environ["CASCADE_BENCH_DATA"]
    if os.environ.get("SCRATCH"):
        return os.path.join(os.environ["SCRATCH"], "cascade-bench-data")
    return os.path.join(tempfile.gettempdir(), f"cascade-bench-data-{os.getuid()}")


def default_blocks(block_bytes: int) -> int:
    """Blocks per size when not given: 512 MiB of data, at least 8 blocks."""
    return max(8, DEFAULT_SET_BYTES // block_bytes)


def _round_up(n: int, align: int = PAGE) -> int:
    return (n + align - 1) // align * align


def block_shape(model: str, block_bytes: int) -> tuple[tuple[int, ...], int]:
    """Key (= value) shape and token count of a ``block_bytes`` block of ``model``.

    ``ValueError`` unless ``block_bytes`` is a whole number of the model's tokens.
    """
    preset = MODEL_PRESETS.get(model)
    if preset is None:
        raise ValueError(f"unknown model {model!r}; known: {sorted(MODEL_PRESETS)}")
    per_token = preset.bytes_per_token
    if block_bytes <= 0 or block_bytes % per_token:
        raise ValueError(f"{block_bytes} bytes is not a whole number of {model} tokens "
                         f"({per_token} bytes each)")
    tokens = block_bytes // per_token
    return (preset.layers, preset.kv_heads, tokens, preset.head_dim), tokens


def make_block(seed: int, block_bytes: int, index: int, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Block ``index`` of a size: fp16 K and V drawn from ``default_rng([seed, block_bytes, index])``."""
    rng = np.random.default_rng([seed, block_bytes, index])
    n = int(np.prod(shape))
    kv = rng.standard_normal(2 * n, dtype=np.float32).astype(np.float16)
    return kv[:n].reshape(shape), kv[n:].reshape(shape)


def _write_set(out: Path, model: str, block_bytes: int, blocks: int, seed: int,
               file_bytes: int, progress: bool) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    shape, tokens = block_shape(model, block_bytes)
    half = block_bytes // 2
    stride = _round_up(block_bytes)
    per_file = max(1, file_bytes // stride)
    ids: list[str] = []
    files: list[str] = []
    entries: dict[str, dict[str, Any]] = {}
    fd = -1
    try:
        for i in tqdm(range(blocks), desc=f"data {human_bytes(block_bytes)}", unit="block", disable=not progress):
            if i % per_file == 0:
                if fd >= 0:
                    os.fsync(fd)
                    os.close(fd)
                name = f"blocks_{block_bytes}_{i // per_file:03d}.bin"
                files.append(name)
                fd = os.open(out / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            key, value = make_block(seed, block_bytes, i, shape)
            bid = block_id(key, value)
            if bid in entries:
                raise RuntimeError(f"duplicate block id {bid} (seed {seed}, block {i})")
            offset = (i % per_file) * stride
            os.pwritev(fd, [memoryview(key).cast("B"), memoryview(value).cast("B")], offset)
            ids.append(bid)
            entries[bid] = {"file": name, "offset": offset, "key_bytes": half, "value_bytes": half}
        if fd >= 0:
            os.fsync(fd)
    finally:
        if fd >= 0:
            os.close(fd)
    meta = {"block_bytes": block_bytes, "block_tokens": tokens, "key_shape": list(shape),
            "blocks": blocks, "ids": ids, "files": files}
    return meta, entries


def read_index(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The parsed ``index.json`` of ``directory``, or None when there is none."""
    path = Path(directory) / INDEX
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path}: format {doc.get('format')!r}, expected {FORMAT!r}")
    return doc


def generate(out: str | os.PathLike | None = None, *, model: str = "llama3-8b",
             block_bytes: Sequence[int] = DEFAULT_SIZES, blocks: int | None = None, seed: int = 0,
             file_bytes: int = DEFAULT_FILE_BYTES, progress: bool = True) -> Path:
    """Make sure ``out`` holds ``blocks`` blocks (default :func:`default_blocks`) of each
    size; returns the directory. Sets already there with the same seed and model and at
    least as many blocks are kept (content is deterministic, so they are the same bytes);
    others are (re)written. Costs about 1 s per 100 MiB here. Local, not thread-safe."""
    out = Path(out or default_dir())
    out.mkdir(parents=True, exist_ok=True)
    index = read_index(out)
    if index is None or index["seed"] != seed or index["model"] != model:
        for old in out.glob("blocks_*.bin"):
            old.unlink()
        preset = MODEL_PRESETS[model] if model in MODEL_PRESETS else None
        index = {"format": FORMAT, "seed": seed, "model": model, "dtype": preset.dtype if preset else "",
                 "bytes_per_token": preset.bytes_per_token if preset else 0, "file_bytes": file_bytes,
                 "sets": {}, "blocks": {}}
    changed = False
    for size in block_bytes:
        want = blocks or default_blocks(size)
        have = index["sets"].get(str(size))
        if have is not None and have["blocks"] >= want and all((out / f).is_file() for f in have["files"]):
            continue
        if have is not None:
            for bid in have["ids"]:
                index["blocks"].pop(bid, None)
        for old in out.glob(f"blocks_{size}_*.bin"):
            old.unlink()
        meta, entries = _write_set(out, model, size, want, seed, index["file_bytes"], progress)
        index["sets"][str(size)] = meta
        index["blocks"].update(entries)
        changed = True
    if changed:
        tmp = out / (INDEX + ".tmp")
        tmp.write_text(json.dumps(index))
        os.replace(tmp, out / INDEX)
    return out


@dataclass(frozen=True)
class Block:
    """One block: its content id and read-only uint8 views of its K and V bytes (mmap)."""

    id: str
    key: np.ndarray
    value: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.key.nbytes + self.value.nbytes


class BlockData:
    """Read-only view of a data directory. ``with BlockData(dir) as data: data.blocks(2 << 20)``.

    Files are mapped once (shared, read-only); blocks are views into the maps, no copy.
    Local; safe to read from several threads.
    """

    def __init__(self, directory: str | os.PathLike | None = None) -> None:
        self.directory = Path(directory or default_dir())
        index = read_index(self.directory)
        if index is None:
            raise FileNotFoundError(f"no {INDEX} in {self.directory}: run python -m benchmark.data generate")
        self.index = index
        self._maps: dict[str, mmap.mmap] = {}

    def __enter__(self) -> "BlockData":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Unmap the files (blocks taken from this object must not be used afterwards)."""
        self._maps.clear()  # the maps close when the last numpy view goes

    @property
    def sizes(self) -> list[int]:
        return sorted(int(s) for s in self.index["sets"])

    def describe(self) -> dict[str, Any]:
        """What a results file records about the data: where, which seed, which sets."""
        return {"dir": str(self.directory), "format": FORMAT, "seed": self.index["seed"],
                "model": self.index["model"], "dtype": self.index["dtype"],
                "index_sha256": hashlib.sha256((self.directory / INDEX).read_bytes()).hexdigest(),
                "sets": {s: {k: v for k, v in m.items() if k not in ("ids",)} for s, m in self.index["sets"].items()}}

    def _map(self, name: str) -> mmap.mmap:
        m = self._maps.get(name)
        if m is None:
            with open(self.directory / name, "rb") as f:
                m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._maps[name] = m
        return m

    def block(self, bid: str) -> Block:
        e = self.index["blocks"][bid]
        m = self._map(e["file"])
        key = np.frombuffer(m, dtype=np.uint8, count=e["key_bytes"], offset=e["offset"])
        value = np.frombuffer(m, dtype=np.uint8, count=e["value_bytes"], offset=e["offset"] + e["key_bytes"])
        return Block(bid, key, value)

    def blocks(self, block_bytes: int, count: int | None = None, start: int = 0) -> list[Block]:
        """Blocks ``start .. start+count`` of the ``block_bytes`` set, in generation order.
        ``ValueError`` when the set is missing or holds too few."""
        meta = self.index["sets"].get(str(block_bytes))
        if meta is None:
            raise ValueError(f"{self.directory} has no {block_bytes}-byte blocks; sizes: {self.sizes}")
        ids = meta["ids"][start:] if count is None else meta["ids"][start:start + count]
        if count is not None and len(ids) < count:
            raise ValueError(f"{self.directory} holds {meta['blocks']} blocks of {block_bytes} bytes; "
                             f"{start + count} needed (generate --blocks {start + count})")
        return [self.block(b) for b in ids]

    def files(self, block_bytes: int | None = None) -> list[Path]:
        sets = [self.index["sets"][str(block_bytes)]] if block_bytes else self.index["sets"].values()
        return [self.directory / f for s in sets for f in s["files"]]


def prefault(blocks: Iterable[Block]) -> int:
    """Touch every page of ``blocks`` so timed reads of the source do not fault (the data
    is then in the page cache and mapped). Returns bytes touched."""
    total = 0
    for b in blocks:
        for part in (b.key, b.value):
            int(part[::PAGE].sum())
            total += part.nbytes
    return total


def ensure(directory: str | os.PathLike | None, block_bytes: Sequence[int], blocks: int, *,
           seed: int = 0, model: str | None = None) -> Path:
    """The data directory, generated or extended so each size has at least ``blocks``
    blocks. ``model`` None keeps the directory's model (llama3-8b for a new one)."""
    directory = Path(directory or default_dir())
    index = read_index(directory)
    same = index is not None and index["seed"] == seed and model in (None, index["model"])
    if same and all(index["sets"].get(str(s), {}).get("blocks", 0) >= blocks for s in block_bytes):
        return directory
    model = model or (index["model"] if same else "llama3-8b")
    return generate(directory, model=model, block_bytes=block_bytes, blocks=blocks, seed=seed)


def verify(directory: str | os.PathLike | None = None, progress: bool = True) -> dict[str, Any]:
    """Re-hash every block and check it against its id, offsets and file sizes.
    Returns counts; ``ValueError`` on the first inconsistency."""
    with BlockData(directory) as data:
        checked = 0
        for size in data.sizes:
            meta = data.index["sets"][str(size)]
            if len(meta["ids"]) != meta["blocks"] or len(set(meta["ids"])) != meta["blocks"]:
                raise ValueError(f"set {size}: {len(meta['ids'])} ids for {meta['blocks']} blocks")
            for bid in tqdm(meta["ids"], desc=f"verify {human_bytes(size)}", unit="block", disable=not progress):
                e = data.index["blocks"][bid]
                if e["offset"] % PAGE or e["key_bytes"] + e["value_bytes"] != size:
                    raise ValueError(f"block {bid}: bad entry {e}")
                b = data.block(bid)
                if block_id(b.key, b.value) != bid:
                    raise ValueError(f"block {bid} in {e['file']} at {e['offset']}: content does not match its id")
                checked += 1
        if checked != len(data.index["blocks"]):
            raise ValueError(f"index lists {len(data.index['blocks'])} blocks, sets hold {checked}")
    return {"dir": str(data.directory), "blocks": checked, "sizes": data.sizes}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmark.data", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="write (or complete) the data directory")
    g.add_argument("--out", default=None, help=f"directory (default {default_dir()})")
    g.add_argument("--model", default="llama3-8b", choices=sorted(MODEL_PRESETS))
    g.add_argument("--block-bytes", default="2M,16M", help="comma-separated block sizes (K+V)")
    g.add_argument("--blocks", type=int, default=None, help="blocks per size (default: 512 MiB worth)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--file-bytes", default="1G", help="size at which to start the next aggregated file")
    g.add_argument("--force", action="store_true", help="rewrite even sets that are already there")
    v = sub.add_parser("verify", help="re-hash every block against the index")
    v.add_argument("--dir", default=None)
    i = sub.add_parser("info", help="print the index summary")
    i.add_argument("--dir", default=None)
    args = p.parse_args(argv)
    if args.command == "generate":
        sizes = [parse_size(s.strip(), "--block-bytes") for s in args.block_bytes.split(",") if s.strip()]
        if args.force and args.out and Path(args.out, INDEX).exists():
            (Path(args.out) / INDEX).unlink()
        out = generate(args.out, model=args.model, block_bytes=sizes, blocks=args.blocks, seed=args.seed,
                       file_bytes=parse_size(args.file_bytes, "--file-bytes"))
        print(out)
    elif args.command == "verify":
        print(json.dumps(verify(args.dir)))
    else:
        with BlockData(args.dir) as data:
            print(json.dumps(data.describe(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
