"""The per-prompt n-gram trie as a drafter (N-Gram-Trie, https://openreview.net/forum?id=MVfpYw1pxX,
§3.1-3.2, Algorithm 1)."""

from __future__ import annotations

import time
from typing import Sequence

from datastore.tree import TokenTree

from ..draft import Draft, merge_drafts
from ..ngram_trie import NGramTrie

__all__ = ["TrieDrafter"]


class TrieDrafter:
    """Drafts the most frequent continuations of the sequence's suffix in the prompt (and output so far).

    Args:
        window: the trie's sliding window ``n`` (default 13), 2..64.
        max_prefix: longest suffix matched, ``Lp`` (default 3), 1..window-1.
        prior: additive smoothing of count ratios when ranking nodes (default 1.0, >= 0).

    Raises:
        ValueError: when an argument is out of range.
    """

    name = "trie"

    def __init__(self, window: int = 13, max_prefix: int = 3, prior: float = 1.0) -> None:
        if prior < 0:
            raise ValueError(f"prior={prior}: must be >= 0")
        self.window = window
        self.max_prefix = max_prefix
        self.prior = prior
        self.trie = NGramTrie(window, max_prefix)  # validates window and max_prefix now
        self.build_s = 0.0

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """Build the trie over the prompt (its cost is kept in ``build_s``, seconds)."""
        start = time.perf_counter()
        self.trie = NGramTrie(self.window, self.max_prefix)
        self.trie.extend(prompt_ids)
        self.build_s = time.perf_counter() - start

    def extend(self, tokens: Sequence[int]) -> None:
        """Insert the committed tokens."""
        self.trie.extend(tokens)

    def lookup(self, budget: int) -> TokenTree | None:
        """The trie's best ``max(budget, 1)`` paths below the longest matching suffix, or ``None``."""
        match = self.trie.match(max(budget, 1))
        return None if match is None else match.tree

    def propose(self, budget: int) -> Draft:
        """The trie's best paths below the longest matching suffix."""
        start = time.perf_counter()
        tree = self.lookup(budget)
        mid = time.perf_counter()
        if tree is None or budget < 1:
            return Draft.empty().with_timing(trie_s=mid - start)
        draft = merge_drafts([(Draft.from_tree(tree, self.prior), 1.0)], budget)
        return draft.with_timing(trie_s=mid - start, merge_s=time.perf_counter() - mid)

    def end(self) -> None:
        """Drop the trie."""
        self.trie = NGramTrie(self.window, self.max_prefix)

    def config(self) -> dict:
        """Window, longest matched suffix and prior."""
        return {"name": self.name, "window": self.window, "max_prefix": self.max_prefix, "prior": self.prior}
