"""The deterministic workload generator."""
from __future__ import annotations

import math
from collections import Counter

import pytest

from cascade.errors import ConfigError
from cascade.trace import Request, read_trace, write_trace
from cascade.workload import WorkloadParams, generate

SMALL = WorkloadParams(n_conversations=60, n_document_queries=40, n_documents=5, duration_s=60.0)


@pytest.fixture(scope="module")
def default_run() -> list[Request]:
    return generate()


def test_same_seed_same_requests_other_seed_other_requests():
    assert generate(SMALL, seed=7) == generate(SMALL, seed=7)
    assert generate(SMALL, seed=7) != generate(SMALL, seed=8)


def test_default_size(default_run):
    assert 2_000 <= len(default_run) <= 5_000
    assert generate(seed=0) == default_run


def test_requests_are_well_formed(default_run):
    tpb = WorkloadParams().tokens_per_block
    for r in default_run:
        assert len(r.hash_ids) == math.ceil(r.input_length / tpb)
        assert len(set(r.hash_ids)) == len(r.hash_ids)
        assert 0 < r.input_length <= WorkloadParams().max_input_tokens
    times = [r.timestamp_ms for r in default_run]
    assert times == sorted(times)


def test_equal_id_means_equal_prefix(default_run):
    prefix_of: dict[int, tuple[int, ...]] = {}
    for r in default_run:
        for i, h in enumerate(r.hash_ids):
            assert prefix_of.setdefault(h, r.hash_ids[:i]) == r.hash_ids[:i]


def test_has_shared_prefixes(default_run):
    first_ids = Counter(r.hash_ids[0] for r in default_run)
    assert first_ids.most_common(1)[0][1] > len(default_run) // 5  # a popular system prompt
    ids = [h for r in default_run for h in r.hash_ids]
    assert len(set(ids)) < 0.5 * len(ids)
    # multi-turn: every turn after a conversation's first starts with the full blocks of
    # the turn before. Counted: requests that start with an earlier request's full blocks
    # reaching past the longest system prompt (shorter ones could be a shared prompt alone)
    p = WorkloadParams()
    prompt_blocks = p.system_prompt_tokens[1] // p.tokens_per_block
    seen: set[tuple[int, ...]] = set()
    extending = 0
    for r in default_run:  # in arrival order: a turn comes after the one it extends
        h = tuple(r.hash_ids)
        extending += any(h[:n] in seen for n in range(prompt_blocks + 1, len(h)))
        seen.add(h[:-1])
    later_turns = len(default_run) - p.n_document_queries - p.n_conversations
    # the uncounted turns follow one that fit within a system prompt: with user messages
    # and answers of ~550 tokens (medians) between turns, that is well under half
    assert later_turns / 2 <= extending <= later_turns + p.n_document_queries


def test_replays_through_the_trace_format(tmp_path):
    requests = generate(SMALL, seed=3)
    write_trace(requests, tmp_path / "workload.jsonl")
    assert read_trace(tmp_path / "workload.jsonl") == requests


def test_other_block_size():
    params = WorkloadParams(tokens_per_block=16, n_conversations=10, n_document_queries=5)
    for r in generate(params, seed=1):
        assert len(r.hash_ids) == math.ceil(r.input_length / 16)


def test_no_document_queries():
    requests = generate(WorkloadParams(n_conversations=5, n_document_queries=0, n_documents=0))
    assert 0 < len(requests) <= 5 * WorkloadParams().max_turns


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_conversations": -1},
        {"n_conversations": 2.5},
        {"duration_s": float("inf")},
        {"mean_turns": 0.5},
        {"tokens_per_block": 0},
        {"system_prompt_tokens": (100, 50)},
        {"document_tokens": (1, 2, 3)},
        {"document_tokens": (1024, 10**6)},
        {"n_documents": 0},
        {"popularity_skew": True},
    ],
)
def test_invalid_params(kwargs):
    with pytest.raises(ConfigError):
        WorkloadParams(**kwargs)
