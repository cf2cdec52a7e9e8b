"""A retrieval datastore as a drafter, ranked by its own counts: CREST's stored tree of the longest matching
n-gram, or REST's retrieved tree of the longest matching suffix (both through :class:`DatastoreSource`).

CREST §3 (https://arxiv.org/abs/2408.04678): the last ``max_n`` .. 1 tokens select
the stored tree of the longest matching n-gram, in one round trip. REST §3
(https://arxiv.org/abs/2311.08252): the longest suffix of 16 .. 2 tokens found in a
suffix array, and the trie of its occurrences' continuations. These are the papers' own
drafters (baselines); the merged drafter is :class:`decoder.service.DraftingService`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

from datastore.context import TokenIds

from ..draft import Draft, ScoreKind
from .base import RequestDrafter
from .source import DatastoreSource

__all__ = ["RetrievalDrafter", "TAIL_TOKENS"]

TAIL_TOKENS = 64
"""Trailing tokens a retrieval drafter keeps and looks up (CREST reads <= 8, REST's default <= 16)."""


class RetrievalDrafter(RequestDrafter[deque]):
    """Drafts the retrieved continuation tree, pruned to the budget by count ratios; one round trip a batch.

    Args:
        source: the fault-tolerant lookups.
        prior: additive smoothing of count ratios when ranking nodes (default 1.0, >= 0).
        name: how benchmarks label it (``datastore`` for CREST, ``rest`` for REST).

    Raises:
        ValueError: when ``prior < 0``.
    """

    score_kind = ScoreKind.COUNT_RATIO

    def __init__(self, source: DatastoreSource, prior: float = 1.0, name: str = "datastore") -> None:
        super().__init__()
        if prior < 0:
            raise ValueError(f"prior={prior}: must be >= 0")
        self.source, self.prior, self.name = source, prior, name

    def _start(self, prompt_ids: TokenIds) -> deque:
        return deque((int(t) for t in prompt_ids[-TAIL_TOKENS:]), maxlen=TAIL_TOKENS)

    def _extend(self, state: deque, tokens: Sequence[int]) -> None:
        state.extend(int(t) for t in tokens)

    def _propose(self, states: list[deque], budgets: list[int], chain: bool,
                 min_score: float | None) -> list[Draft]:
        start = time.perf_counter()
        with self._lock:
            contexts = [list(tail) for tail, b in zip(states, budgets) if b > 0]
        found = iter(self.source.lookup_batch(contexts) if contexts else [])
        lookup_s = time.perf_counter() - start
        out = []
        for budget in budgets:
            match = next(found) if budget > 0 else None
            if match is None:
                out.append(Draft.empty(self.score_kind).with_timing(lookup_s=lookup_s))
                continue
            mid = time.perf_counter()
            whole = Draft.from_tree(match.tree, self.prior)
            draft = whole.best_path(budget) if chain else whole.top(budget)
            out.append(draft.with_timing(lookup_s=lookup_s, merge_s=time.perf_counter() - mid))
        return out

    def config(self) -> dict:
        """Name, prior and what the backend serves."""
        return {"name": self.name, "prior": self.prior, "source": self.source.identity()}
