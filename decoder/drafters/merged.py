"""Retrieved drafts merged with the per-prompt n-gram trie's drafts into one draft tree."""

from __future__ import annotations

import time
from typing import Sequence

from ..draft import Draft, merge_drafts
from .retrieval import RetrievalDrafter
from .source import DatastoreSource
from .trie import TrieDrafter

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
        self.weights = (datastore_weight, trie_weight)
        self.prior = prior
        self.trie = TrieDrafter(window, max_prefix, prior)
        self.retrieval = RetrievalDrafter(source, prior)

    @property
    def build_s(self) -> float:
        """Seconds the last ``begin`` spent building the prompt trie."""
        return self.trie.build_s

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """Build the trie over the prompt; remember the lookup tail."""
        self.trie.begin(prompt_ids)
        self.retrieval.begin(prompt_ids)

    def extend(self, tokens: Sequence[int]) -> None:
        """Insert committed tokens into the trie and the lookup tail."""
        self.trie.extend(tokens)
        self.retrieval.extend(tokens)

    def propose(self, budget: int) -> Draft:
        """Lookup, trie match, merge."""
        t0 = time.perf_counter()
        stored = self.retrieval.lookup()
        t1 = time.perf_counter()
        matched = self.trie.lookup(budget)
        t2 = time.perf_counter()
        sources = [(Draft.from_tree(tree, self.prior), w) for tree, w in zip((stored, matched), self.weights)
                   if tree is not None]
        return merge_drafts(sources, budget).with_timing(lookup_s=t1 - t0, trie_s=t2 - t1,
                                                          merge_s=time.perf_counter() - t2)

    def end(self) -> None:
        """Drop the trie."""
        self.trie.end()
        self.retrieval.end()

    def config(self) -> dict:
        """Weights, the trie's and the retrieval's configuration."""
        return {"name": self.name, "weights": list(self.weights), "prior": self.prior, "trie": self.trie.config(),
                "retrieval": self.retrieval.config()}
