"""Cascade: an MPI-parallel, four-tier, content-addressed KV-cache block store.

Quick start::

    from cascade import CascadeStore, Config, model_fingerprint, prefix_ids
    fp = model_fingerprint("tiny", "rev1", "float16")
    token_ids = list(range(64))  # a prompt's token ids
    with CascadeStore(Config(model="tiny")) as store:
        ids = prefix_ids(token_ids, block_tokens=store.config.block_tokens, model_fingerprint=fp)
        k, v = store.spec.empty()
        store.put(k, v, block_id=ids[0])
        key, value = store.get(ids[0])
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
    TierWriteError,
)
from .identity import block_id
from .models import MODEL_PRESETS, BlockSpec, ModelPreset
from .prefix import ModelFingerprint, model_fingerprint, prefix_ids
from .serve import CascadeClient, connect
from .store import CascadeStore

__version__ = "0.1.0"
__all__ = [
    "CascadeStore", "CascadeClient", "connect", "Config", "block_id", "prefix_ids", "model_fingerprint", "ModelFingerprint", "BlockSpec", "ModelPreset", "MODEL_PRESETS",
    "CascadeError", "ConfigError", "BlockNotFound", "BlockPinned", "CorruptBlock",
    "InvalidBlock", "LaunchError", "RankFailure", "TierFull", "TierWriteError",
]
