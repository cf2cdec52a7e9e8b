"""Prompt lookup decoding (Saxena 2023, https://github.com/apoorvumang/prompt-lookup-decoding; transformers'
``prompt_lookup_num_tokens``; vLLM's ``ngram`` method): a one-path baseline.

The last ``max_ngram`` .. 1 tokens are searched for earlier in the sequence (the
most recent earlier occurrence wins), and the tokens that followed become a
single-path draft.
"""

from __future__ import annotations

import numpy as np

from ..draft import Draft, ScoreKind
from ..method import Stateless, Step

__all__ = ["PromptLookup"]


class PromptLookup(Stateless):
    """Single-path drafts copied from the request's own sequence (unscored): a :class:`drafting.DraftingService`
    method.

    Args:
        max_ngram: longest suffix searched, 1..8 (default 3).
        max_tokens: longest draft, >= 1 (default 10).

    Raises:
        ValueError: when an argument is out of range.
    """

    name = "pld"
    score_kind = ScoreKind.NONE

    def __init__(self, max_ngram: int = 3, max_tokens: int = 10) -> None:
        if not 1 <= max_ngram <= 8:
            raise ValueError(f"max_ngram={max_ngram}: must be in 1..8")
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens}: must be >= 1")
        self.max_ngram, self.max_tokens = max_ngram, max_tokens

    def draft(self, step: Step) -> list[Draft]:
        """Each row's chain (a tree verifier gets the same chain)."""
        return [self._one(step.tokens(i)[1], int(b)) if b else Draft.empty() for i, b in enumerate(step.budgets)]

    def _one(self, seq: np.ndarray, budget: int) -> Draft:
        """The continuation of the most recent earlier occurrence of the longest matching suffix."""
        limit = min(budget, self.max_tokens)
        seq = seq.astype(np.int64)
        for n in range(min(self.max_ngram, len(seq) - 1), 0, -1):
            windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)
            hits = np.flatnonzero((windows == seq[-n:]).all(axis=1))
            if len(hits):
                begin = int(hits[-1]) + n
                return Draft.chain(seq[begin: begin + limit])
        return Draft.empty()

    def config(self) -> dict:
        """Longest suffix searched and longest draft."""
        return {"name": self.name, "max_ngram": self.max_ngram, "max_tokens": self.max_tokens}
