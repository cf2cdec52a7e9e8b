"""Prompt lookup decoding (Saxena 2023, https://github.com/apoorvumang/prompt-lookup-decoding; transformers'
``prompt_lookup_num_tokens``; vLLM's ``ngram`` method): a one-path baseline.

The last ``max_ngram`` .. 1 tokens are searched for earlier in the sequence (the
most recent earlier occurrence wins), and the tokens that followed become a
single-path draft.
"""

from __future__ import annotations

import numpy as np

from ..draft import Draft
from ..lifecycle import StatelessDrafter


class PromptLookupDrafter(StatelessDrafter):
    """Single-path drafts copied from the sequence itself (unscored): each row's whole context is searched, so the
    caller passes the request's whole sequence.

    Args:
        max_ngram: longest suffix searched, 1..8 (default 3).
        max_tokens: longest draft, >= 1 (default 10).

    Raises:
        ValueError: when an argument is out of range.
    """

    name = "pld"
    context_tokens = None

    def __init__(self, max_ngram: int = 3, max_tokens: int = 10) -> None:
        super().__init__()
        if not 1 <= max_ngram <= 8:
            raise ValueError(f"max_ngram={max_ngram}: must be in 1..8")
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens}: must be >= 1")
        self.max_ngram, self.max_tokens = max_ngram, max_tokens

    def _propose(self, states: list[None], contexts: list[list[int]], budgets: list[int], chain: bool,
                 min_score: float | None) -> list[Draft]:
        return [self._one(np.asarray(c, dtype=np.int64), b) for c, b in zip(contexts, budgets)]

    def _one(self, seq: np.ndarray, budget: int) -> Draft:
        """The continuation of the most recent earlier occurrence of the longest matching suffix."""
        limit = min(budget, self.max_tokens)
        for n in range(min(self.max_ngram, len(seq) - 1), 0, -1):
            if limit < 1:
                break
            windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)
            hits = np.flatnonzero((windows == seq[-n:]).all(axis=1))
            if len(hits):
                begin = int(hits[-1]) + n
                return Draft.chain(seq[begin: begin + limit])
        return Draft.empty()

    def config(self) -> dict:
        """Longest suffix searched and longest draft."""
        return {"name": self.name, "max_ngram": self.max_ngram, "max_tokens": self.max_tokens}
