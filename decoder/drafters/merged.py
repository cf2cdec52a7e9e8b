"""Datastore drafts merged with the per-prompt n-gram trie's drafts into one draft tree."""

from __future__ import annotations

import time
from collections import deque
from typing import Sequence

from ..draft import merge_drafts
from ..ngram_trie import NGramTrie
from .base import Proposal
from .datastore import DatastoreSource

__all__ = ["MergedDrafter"]


class MergedDrafter:
    """One draft tree from the datastore's tree and the prompt trie's best paths.

    Shared prefixes are merged; each node is scored by the weighted noisy-OR of
    the sources' estimates (see :func:`decoder.draft.merge_drafts`) and the best
    ``budget`` nodes are kept.

    Args:
        source: datastore lookups (fault-tolerant: trie-only drafts while it is down).
        window: the trie's sliding window ``n`` (default 13).
        max_prefix: the trie's longest matched suffix ``Lp`` (default 3).
        datastore_weight: weight of the datastore's estimates, in (0, 1]
            (default 0.3: corpus statistics predict this model less well than its own prompt).
        trie_weight: weight of the trie's estimates, in (0, 1].
        prior: additive smoothing of count ratios (default 1.0, >= 0).

    Raises:
        ValueError: when an argument is out of range.
    """

    name = "merged"

    def __init__(self, source: DatastoreSource, window: int = 13, max_prefix: int = 3,
                 datastore_weight: float = 0.3, trie_weight: float = 1.0, prior: float = 1.0) -> None:
        for label, w in (("datastore_weight", datastore_weight), ("trie_weight", trie_weight)):
            if not 0.0 < w <= 1.0:
                raise ValueError(f"{label}={w}: must be in (0, 1]")
        self.source = source
        self.window, self.max_prefix = window, max_prefix
        self.weights = (datastore_weight, trie_weight)
        self.prior = prior
        self.trie = NGramTrie(window, max_prefix)
        self._tail: deque[int] = deque(maxlen=source.max_n)
        self.build_s = 0.0

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """Build the trie over the prompt."""
        start = time.perf_counter()
        self.trie = NGramTrie(self.window, self.max_prefix)
        self.trie.extend(prompt_ids)
        self.build_s = time.perf_counter() - start
        self._tail.clear()
        self._tail.extend(int(t) for t in prompt_ids[-self.source.max_n:])

    def extend(self, tokens: Sequence[int]) -> None:
        """Insert committed tokens into the trie and the lookup tail."""
        self.trie.extend(tokens)
        self._tail.extend(int(t) for t in tokens)

    def propose(self, budget: int) -> Proposal:
        """Lookup, trie match, merge."""
        t0 = time.perf_counter()
        stored = self.source.lookup(list(self._tail))
        t1 = time.perf_counter()
        match = self.trie.match(max(budget, 1))
        t2 = time.perf_counter()
        sources = []
        if stored is not None:
            sources.append((stored, self.weights[0]))
        if match is not None:
            sources.append((match.tree, self.weights[1]))
        draft = merge_drafts(sources, budget, self.prior)
        return Proposal(draft, lookup_s=t1 - t0, trie_s=t2 - t1, merge_s=time.perf_counter() - t2)

    def end(self) -> None:
        """Drop the trie."""
        self.trie = NGramTrie(self.window, self.max_prefix)
