"""Mooncake-format trace reader, writer and block chains."""
from __future__ import annotations

import json
import re

import pytest

from cascade.errors import ConfigError, InvalidBlock
from cascade.trace import (
    DEFAULT_TRACE,
    TOKENS_PER_BLOCK,
    Request,
    block_chain,
    iter_trace,
    read_trace,
    trace_block_id,
    write_trace,
)

GOOD = [
    {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]},
    {"timestamp": 5, "input_length": 512, "output_length": 0, "hash_ids": [0], "extra": "ignored"},
    {"timestamp": 7.5, "input_length": 1025, "output_length": 3, "hash_ids": [0, 1, 2]},
]


def write_lines(tmp_path, lines: list[str]):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogateescape")
    return path


def test_reads_good_lines_and_skips_blank_ones(tmp_path):
    path = write_lines(tmp_path, [json.dumps(GOOD[0]), "", json.dumps(GOOD[1]), "  ", json.dumps(GOOD[2])])
    requests = read_trace(path)
    assert requests == [
        Request(0, 1000, 10, (0, 1)),
        Request(5, 512, 0, (0,)),
        Request(7.5, 1025, 3, (0, 1, 2)),
    ]
    assert read_trace(path, limit=2) == requests[:2]
    assert read_trace(path, limit=0) == []
    assert list(iter_trace(path)) == requests


def test_block_tokens_puts_the_remainder_in_the_last_block():
    assert Request(0, 1000, 0, (4, 5)).block_tokens() == [512, 488]
    assert Request(0, 1024, 0, (4, 5)).block_tokens(TOKENS_PER_BLOCK) == [512, 512]
    assert Request(0, 40, 0, (1, 2, 3)).block_tokens(16) == [16, 16, 8]
    assert Request(0, 0, 0, ()).block_tokens() == []


@pytest.mark.parametrize(
    "bad, message",
    [
        ('{"timestamp": 0, "input_length": 10,', "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1}', "missing field(s) hash_ids"),
        ('{"timestamp": "0", "input_length": 10, "output_length": 1, "hash_ids": [0]}', "timestamp"),
        ('{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [0]}', "timestamp"),
        ('{"timestamp": 0, "input_length": 1.5, "output_length": 1, "hash_ids": [0]}', "input_length"),
        ('{"timestamp": 0, "input_length": 10, "output_length": true, "hash_ids": [0]}', "output_length"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": "0"}', "hash_ids"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0, "1"]}', "hash_ids"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0, 1]}', "expected 1"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [' + "9" * 5000 + "]}",
         "not valid JSON"),  # past Python's limit on an integer's digits (a ValueError, not a JSONDecodeError)
        ('{"timestamp": 0, "input_length": 10, "output_length": 1, "note": "\udcff\udcfe", "hash_ids": [0]}',
         "not UTF-8"),  # written with surrogateescape: the raw bytes 0xff 0xfe
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, bad, message):
    path = write_lines(tmp_path, [json.dumps(GOOD[0]), bad, json.dumps(GOOD[1])])
    with pytest.raises(ConfigError, match=re.escape(f"{path}:2: ") + ".*" + re.escape(message)):
        read_trace(path)
    assert next(iter_trace(path)) == Request(0, 1000, 10, (0, 1))  # streams up to the bad line


def test_rejects_bad_arguments(tmp_path):
    path = write_lines(tmp_path, [json.dumps(GOOD[0])])
    with pytest.raises(ConfigError, match="limit"):
        read_trace(path, limit=-1)
    with pytest.raises(ConfigError, match="tokens_per_block"):
        read_trace(path, tokens_per_block=0)
    with pytest.raises(FileNotFoundError):
        read_trace(tmp_path / "absent.jsonl")


def test_write_trace_round_trips(tmp_path):
    requests = [Request(0, 1000, 10, (0, 1)), Request(7.5, 1025, 3, (0, 1, 2))]
    write_trace(requests, tmp_path / "out.jsonl")
    assert read_trace(tmp_path / "out.jsonl") == requests


def test_block_chain_links_parents_deterministically():
    chain = block_chain([0, 1, 2])
    assert [parent for _, parent in chain] == [None, chain[0][0], chain[1][0]]
    assert all(re.fullmatch(r"[0-9a-f]{32}", block) for block, _ in chain)
    assert len({block for block, _ in chain}) == 3
    assert block_chain([0, 1, 2]) == chain
    assert block_chain([0, 1, 7])[:2] == chain[:2]  # shared hash ids, shared blocks
    assert chain[0][0] == trace_block_id(0)
    assert block_chain([]) == []


def test_block_ids_depend_on_namespace():
    assert trace_block_id(5, "tenant-a") != trace_block_id(5, "tenant-b")
    assert trace_block_id(5, "tenant-a") == trace_block_id(5, "tenant-a")
    with pytest.raises(InvalidBlock):
        block_chain([1], namespace="bad namespace")


@pytest.mark.skipif(DEFAULT_TRACE is None, reason="shared trace ../shared/data/conversation_trace.jsonl absent")
def test_shared_trace_counts():
    requests = read_trace(DEFAULT_TRACE)
    ids = [h for r in requests for h in r.hash_ids]
    assert (len(requests), len(ids), len(set(ids))) == (12_031, 288_500, 182_790)
    assert all(r.hash_ids[0] == 0 for r in requests)
    assert [r.timestamp_ms for r in requests] == sorted(r.timestamp_ms for r in requests)
    assert read_trace(DEFAULT_TRACE, limit=3) == requests[:3]
