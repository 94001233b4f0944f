"""Request traces in the Mooncake format (DESIGN.md section 7).

One JSON object per line::

    {"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [int, ...]}

Each hash id stands for one ``TOKENS_PER_BLOCK``-token block of the input and is a chained
hash of that block and every block before it: equal ids mean an equal prefix. Other keys
on a line are ignored. :func:`block_chain` turns a request's ids into Cascade block ids
with parents, so a store can be driven by any trace (or by :mod:`cascade.workload`, which
yields the same :class:`Request` type).
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import blake3

from .errors import ConfigError
from .identity import ID_HEX_CHARS, check_namespace

TOKENS_PER_BLOCK = 512
"""Tokens behind one hash id in the Mooncake traces."""

_SHARED_TRACE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "conversation_trace.jsonl"
DEFAULT_TRACE: Path | None = _SHARED_TRACE if _SHARED_TRACE.is_file() else None
"""The shared Mooncake conversation trace (``<repo>/../shared/data/``), or None when absent."""


@dataclass(frozen=True)
class Request:
    """One inference request: arrival time, prompt and output sizes, and its block hash ids.

    Raises :class:`ConfigError` on a field of the wrong type or a negative size.
    """

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        ts = self.timestamp_ms
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
            raise ConfigError(f"timestamp: expected a finite number >= 0, got {ts!r}")
        for name in ("input_length", "output_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name}: expected an integer >= 0, got {value!r}")
        if not isinstance(self.hash_ids, tuple):
            raise ConfigError(f"hash_ids: expected a tuple of integers, got {type(self.hash_ids).__name__}")
        for i, h in enumerate(self.hash_ids):
            if type(h) is not int:  # excludes bool, a subclass of int
                raise ConfigError(f"hash_ids[{i}]: expected an integer, got {h!r}")

    def block_tokens(self, tokens_per_block: int = TOKENS_PER_BLOCK) -> list[int]:
        """Tokens in each block: ``tokens_per_block`` each, the remainder in the last one.

        Meaningful when ``len(hash_ids) == ceil(input_length / tokens_per_block)``, which
        :func:`read_trace` checks.
        """
        n = len(self.hash_ids)
        return [min(tokens_per_block, self.input_length - i * tokens_per_block) for i in range(n)]


def _parse_line(line: str, tokens_per_block: int) -> Request:
    try:
        obj = json.loads(line)
    except ValueError as exc:  # JSONDecodeError, and an integer past Python's digit limit
        raise ConfigError(f"not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"expected a JSON object, got {type(obj).__name__}")
    missing = [k for k in ("timestamp", "input_length", "output_length", "hash_ids") if k not in obj]
    if missing:
        raise ConfigError(f"missing field(s) {', '.join(missing)}")
    ids = obj["hash_ids"]
    if not isinstance(ids, list):
        raise ConfigError(f"hash_ids: expected a list of integers, got {type(ids).__name__}")
    request = Request(obj["timestamp"], obj["input_length"], obj["output_length"], tuple(ids))
    expected = -(-request.input_length // tokens_per_block)
    if len(ids) != expected:
        raise ConfigError(
            f"{len(ids)} hash_ids for input_length {request.input_length}, expected {expected} "
            f"at {tokens_per_block} tokens per block (is tokens_per_block right?)"
        )
    return request


def iter_trace(path: str | Path, tokens_per_block: int = TOKENS_PER_BLOCK) -> Iterator[Request]:
    """Yield the requests of a Mooncake-format JSONL trace in file order; blank lines are skipped.

    Streams the file (constant memory). A malformed line raises :class:`ConfigError` naming
    the file and line number: bytes that are not UTF-8, bad JSON, a missing field, a wrong
    type, or a ``hash_ids`` length that does not match ``ceil(input_length / tokens_per_block)``.
    """
    if tokens_per_block < 1:
        raise ConfigError(f"tokens_per_block: must be >= 1, got {tokens_per_block}")
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode()
            except UnicodeDecodeError as exc:
                raise ConfigError(f"{path}:{lineno}: not UTF-8 text: {exc}") from None
            if not line.strip():
                continue
            try:
                yield _parse_line(line, tokens_per_block)
            except ConfigError as exc:
                raise ConfigError(f"{path}:{lineno}: {exc}") from None


def read_trace(
    path: str | Path, limit: int | None = None, tokens_per_block: int = TOKENS_PER_BLOCK
) -> list[Request]:
    """The first ``limit`` requests (all when None) of a trace; see :func:`iter_trace`.

    The shared 12,031-request trace loads in about 0.3 s here.
    """
    if limit is not None and limit < 0:
        raise ConfigError(f"limit: must be >= 0 or None, got {limit}")
    return list(islice(iter_trace(path, tokens_per_block), limit))


def write_trace(requests: Iterable[Request], path: str | Path) -> None:
    """Write ``requests`` as a Mooncake-format JSONL trace that :func:`read_trace` reads back."""
    with open(path, "w", encoding="utf-8") as f:
        for r in requests:
            row = {"timestamp": r.timestamp_ms, "input_length": r.input_length,
                   "output_length": r.output_length, "hash_ids": list(r.hash_ids)}
            f.write(json.dumps(row) + "\n")


def trace_block_id(hash_id: int, namespace: str = "default") -> str:
    """Cascade block id of a trace hash id: first 32 hex chars of BLAKE3(namespace NUL id).

    Deterministic and the same on every rank; distinct namespaces give unrelated ids.
    """
    return _block_id(_salt(namespace), hash_id)


def block_chain(hash_ids: Sequence[int], namespace: str = "default") -> list[tuple[str, str | None]]:
    """``(block_id, parent_id)`` for each hash id in order; the first block has parent None.

    Ids as in :func:`trace_block_id`; about 1 us per id. Local, thread-safe.
    """
    salt = _salt(namespace)
    chain: list[tuple[str, str | None]] = []
    parent: str | None = None
    for h in hash_ids:
        block = _block_id(salt, h)
        chain.append((block, parent))
        parent = block
    return chain


def request_tokens(request: Request, tokens_per_block: int = TOKENS_PER_BLOCK, vocab: int = 128_000):
    """Token ids for a request that has only hash ids (a Mooncake trace, or
    :mod:`cascade.workload`): block ``i`` gets ``request.block_tokens()[i]`` ids drawn
    from a generator seeded by its hash id. Since hash ids are chained, equal token
    prefixes come out exactly where the hash ids are equal, so
    :func:`cascade.prefix_ids` over these tokens gives ids that share as the trace's do
    (for full blocks). Returns a uint32 array. Local, thread-safe; ~10 us per block.
    """
    import numpy as np

    counts = request.block_tokens(tokens_per_block)
    parts = [np.random.default_rng(h).integers(0, vocab, n, dtype=np.uint32)
             for h, n in zip(request.hash_ids, counts)]
    return np.concatenate(parts) if parts else np.empty(0, np.uint32)


def _salt(namespace: str) -> bytes:
    return check_namespace(namespace).encode() + b"\0"


def _block_id(salt: bytes, hash_id: int) -> str:
    return blake3.blake3(salt + str(hash_id).encode()).hexdigest()[:ID_HEX_CHARS]
