"""A retrieval datastore as a drafter: CREST's stored tree of the longest matching n-gram, or REST's
retrieved tree of the longest matching suffix (both through :class:`DatastoreSource`).

CREST §3 (https://arxiv.org/abs/2408.04678): the last ``max_n`` .. 1 tokens select
the stored tree of the longest matching n-gram, in one round trip. REST §3
(https://arxiv.org/abs/2311.08252): the longest suffix of 16 .. 2 tokens found in a
suffix array, and the trie of its occurrences' continuations.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Sequence

from datastore.tree import TokenTree

from ..draft import Draft, merge_drafts
from .source import DatastoreSource

__all__ = ["RetrievalDrafter", "TAIL_TOKENS"]

TAIL_TOKENS = 64
"""Trailing tokens a retrieval drafter keeps and looks up (CREST reads <= 8, REST's default <= 16)."""


class RetrievalDrafter:
    """Drafts the retrieved continuation tree, pruned to the budget by estimated acceptance.

    Args:
        source: the fault-tolerant lookups.
        prior: additive smoothing of count ratios when ranking nodes (default 1.0, >= 0).
        name: how benchmarks label it (``datastore`` for CREST, ``rest`` for REST).

    Raises:
        ValueError: when ``prior < 0``.
    """

    def __init__(self, source: DatastoreSource, prior: float = 1.0, name: str = "datastore") -> None:
        if prior < 0:
            raise ValueError(f"prior={prior}: must be >= 0")
        self.source = source
        self.prior = prior
        self.name = name
        self._tail: deque[int] = deque(maxlen=TAIL_TOKENS)

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """Remember the prompt's last tokens."""
        self._tail.clear()
        self.extend(prompt_ids[-TAIL_TOKENS:])

    def extend(self, tokens: Sequence[int]) -> None:
        """Append committed tokens."""
        self._tail.extend(int(t) for t in tokens)

    def lookup(self) -> TokenTree | None:
        """The retrieved tree of the sequence's longest matching suffix, or ``None`` (no match, or a fault)."""
        match = self.source.lookup(list(self._tail))
        return None if match is None else match.tree

    def propose(self, budget: int) -> Draft:
        """The retrieved tree, pruned to ``budget`` nodes by estimated acceptance."""
        start = time.perf_counter()
        tree = self.lookup()
        mid = time.perf_counter()
        if tree is None or budget < 1:
            return Draft.empty().with_timing(lookup_s=mid - start)
        draft = merge_drafts([(Draft.from_tree(tree, self.prior), 1.0)], budget)
        return draft.with_timing(lookup_s=mid - start, merge_s=time.perf_counter() - mid)

    def end(self) -> None:
        """Nothing per request (the backend is kept for the next one)."""

    def config(self) -> dict:
        """Name, prior and what the backend serves."""
        return {"name": self.name, "prior": self.prior, "source": self.source.identity()}
