"""Prompt lookup decoding (Saxena 2023, https://github.com/apoorvumang/prompt-lookup-decoding; transformers'
``prompt_lookup_num_tokens``; vLLM's ``ngram`` method): a one-path baseline.

The last ``max_ngram`` .. 1 tokens are searched for earlier in the sequence (the
most recent earlier occurrence wins), and the tokens that followed become a
single-path draft.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from datastore.context import TokenIds

from ..draft import Draft
from .base import RequestDrafter

__all__ = ["PromptLookupDrafter"]


@dataclass
class _Sequence:
    tokens: np.ndarray  # capacity buffer; the first `n` are the sequence
    n: int


class PromptLookupDrafter(RequestDrafter[_Sequence]):
    """Single-path drafts copied from the sequence itself (unscored).

    Args:
        max_ngram: longest suffix searched, 1..8 (default 3).
        max_tokens: longest draft, >= 1 (default 10).

    Raises:
        ValueError: when an argument is out of range.
    """

    name = "pld"

    def __init__(self, max_ngram: int = 3, max_tokens: int = 10) -> None:
        super().__init__()
        if not 1 <= max_ngram <= 8:
            raise ValueError(f"max_ngram={max_ngram}: must be in 1..8")
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens}: must be >= 1")
        self.max_ngram, self.max_tokens = max_ngram, max_tokens

    def _start(self, prompt_ids: TokenIds) -> _Sequence:
        seq = _Sequence(np.zeros(max(1024, 2 * len(prompt_ids)), dtype=np.int64), 0)
        self._extend(seq, prompt_ids)
        return seq

    def _extend(self, state: _Sequence, tokens: TokenIds) -> None:
        need = state.n + len(tokens)
        if need > len(state.tokens):
            state.tokens = np.concatenate([state.tokens, np.zeros(need * 2 - len(state.tokens), dtype=np.int64)])
        state.tokens[state.n:need] = tokens
        state.n = need

    def _propose(self, states: list[_Sequence], budgets: list[int], chain: bool,
                 min_score: float | None) -> list[Draft]:
        with self._lock:
            return [self._one(s.tokens[:s.n].copy(), b) for s, b in zip(states, budgets)]

    def _one(self, seq: np.ndarray, budget: int) -> Draft:
        """The continuation of the most recent earlier occurrence of the longest matching suffix."""
        start = time.perf_counter()
        limit = min(budget, self.max_tokens)
        for n in range(min(self.max_ngram, len(seq) - 1), 0, -1):
            if limit < 1:
                break
            windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)
            hits = np.flatnonzero((windows == seq[-n:]).all(axis=1))
            if len(hits):
                begin = int(hits[-1]) + n
                return Draft.chain(seq[begin: begin + limit]).with_timing(trie_s=time.perf_counter() - start)
        return Draft.empty().with_timing(trie_s=time.perf_counter() - start)

    def config(self) -> dict:
        """Longest suffix searched and longest draft."""
        return {"name": self.name, "max_ngram": self.max_ngram, "max_tokens": self.max_tokens}
