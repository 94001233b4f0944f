"""Cascade configuration: one table of documented defaults, a closed set of keys.

Precedence (lowest to highest): the defaults below, a TOML file, ``CASCADE_<KEY>``
environment variables, keyword arguments. An unknown key or a bad value is a
:class:`~cascade.errors.ConfigError`, never a silent default. Components receive explicit
keyword arguments, not this object.

==========================  ===============  ==================================================
key                         default          meaning
==========================  ===============  ==================================================
model                       ``"llama3-8b"``  model preset giving the block shape (see models.py)
block_tokens                16               tokens per block ("cache column")
hash_algo                   ``"blake3"``     content digest: ``blake3`` or ``sha256``
gpu_bytes                   0                GPU tier capacity per rank (0 = off; cupy needed)
shm_bytes                   1 GiB            /dev/shm tier capacity per rank
remote_bytes                0                DRAM each rank exposes to others (MPI window)
file_bytes                  16 GiB           file (Lustre) tier capacity per rank (0 = off)
shm_dir                     see below        directory of the SHM slab (private, like ``file_dir``)
file_dir                    see below        aggregated-file directory
file_segment_bytes          1 GiB            roll to a new aggregated file at this size (1 MiB .. 1 TiB; see below)
file_odirect                True             allow O_DIRECT file-tier reads (False: always buffered)
file_read_mode              ``"auto"``       ``auto``: O_DIRECT on Lustre, page cache elsewhere (faster cold here: see below); or ``direct`` / ``buffered``
file_fsync                  False            fsync after each file-tier append (power-loss safety)
compact_dead_fraction       0.5              compact a file when this much of it is dead (0 .. 0.9]
lustre_stripe_count         4                ``lfs setstripe -c`` (only on Lustre; -1 = all OSTs, else 1 .. 2000)
lustre_stripe_size          4 MiB            ``lfs setstripe -S`` (only on Lustre; a multiple of 64 KiB below 4 GiB)
policy                      ``"semantic"``   eviction policy: ``semantic`` or ``lru``
ttl_mode                    ``"last_use"``   TTL clock: ``last_use`` or ``first_use``
default_ttl                 0.0              seconds a block lives (0 = no TTL)
verify_dram_reads           False            also checksum GPU/SHM/REMOTE reads (files always are)
shm_prefault                False            back and map the whole SHM slab at open (no page faults on puts; commits shm_bytes)
split_copies                True             copy an SHM block of 256 KiB or more on two cores (where the process may use two; see below)
stream_copies               True             SHM copies of 16 KiB or more write around the CPU cache (non-temporal stores; see below)
promote_on_hit              True             copy a block up to the fastest tier on a hit
cache_cluster_reads         False            keep a private copy of blocks read from other ranks (hot keys)
hint_fraction               1.0              most of the fastest tier that hinted blocks may hold
io_threads                  4                reads / writes in flight in ``get_many`` / ``put_many``
demote_high                 0.95             above this fraction of the fastest tier, a background thread demotes (1 = off)
demote_low                  0.85             ... down to this fraction (0 <= demote_low <= demote_high <= 1)
namespace_share             0.0              most of each tier one namespace may hold, pinned or not (0 = no quota)
directory_slots             65536            global-directory entries per rank (multi-rank runs; 82 B each, at most 2**26)
mpi_progress                ``"off"``        a thread entering MPI every 0.2 ms (GIL switch 0.2 ms) so inter-node atomics on a busy rank's shard progress: ``off``, ``on``, or ``auto`` (on when the start-up self-test finds them waiting)
stats_dir                   ``""``           write ``stats_rank<r>.json`` here (empty = off)
stats_interval              10.0             seconds between stats-file refreshes
==========================  ===============  ==================================================

``file_dir`` defaults to ``$SCRATCH/cascade`` when ``SCRATCH`` is set (Lustre on
Perlmutter-class machines), else ``$TMPDIR/cascade-<uid>`` (``/tmp`` without TMPDIR).
``shm_dir`` defaults to ``/dev/shm/cascade-<uid>`` (a shared sticky directory such as
``/dev/shm`` given as ``shm_dir`` stands for its ``cascade-<uid>``). Both are created 0700
and refused (:class:`~cascade.errors.ConfigError`) when another user owns them or can
write to them.

``split_copies=True`` shares the copy of a single SHM block of 256 KiB or more (a get, a
put, a promotion), and a batch get's gathered hot copies of 2 MiB or more, with one
helper thread (pieces of 256 KiB taken in turn), when the copies are compiled and the
process may run on two cores or more (16 MiB out of ``/dev/shm`` on this project's 2-core
VM: 8.8-9.1 GB/s on one thread, 9.3-12.5 GB/s shared; hot gets of 2 MiB blocks 11.2 GB/s
shared against 6.3 on one thread: :mod:`cascade.buffers.splitcopy`). It takes a second
core for the copy's duration, and the helper stays awake 100 us after each copy (yielding
the core to any thread that wants it): set it False where the rank's other cores belong
to the engine.

``stream_copies=True`` writes the destination of every SHM copy of 16 KiB or more (a
get's outputs, a put's slab room; a batch get's gathered hot copies by their sum) with
non-temporal stores on x86-64 (:mod:`cascade.buffers.hostcopy`): they go to memory without
reading each line into the cache first and without evicting what the cache holds. A store's
copies seldom land where the cache would serve them again: a put's room is read by some
later get, and outputs mostly go on to a device or over the network. On this project's
2-core VM, whose glibc takes the shared cache for 320 MiB and so never streams a copy
under 240 MiB, a C loop over 256 MiB of blocks copied 1.3-2x faster streamed (one thread:
64 KiB blocks 19.0 against 15.1 GB/s, 16 MiB 20.1 against 12.7; two threads at 64 KiB 36.5
against 18.2); the benchmarks' machine limits give both rates (``memcpy_gbps``,
``streamed_copy_gbps``). The store's hot calls, alternated with and without it (ad hoc,
10 rounds, 64 MiB of blocks a pass, medians), took 0.92x the time per 64 KiB put, 0.86x
per 64 KiB get, 0.72x per 16 MiB put and 0.47x per 16 MiB get. It loses where the
destination is read again at once from the cache (one 1 MiB buffer copied over and over:
28 against 47 GB/s): set it False for a caller that re-reads small outputs straight away.

``file_read_mode="auto"`` reads O_DIRECT on Lustre and through the page cache
elsewhere: on this project's local virtio disk buffered cold reads led at 64 KiB and
16 MiB in most of four sets of measurements (90 rounds), O_DIRECT at 2 MiB in three, on
noisy evidence; no rule by record size was better supported, and hot re-reads come from
memory (benchmark ``file_read_mode``; the rounds are in :mod:`cascade.tiers.file_reads`).

The file tier's disk use stays below ``file_bytes / (1 - compact_dead_fraction) +
max(seal, one record)`` with ``seal = min(file_segment_bytes, file_bytes / 4)``: 2.25x
``file_bytes`` at the defaults (see :mod:`cascade.tiers.file_tier`). Values that would
only fail later (an offset past the file tier's 40-bit record offsets, a directory too
big for any node's memory, a stripe size ``lfs`` refuses) are refused here.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import tempfile
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from .errors import ConfigError

ENV_PREFIX = "CASCADE_"
_CHOICES: dict[str, tuple[str, ...]] = {
    "hash_algo": ("blake3", "sha256"),
    "policy": ("semantic", "lru"),
    "ttl_mode": ("last_use", "first_use"),
    "file_read_mode": ("auto", "direct", "buffered"),
    "mpi_progress": ("off", "auto", "on"),
}
# Strict: a number, then optionally a unit K/M/G/T (binary) with an optional "iB"/"B",
# or a bare "B". "1iB", "4KB B" or "1e3" are errors, not some other size.
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([KMGT])(?:i?B)?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
MAX_SIZE = (1 << 63) - 1  # a file offset (off_t): no tier can hold more
MAX_DEAD_FRACTION = 0.9  # the file tier's disk bound is file_bytes / (1 - f): 10x at 0.9
MAX_SEGMENT_BYTES = 1 << 40  # the file tier addresses records by 40-bit offsets
MAX_DIRECTORY_SLOTS = 1 << 26  # 82 B each: 5.1 GiB of every rank's memory


def _default_file_dir() -> str:
    scratch = os.environ.get("SCRATCH")
    if scratch:
        return os.path.join(scratch, "cascade")
    return os.path.join(tempfile.gettempdir(), f"cascade-{os.getuid()}")


def default_shm_dir() -> str:
    """``/dev/shm/cascade-<uid>``: a directory of this user's own inside ``/dev/shm``."""
    return f"/dev/shm/cascade-{os.getuid()}"


def parse_size(value: Any, key: str = "size") -> int:
    """Bytes from an int or a string such as ``"4M"``, ``"1.5GiB"`` (binary units)."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a size, got {value!r}")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str) and (m := _SIZE_RE.match(value)):
        number, unit = m.group(1), _UNITS[(m.group(2) or "").upper()]
        whole, _, fraction = number.partition(".")
        # exact: int(whole) * unit plus the fraction's bytes (a float would round big sizes)
        scaled = int(fraction or "0") * unit
        if scaled % 10 ** len(fraction):
            raise ConfigError(f"{key}: {value!r} is not a whole number of bytes")
        size = int(whole) * unit + scaled // 10 ** len(fraction)
    else:
        raise ConfigError(f"{key}: expected a size such as 1073741824 or '1G', got {value!r}")
    if size < 0:
        raise ConfigError(f"{key}: must be >= 0, got {value!r}")
    if size > MAX_SIZE:
        raise ConfigError(f"{key}: {value!r} is more than any file or mapping can hold ({MAX_SIZE} bytes)")
    return size


@dataclass(frozen=True)
class Config:
    """Validated Cascade settings; see the module docstring for the table of keys."""

    model: str = "llama3-8b"
    block_tokens: int = 16
    hash_algo: str = "blake3"
    gpu_bytes: int = 0
    shm_bytes: int = 1 << 30
    remote_bytes: int = 0
    file_bytes: int = 16 << 30
    shm_dir: str = field(default_factory=default_shm_dir)
    file_dir: str = field(default_factory=_default_file_dir)
    file_segment_bytes: int = 1 << 30
    file_odirect: bool = True
    file_read_mode: str = "auto"
    file_fsync: bool = False
    compact_dead_fraction: float = 0.5
    lustre_stripe_count: int = 4
    lustre_stripe_size: int = 4 << 20
    policy: str = "semantic"
    ttl_mode: str = "last_use"
    default_ttl: float = 0.0
    verify_dram_reads: bool = False
    shm_prefault: bool = False
    split_copies: bool = True
    stream_copies: bool = True
    promote_on_hit: bool = True
    cache_cluster_reads: bool = False
    hint_fraction: float = 1.0
    io_threads: int = 4
    demote_high: float = 0.95
    demote_low: float = 0.85
    namespace_share: float = 0.0
    directory_slots: int = 1 << 16
    mpi_progress: str = "off"
    stats_dir: str = ""
    stats_interval: float = 10.0

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, _coerce(f.name, f.type, getattr(self, f.name)))
        from .models import MODEL_PRESETS  # late: models imports nothing from here

        if self.model not in MODEL_PRESETS:
            raise ConfigError(f"model: unknown preset {self.model!r}; known: {sorted(MODEL_PRESETS)}")
        if self.block_tokens < 1:
            raise ConfigError(f"block_tokens: must be >= 1, got {self.block_tokens}")
        if not 0.0 < self.compact_dead_fraction <= MAX_DEAD_FRACTION:  # NaN fails this too
            raise ConfigError(f"compact_dead_fraction: must be in (0, {MAX_DEAD_FRACTION}] (disk use is bounded "
                              f"by file_bytes / (1 - compact_dead_fraction)), got {self.compact_dead_fraction!r}")
        if not 1 << 20 <= self.file_segment_bytes <= MAX_SEGMENT_BYTES:
            raise ConfigError(f"file_segment_bytes: must be in 1 MiB .. 1 TiB (records are addressed by 40-bit "
                              f"offsets), got {self.file_segment_bytes}")
        if not 1 <= self.io_threads <= 256:
            raise ConfigError(f"io_threads: must be in 1..256, got {self.io_threads}")
        if not 8 <= self.directory_slots <= MAX_DIRECTORY_SLOTS:
            raise ConfigError(f"directory_slots: must be in 8 .. {MAX_DIRECTORY_SLOTS} (each slot takes 82 bytes of "
                              f"every rank's memory: {self.directory_slots} would need "
                              f"{self.directory_slots * 82 / 2**30:.1f} GiB), got {self.directory_slots}")
        for key in ("default_ttl", "compact_dead_fraction", "stats_interval"):
            if not math.isfinite(getattr(self, key)):
                raise ConfigError(f"{key}: must be a finite number, got {getattr(self, key)!r}")
        if self.default_ttl < 0:
            raise ConfigError("default_ttl: must be >= 0")
        if not 0.0 <= self.hint_fraction <= 1.0:  # NaN fails this too
            raise ConfigError("hint_fraction: must be in [0, 1]")
        if not 0.0 <= self.demote_low <= self.demote_high <= 1.0:  # NaN fails this too
            raise ConfigError(f"demote_low, demote_high: must satisfy 0 <= demote_low <= demote_high <= 1, "
                              f"got {self.demote_low!r}, {self.demote_high!r}")
        if not 0.0 <= self.namespace_share <= 1.0:
            raise ConfigError("namespace_share: must be in [0, 1] (0 = no per-namespace quota)")
        if self.stats_interval <= 0:
            raise ConfigError(f"stats_interval: must be > 0 seconds, got {self.stats_interval!r}")
        _check_dir_value("file_dir", self.file_dir)
        _check_dir_value("shm_dir", self.shm_dir)
        if self.stats_dir:
            _check_dir_value("stats_dir", self.stats_dir)
        if self.lustre_stripe_count < -1 or self.lustre_stripe_count == 0 or self.lustre_stripe_count > 2000:
            raise ConfigError(f"lustre_stripe_count: -1 (all OSTs) or 1 .. 2000, got {self.lustre_stripe_count}")
        if not (0 < self.lustre_stripe_size < 4 << 30 and self.lustre_stripe_size % (64 << 10) == 0):
            raise ConfigError(f"lustre_stripe_size: must be a multiple of 64 KiB below 4 GiB (lfs setstripe -S), "
                              f"got {self.lustre_stripe_size}")

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The closed set of configuration keys."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def load(
        cls,
        path: str | os.PathLike | None = None,
        *,
        env: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> "Config":
        """Defaults < TOML file ``path`` (a ``[cascade]`` table or top-level keys) <
        ``CASCADE_*`` variables of ``env`` (default ``os.environ``) < ``overrides``."""
        return cls(**cls._given(path, env, overrides))

    @classmethod
    def given_keys(cls, path: str | os.PathLike | None = None, *, env: Mapping[str, str] | None = None,
                   **overrides: Any) -> set[str]:
        """The keys that :meth:`load` with the same arguments takes from a source (the
        file, the environment, ``overrides``) rather than from the defaults."""
        return set(cls._given(path, env, overrides))

    @classmethod
    def _given(cls, path: str | os.PathLike | None, env: Mapping[str, str] | None,
               overrides: Mapping[str, Any]) -> dict[str, Any]:
        """The values of :meth:`load`'s sources, the later ones winning."""
        values: dict[str, Any] = {}
        if path is not None:
            values.update(_check_keys(_file_keys(path), f"config file {path}"))
        env = os.environ if env is None else env
        known = set(cls.keys())
        for name, raw in env.items():
            if not name.startswith(ENV_PREFIX):
                continue
            key = name[len(ENV_PREFIX):].lower()
            if key in known:
                values[key] = raw
            elif key not in _NON_CONFIG_ENV:
                raise ConfigError(f"environment variable {name}: unknown Cascade key {key!r}; known: {sorted(known)}")
        values.update(_check_keys(overrides, "keyword arguments"))
        return values

    def replace(self, **changes: Any) -> "Config":
        """A copy with ``changes`` applied (validated like any other source)."""
        return dataclasses.replace(self, **_check_keys(changes, "replace()"))

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _file_keys(path: Any) -> dict[str, Any]:
    """The keys of TOML file ``path``: its ``[cascade]`` table, or its top-level keys
    when it has none. :class:`ConfigError` when it cannot be read or parsed, when
    ``cascade`` is not a table, or when keys sit beside the table (they would be ignored)."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, TypeError, ValueError) as exc:  # TOMLDecodeError and UnicodeDecodeError are ValueErrors
        raise ConfigError(f"cannot read config file {path!r}: {exc}") from None
    if "cascade" not in data:
        return data
    table = data["cascade"]
    if not isinstance(table, dict):
        raise ConfigError(f"config file {path}: 'cascade' must be a table ([cascade]), got {table!r}")
    beside = sorted(k for k in data if k != "cascade")
    if beside:
        raise ConfigError(f"config file {path}: keys {beside} sit outside the [cascade] table and would be ignored; "
                          f"move them into it")
    return table


_dataclass_init = Config.__init__


def _config_init(self: Config, *args: Any, **kwargs: Any) -> None:
    """Keyword-only construction; an unknown key is a ConfigError (not a TypeError)."""
    if args:
        raise ConfigError(f"Config takes keyword arguments only, got {len(args)} positional")
    _dataclass_init(self, **_check_keys(kwargs, "Config()"))


Config.__init__ = _config_init  # type: ignore[method-assign]


def _check_dir_value(key: str, value: str) -> None:
    """A directory setting must be a non-empty path that is not an existing non-directory
    (ownership and permissions are checked where the directory is used)."""
    if not value.strip():
        raise ConfigError(f"{key}: must be a directory path, got an empty string")
    if "\0" in value:
        raise ConfigError(f"{key}: contains a NUL byte")
    if os.path.lexists(value) and not os.path.isdir(value):
        raise ConfigError(f"{key}: {value!r} exists and is not a directory; choose another path")


def parse_overrides(items: list[str] | None) -> dict[str, str]:
    """``["shm_bytes=1G", ...]`` (command-line ``--set``) as a dict; keys are checked by
    :meth:`Config.load`."""
    overrides: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        overrides[key.strip()] = value.strip()
    return overrides


# CASCADE_* variables that are not configuration keys (used by launch/test tooling).
_NON_CONFIG_ENV = frozenset({"config", "log_level", "require_adapters"})


def _check_keys(values: Mapping[str, Any], source: str) -> dict[str, Any]:
    unknown = set(values) - set(Config.keys())
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {sorted(unknown)}; known: {sorted(Config.keys())}")
    return dict(values)


def _coerce(key: str, typ: Any, value: Any) -> Any:
    typ = typ if isinstance(typ, str) else typ.__name__
    if typ == "int":
        if key.endswith("_bytes") or key == "lustre_stripe_size":
            return parse_size(value, key)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                raise ConfigError(f"{key}: expected an integer, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if typ == "float":
        try:
            return float(value) if not isinstance(value, bool) else _bad(key, "a number", value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected a number, got {value!r}") from None
    if typ == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if typ == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        if key in _CHOICES and value not in _CHOICES[key]:
            raise ConfigError(f"{key}: {value!r} is not one of {_CHOICES[key]}")
        return value
    raise AssertionError(f"unhandled config type {typ} for {key}")


def _bad(key: str, what: str, value: Any):
    raise ConfigError(f"{key}: expected {what}, got {value!r}")
