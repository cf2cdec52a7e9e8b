"""The per-prompt n-gram trie as a drafter, ranked by its own frequencies (N-Gram-Trie,
https://openreview.net/forum?id=MVfpYw1pxX, §3.1-3.2, Algorithm 1): the paper's baseline."""

from __future__ import annotations

import numpy as np

from drafting import Draft, ScoreKind, TokenDrafter

from .ngram_trie import NGramTrie

__all__ = ["Trie"]


class Trie(TokenDrafter):
    """Drafts the most frequent continuations of the sequence's suffix in the prompt (and output so far), scored by
    count ratios; each request's state is its trie.

    Args:
        window: the trie's sliding window ``n`` (default 13), 2..64.
        max_prefix: longest suffix matched, ``Lp`` (default 3), 1..window-1.
        prior: additive smoothing of count ratios when ranking nodes (default 1.0, >= 0).
        vocab_size: as :class:`drafting.TokenDrafter`.

    Raises:
        ValueError: when an argument is out of range.
    """

    name = "trie"
    score_kind = ScoreKind.COUNT_RATIO

    def __init__(self, window: int = 13, max_prefix: int = 3, prior: float = 1.0, *, vocab_size: int) -> None:
        super().__init__(vocab_size=vocab_size)
        if prior < 0:
            raise ValueError(f"prior={prior}: must be >= 0")
        NGramTrie(window, max_prefix)  # validates them now
        self.window, self.max_prefix, self.prior = window, max_prefix, prior

    def started(self, prompt: np.ndarray) -> NGramTrie:
        """The request's trie of its prompt."""
        trie = NGramTrie(self.window, self.max_prefix)
        trie.extend(prompt.tolist())
        return trie

    def extended(self, state, tokens: np.ndarray) -> None:
        """Add the committed tokens' windows."""
        state.extend(tokens.tolist())

    def draft(self, state, tokens: list[int], budget: int, chain: bool) -> Draft:
        """The most frequent continuations, cut to the budget (the best path for a chain)."""
        match = state.match(budget)
        if match is None:
            return Draft.empty(self.score_kind)
        return Draft.from_tree(match.tree, self.prior).cut(budget, chain)

    def config(self) -> dict:
        """Window, longest matched suffix and prior."""
        return {"name": self.name, "window": self.window, "max_prefix": self.max_prefix, "prior": self.prior}
