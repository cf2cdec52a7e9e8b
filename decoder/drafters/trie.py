"""The per-prompt n-gram trie as a drafter (N-gram trie paper, §3.1-3.2, Algorithm 1)."""

from __future__ import annotations

import time
from typing import Sequence

from ..draft import EMPTY_DRAFT, merge_drafts
from ..ngram_trie import NGramTrie, TrieMatch
from .base import Proposal

__all__ = ["TrieDrafter"]


class TrieDrafter:
    """Drafts the most frequent continuations of the sequence's suffix in the prompt (and output so far).

    Args:
        window: the trie's sliding window ``n`` (default 13), 2..64.
        max_prefix: longest suffix matched, ``Lp`` (default 3).
        prior: additive smoothing of count ratios when ranking nodes (default 1.0, >= 0).

    Raises:
        ValueError: when an argument is out of range (see :class:`NGramTrie`).
    """

    name = "trie"

    def __init__(self, window: int = 13, max_prefix: int = 3, prior: float = 1.0) -> None:
        NGramTrie(window, max_prefix)  # validate now, not at the first request
        self.window = window
        self.max_prefix = max_prefix
        self.prior = prior
        self.trie = NGramTrie(window, max_prefix)
        self.build_s = 0.0

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """Build the trie over the prompt (its cost is kept in ``build_s``)."""
        start = time.perf_counter()
        self.trie = NGramTrie(self.window, self.max_prefix)
        self.trie.extend(prompt_ids)
        self.build_s = time.perf_counter() - start

    def extend(self, tokens: Sequence[int]) -> None:
        """Insert the committed tokens."""
        self.trie.extend(tokens)

    def match(self, budget: int) -> TrieMatch | None:
        """The trie's best ``max(budget, 1)`` paths below the longest matching suffix, or ``None``."""
        return self.trie.match(max(budget, 1))

    def propose(self, budget: int) -> Proposal:
        """The trie's best paths below the longest matching suffix."""
        start = time.perf_counter()
        match = self.match(budget)
        mid = time.perf_counter()
        if match is None or budget < 1:
            return Proposal(EMPTY_DRAFT, trie_s=mid - start)
        draft = merge_drafts([(match.tree, 1.0)], budget, self.prior)
        return Proposal(draft, trie_s=mid - start, merge_s=time.perf_counter() - mid)

    def end(self) -> None:
        """Drop the trie."""
        self.trie = NGramTrie(self.window, self.max_prefix)
