"""Config: closed keys, typed values, env and TOML sources."""
from __future__ import annotations

import pytest

from cascade import Config, ConfigError
from cascade.config import parse_size
from cascade.models import MODEL_PRESETS, BlockSpec


def test_defaults_are_valid():
    cfg = Config()
    assert cfg.model == "llama3-8b" and cfg.policy == "semantic" and cfg.shm_bytes == 1 << 30


@pytest.mark.parametrize("text,expected", [("4M", 4 << 20), ("1.5GiB", 3 << 29), ("512", 512), (7, 7),
                                           ("9007199254740993", 2 ** 53 + 1), ("0.25K", 256)])
def test_sizes(text, expected):
    assert parse_size(text) == expected  # exact: no float rounds a big size


@pytest.mark.parametrize("text", ["1.5", "0.1K", "100000000T", 10 ** 20])
def test_sizes_that_no_tier_can_hold_or_that_are_not_whole_bytes_are_refused(text):
    with pytest.raises(ConfigError, match="shm_bytes"):
        parse_size(text, "shm_bytes")


def test_unknown_key_is_an_error():
    with pytest.raises(ConfigError, match="unknown key"):
        Config.load(shm_byte=1)
    with pytest.raises(ConfigError, match="shm_byte"):  # a ConfigError, not a TypeError
        Config(shm_byte=1)


def test_env_overrides_and_typos(tmp_path):
    cfg = Config.load(env={"CASCADE_SHM_BYTES": "2G", "CASCADE_POLICY": "lru", "CASCADE_FILE_ODIRECT": "off"})
    assert cfg.shm_bytes == 2 << 30 and cfg.policy == "lru" and cfg.file_odirect is False
    with pytest.raises(ConfigError, match="CASCADE_SHM_BYTE"):
        Config.load(env={"CASCADE_SHM_BYTE": "1"})


@pytest.mark.parametrize("key,value", [
    ("policy", "fifo"), ("hash_algo", "md5"), ("shm_bytes", "lots"), ("block_tokens", 0),
    ("model", "gpt-9"), ("file_odirect", "maybe"), ("default_ttl", -1), ("shm_bytes", -5),
])
def test_bad_values_are_named(key, value):
    with pytest.raises(ConfigError, match=key):
        Config.load(env={}, **{key: value})


def test_toml_file_and_precedence(tmp_path):
    path = tmp_path / "cascade.toml"
    path.write_text('[cascade]\nmodel = "tiny"\nshm_bytes = "64M"\npolicy = "lru"\n')
    cfg = Config.load(path, env={"CASCADE_POLICY": "semantic"}, shm_bytes="1M")
    assert cfg.model == "tiny" and cfg.policy == "semantic" and cfg.shm_bytes == 1 << 20
    path.write_text('[cascade]\nshm_bites = 1\n')
    with pytest.raises(ConfigError, match="shm_bites"):
        Config.load(path, env={})


@pytest.mark.parametrize("text,match", [
    ("cascade = 3\n", "must be a table"),
    ('cascade = "shm"\n', "must be a table"),
    ('shm_bytes = "2M"\nno_such_key = 1\n[cascade]\nmodel = "tiny"\n', "outside the \\[cascade\\] table"),
])
def test_a_malformed_config_file_is_a_configerror(tmp_path, text, match):
    path = tmp_path / "cascade.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        Config.load(path, env={})


def test_an_unreadable_config_file_is_a_configerror(tmp_path):
    path = tmp_path / "cascade.toml"
    path.write_bytes(b'model = "\xff\xfe"\n')  # not UTF-8
    for bad in (path, tmp_path / "missing.toml", tmp_path, 3):
        with pytest.raises(ConfigError, match="cannot read config file"):
            Config.load(bad, env={})


def test_model_presets_give_block_sizes():
    assert MODEL_PRESETS["llama3-70b"].bytes_per_token == 320 * 1024
    assert MODEL_PRESETS["llama3-8b"].bytes_per_token == 128 * 1024
    spec = BlockSpec.for_model("llama3-70b", 16)
    assert spec.shape == (80, 8, 16, 128) and spec.block_bytes == 16 * 320 * 1024
    assert BlockSpec.for_model("tiny", 16).block_bytes == 4096
