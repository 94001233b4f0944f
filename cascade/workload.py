"""Cascade's own deterministic workload: system prompts, multi-turn chats and shared documents.

:func:`generate` yields the same :class:`~cascade.trace.Request` type as the trace reader,
so anything that replays a Mooncake trace replays this workload too. A request's token
sequence is a list of segments (a system prompt, a document, a user message, a model
answer, ...); block ``i`` covers tokens ``[i * B, (i + 1) * B)`` of it, and two requests
get the same hash id for block ``i`` exactly when their first ``(i + 1) * B`` tokens are
the same segments — so, as in the Mooncake traces, equal ids mean an equal prefix and a
partial last block is shared only by identical prompts.

Two kinds of request; conversations start and document queries arrive uniformly within
``duration_s`` (later turns may come after it):

- conversations: a system prompt (popularity-skewed choice), then turns; turn ``t + 1``'s
  prompt is turn ``t``'s prompt + its answer + a new user message, so it extends the
  previous prefix. The next turn arrives after the answer is decoded plus a think time.
- document queries (RAG-like): the most popular system prompt, a shared document
  (popularity-skewed choice), then a question.

:func:`cascade.trace.request_tokens` turns a request into token ids consistent with its
hash ids, for engines and tests that key blocks with :func:`cascade.prefix_ids`.

With the defaults a run has ~3,800 requests and ~50,000 block references, ~80% of which an
unbounded cache would hit. :func:`cascade.trace.write_trace` saves it as a trace file.
"""
from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, fields

import numpy as np

from .errors import ConfigError
from .trace import TOKENS_PER_BLOCK, Request


@dataclass(frozen=True)
class WorkloadParams:
    """Workload shape. Token sizes are drawn log-normally around the median (clipped to
    ``[min_tokens, max_input_tokens]``); popularity is Zipf with exponent ``popularity_skew``.
    Raises :class:`ConfigError` on an invalid value."""

    duration_s: float = 600.0
    """Window in which conversations start and document queries arrive."""
    tokens_per_block: int = TOKENS_PER_BLOCK
    """Tokens per hash id (512 as in the Mooncake traces)."""
    n_system_prompts: int = 8
    system_prompt_tokens: tuple[int, int] = (512, 4096)
    """Uniform range of a system prompt's length."""
    n_conversations: int = 800
    mean_turns: float = 4.0
    """Mean of the geometric number of turns per conversation (>= 1)."""
    max_turns: int = 16
    user_tokens_median: int = 300
    output_tokens_median: int = 250
    length_sigma: float = 1.0
    """Sigma of log(length) for user messages, answers and questions."""
    min_tokens: int = 8
    think_time_s: float = 30.0
    """Mean (exponential) pause between an answer and the user's next message."""
    decode_ms_per_token: float = 20.0
    max_input_tokens: int = 32768
    """A conversation ends when its next prompt would be longer (context window)."""
    n_documents: int = 50
    document_tokens: tuple[int, int] = (1024, 16384)
    """Uniform range of a shared document's length."""
    n_document_queries: int = 700
    popularity_skew: float = 1.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            values = value if isinstance(value, tuple) else (value,)
            allowed = (int, float) if f.type == "float" else int
            if (isinstance(value, tuple) and len(value) != 2) or not all(
                isinstance(v, allowed) and not isinstance(v, bool) and 0 <= v < math.inf for v in values
            ):
                raise ConfigError(f"{f.name}: expected {f.type} >= 0, got {value!r}")
        for name in ("system_prompt_tokens", "document_tokens"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi <= self.max_input_tokens:
                raise ConfigError(f"{name}: need 1 <= min <= max <= max_input_tokens, got {(lo, hi)}")
        if self.tokens_per_block < 1 or self.n_system_prompts < 1 or self.min_tokens < 1:
            raise ConfigError("tokens_per_block, n_system_prompts and min_tokens must be >= 1")
        if self.n_documents < 1 and self.n_document_queries > 0:
            raise ConfigError("n_document_queries > 0 needs n_documents >= 1")
        if self.mean_turns < 1 or self.max_turns < 1:
            raise ConfigError(f"mean_turns, max_turns: must be >= 1, got {self.mean_turns}, {self.max_turns}")


Segment = tuple[Hashable, int]
"""A run of tokens with one identity (e.g. ``("doc", 3)``) and its length."""


class _PrefixIds:
    """Hands out integer hash ids so that equal id <=> equal token prefix up to that block."""

    def __init__(self, tokens_per_block: int) -> None:
        self._block = tokens_per_block
        self._ids: dict[tuple, int] = {}

    def chain(self, segments: Sequence[Segment]) -> tuple[int, ...]:
        """Hash ids of the blocks of the token sequence made of ``segments``."""
        ids: list[int] = []
        parent = -1
        pieces: list[tuple[Hashable, int, int]] = []
        room = self._block
        for key, length in segments:
            start = 0
            while start < length:
                take = min(room, length - start)
                pieces.append((key, start, start + take))
                start += take
                room -= take
                if room == 0:
                    parent = self._intern(parent, pieces)
                    ids.append(parent)
                    pieces, room = [], self._block
        if pieces:
            ids.append(self._intern(parent, pieces))
        return tuple(ids)

    def _intern(self, parent: int, pieces: list[tuple[Hashable, int, int]]) -> int:
        return self._ids.setdefault((parent, tuple(pieces)), len(self._ids))


def generate(params: WorkloadParams = WorkloadParams(), seed: int = 0) -> list[Request]:
    """The workload's requests sorted by arrival time (ties in generation order).

    Deterministic for a given ``params`` and ``seed`` (NumPy PCG64). Takes ~0.3 s with the
    defaults. Local, thread-safe.
    """
    p = params
    rng = np.random.default_rng(seed)
    prefix_ids = _PrefixIds(p.tokens_per_block)
    window_ms = p.duration_s * 1000.0

    def length(median: float) -> int:
        drawn = median * math.exp(p.length_sigma * rng.standard_normal())
        return int(min(max(round(drawn), p.min_tokens), p.max_input_tokens))

    def zipf(n: int) -> np.ndarray:
        weights = 1.0 / np.arange(1, n + 1) ** p.popularity_skew
        return weights / weights.sum()

    def request(t_ms: float, segments: list[Segment], output: int) -> tuple[float, Request]:
        tokens = sum(n for _, n in segments)
        return t_ms, Request(int(t_ms), tokens, output, prefix_ids.chain(segments))

    prompts = [int(n) for n in rng.integers(*p.system_prompt_tokens, endpoint=True, size=p.n_system_prompts)]
    docs = [int(n) for n in rng.integers(*p.document_tokens, endpoint=True, size=p.n_documents)]
    prompt_odds, doc_odds = zipf(p.n_system_prompts), zipf(p.n_documents)
    timed: list[tuple[float, Request]] = []
    for conv in range(p.n_conversations):
        prompt = int(rng.choice(p.n_system_prompts, p=prompt_odds))
        segments: list[Segment] = [(("system", prompt), prompts[prompt])]
        tokens = prompts[prompt]
        turns = min(int(rng.geometric(1.0 / p.mean_turns)), p.max_turns)
        t_ms = rng.uniform(0.0, window_ms)
        for turn in range(turns):
            user = length(p.user_tokens_median)
            if tokens + user > p.max_input_tokens:
                break
            output = length(p.output_tokens_median)
            segments.append((("user", conv, turn), user))
            timed.append(request(t_ms, segments, output))
            segments.append((("answer", conv, turn), output))
            tokens += user + output
            t_ms += output * p.decode_ms_per_token + rng.exponential(p.think_time_s * 1000.0)
    for query in range(p.n_document_queries):
        doc = int(rng.choice(p.n_documents, p=doc_odds))
        question = (("question", query), length(p.user_tokens_median))
        segments = [(("system", 0), prompts[0]), (("doc", doc), docs[doc]), question]
        timed.append(request(rng.uniform(0.0, window_ms), segments, length(p.output_tokens_median)))
    timed.sort(key=lambda item: item[0])
    return [req for _, req in timed]
