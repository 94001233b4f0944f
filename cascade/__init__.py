"""Cascade: an MPI-parallel, four-tier, content-addressed KV-cache block store.

Quick start::

    from cascade import CascadeStore, Config
    with CascadeStore(Config(model="tiny", file_dir="/tmp/cascade-demo")) as store:
        k, v = store.spec.empty()
        bid = store.put(k, v)
        key, value = store.get(bid)
"""
from .config import Config
from .errors import (
    BlockNotFound,
    BlockPinned,
    CascadeError,
    ConfigError,
    CorruptBlock,
    InvalidBlock,
    LaunchError,
    RankFailure,
    TierFull,
)
from .identity import block_id
from .models import MODEL_PRESETS, BlockSpec, ModelPreset
from .store import CascadeStore

__version__ = "0.1.0"
__all__ = [
    "CascadeStore", "Config", "block_id", "BlockSpec", "ModelPreset", "MODEL_PRESETS",
    "CascadeError", "ConfigError", "BlockNotFound", "BlockPinned", "CorruptBlock",
    "InvalidBlock", "LaunchError", "RankFailure", "TierFull",
]
