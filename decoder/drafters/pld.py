"""Prompt lookup decoding (Saxena 2023, https://github.com/apoorvumang/prompt-lookup-decoding; transformers'
``prompt_lookup_num_tokens``; vLLM's ``ngram`` method): a one-path baseline.

The last ``max_ngram`` .. 1 tokens are searched for earlier in the sequence (the
most recent earlier occurrence wins), and the tokens that followed become a
single-path draft.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from ..draft import Draft

__all__ = ["PromptLookupDrafter"]


class PromptLookupDrafter:
    """Single-path drafts copied from the sequence itself.

    Args:
        max_ngram: longest suffix searched, 1..8 (default 3).
        max_tokens: longest draft, >= 1 (default 10).

    Raises:
        ValueError: when an argument is out of range.
    """

    name = "pld"

    def __init__(self, max_ngram: int = 3, max_tokens: int = 10) -> None:
        if not 1 <= max_ngram <= 8:
            raise ValueError(f"max_ngram={max_ngram}: must be in 1..8")
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens}: must be >= 1")
        self.max_ngram = max_ngram
        self.max_tokens = max_tokens
        self._seq = np.zeros(0, dtype=np.int64)
        self._len = 0

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """Start from the prompt."""
        self._seq = np.zeros(max(1024, 2 * len(prompt_ids)), dtype=np.int64)
        self._len = 0
        self.extend(prompt_ids)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append committed tokens."""
        need = self._len + len(tokens)
        if need > len(self._seq):
            self._seq = np.concatenate([self._seq, np.zeros(need * 2 - len(self._seq), dtype=np.int64)])
        self._seq[self._len:need] = tokens
        self._len = need

    def propose(self, budget: int) -> Draft:
        """The continuation of the most recent earlier occurrence of the longest matching suffix."""
        start = time.perf_counter()
        seq = self._seq[: self._len]
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

    def end(self) -> None:
        """Drop the sequence."""
        self._seq = np.zeros(0, dtype=np.int64)
        self._len = 0

    def config(self) -> dict:
        """Longest suffix searched and longest draft."""
        return {"name": self.name, "max_ngram": self.max_ngram, "max_tokens": self.max_tokens}
