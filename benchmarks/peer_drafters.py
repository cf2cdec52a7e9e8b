"""The peers' drafters, each behind the lifecycle every drafter shares (:class:`drafting.TokenDrafter`), for replay:

- :class:`SuffixDrafter`: SuffixDecoding (Oliaro et al., https://arxiv.org/abs/2411.04975) through arctic-inference's
  ``SuffixDecodingCache`` (one cache for the whole run: each request's prompt tree and the global tree of earlier
  responses), vLLM's ``suffix`` defaults;
- :class:`PromptLookup`: prompt lookup decoding (Saxena 2023, https://github.com/apoorvumang/prompt-lookup-decoding;
  vLLM's ``ngram`` method): the tokens after the most recent earlier occurrence of the longest suffix, one chain;
- :class:`RetrievalDrafter`: a retrieval datastore's tree ranked by its own counts: REST's
  (https://arxiv.org/abs/2311.08252 §3: the longest suffix of 16 .. 2 tokens found in a suffix array of the corpus,
  and the trie of its occurrences' continuations), or CREST's stored tree of the longest matching n-gram
  (https://arxiv.org/abs/2408.04678 §3), pruned to the budget by count ratios.
"""

from __future__ import annotations

import numpy as np

from drafting import Draft, ScoreKind, TokenDrafter

__all__ = ["PromptLookup", "RetrievalDrafter", "SuffixDrafter"]


class SuffixDrafter(TokenDrafter):
    """SuffixDecoding through arctic-inference's ``SuffixDecodingCache``: a request's state is its key in the cache.

    Args:
        cache: the cache (shared by the run's requests). vocab_size: as :class:`drafting.TokenDrafter`.
    """

    name = "suffix"
    score_kind = ScoreKind.PROBABILITY

    def __init__(self, cache, *, vocab_size: int) -> None:
        super().__init__(vocab_size=vocab_size)
        self.cache, self.n = cache, 0

    def started(self, prompt: np.ndarray) -> tuple:
        self.n += 1
        key = ("bench", self.n)
        self.cache.start_request(key, prompt[:-1].astype(np.int32))
        self.cache.add_active_response(key, prompt[-1:].astype(np.int32))
        return key

    def extended(self, state, tokens: np.ndarray) -> None:
        self.cache.add_active_response(state, tokens.astype(np.int32))

    def stopped(self, state, tokens: list[int]) -> None:
        self.cache.stop_request(state)

    def draft(self, state, tokens: list[int], budget: int, chain: bool) -> Draft:
        ctx = np.asarray(tokens[-self.cache.max_tree_depth:], np.int32)
        d = self.cache.speculate(state, ctx, max_spec_tokens=budget, max_spec_factor=1.0, min_token_prob=0.1,
                                 use_tree_spec=not chain)
        if d is None or not d.token_ids:
            return Draft.empty()
        return Draft(np.asarray(d.token_ids, np.int64), np.asarray(d.parents, np.int32),
                     np.asarray(d.probs, np.float64), ScoreKind.PROBABILITY)


class PromptLookup(TokenDrafter):
    """Single-path drafts copied from the request's own sequence (unscored).

    Args:
        max_ngram: longest suffix searched, 1..8. max_tokens: longest draft, >= 1. name: how the runs label it.
        vocab_size: as :class:`drafting.TokenDrafter`.

    Raises:
        ValueError: when an argument is out of range.
    """

    def __init__(self, max_ngram: int = 4, max_tokens: int = 10_000, name: str = "ngram", *,
                 vocab_size: int) -> None:
        super().__init__(vocab_size=vocab_size)
        self.name = name
        if not 1 <= max_ngram <= 8:
            raise ValueError(f"max_ngram={max_ngram}: must be in 1..8")
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens}: must be >= 1")
        self.max_ngram, self.max_tokens = max_ngram, max_tokens

    def draft(self, state, tokens: list[int], budget: int, chain: bool) -> Draft:
        """The continuation of the most recent earlier occurrence of the longest matching suffix."""
        limit = min(budget, self.max_tokens)
        seq = np.asarray(tokens, np.int64)
        for n in range(min(self.max_ngram, len(seq) - 1), 0, -1):
            windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)
            hits = np.flatnonzero((windows == seq[-n:]).all(axis=1))
            if len(hits):
                begin = int(hits[-1]) + n
                return Draft.chain(seq[begin: begin + limit])
        return Draft.empty()

    def config(self) -> dict:
        return {"name": self.name, "max_ngram": self.max_ngram, "max_tokens": self.max_tokens}


CONTEXT_TOKENS = 64
"""Trailing tokens of each request looked up (CREST reads <= 8, REST's default <= 16)."""


class RetrievalDrafter(TokenDrafter):
    """A retrieval datastore's tree of the longest match, pruned to the budget by count ratios (its best path for a
    chain).

    Args:
        source: the lookups (a :class:`drafting.DatastoreSource` over a datastore or an
            :class:`benchmarks.rest_index.SuffixIndex`).
        prior: additive smoothing of count ratios when ranking nodes, >= 0. name: how the runs label it (``rest``,
            ``datastore``). vocab_size: as :class:`drafting.TokenDrafter`.

    Raises:
        ValueError: when ``prior < 0``.
    """

    score_kind = ScoreKind.COUNT_RATIO

    def __init__(self, source, prior: float = 1.0, name: str = "rest", *, vocab_size: int) -> None:
        super().__init__(vocab_size=vocab_size)
        if prior < 0:
            raise ValueError(f"prior={prior}: must be >= 0")
        self.source, self.prior, self.name = source, prior, name

    def draft(self, state, tokens: list[int], budget: int, chain: bool) -> Draft:
        match = self.source.lookup(np.asarray(tokens[-CONTEXT_TOKENS:], np.uint32))
        if match is None:
            return Draft.empty(self.score_kind)
        return Draft.from_tree(match.tree, self.prior).cut(budget, chain)

    def config(self) -> dict:
        return {"name": self.name, "prior": self.prior, "source": self.source.identity()}

    def close(self) -> None:
        self.source.close()
