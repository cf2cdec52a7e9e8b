"""A retrieval datastore as a drafting method, ranked by its own counts: CREST's stored tree of the longest matching
n-gram, or REST's retrieved tree of the longest matching suffix (both through :class:`DatastoreSource`).

CREST §3 (https://arxiv.org/abs/2408.04678): the last ``max_n`` .. 1 tokens select
the stored tree of the longest matching n-gram, in one round trip. REST §3
(https://arxiv.org/abs/2311.08252): the longest suffix of 16 .. 2 tokens found in a
suffix array, and the trie of its occurrences' continuations. These are the papers' own
drafters (baselines); the merged drafter is :class:`drafting.merged.MergedMethod`.
"""

from __future__ import annotations

from ..draft import Draft, ScoreKind
from ..method import Stateless, Step
from ..source import DatastoreSource

__all__ = ["Retrieval"]

CONTEXT_TOKENS = 64
"""Trailing tokens of each row looked up (CREST reads <= 8, REST's default <= 16)."""


class Retrieval(Stateless):
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
        if prior < 0:
            raise ValueError(f"prior={prior}: must be >= 0")
        self.source, self.prior, self.name = source, prior, name

    def draft(self, step: Step) -> list[Draft]:
        """Each row's retrieved tree, cut to its budget (its best path for a chain)."""
        asked = [i for i, b in enumerate(step.budgets) if b > 0]
        found = self.source.lookup_batch([step.tail(i, CONTEXT_TOKENS) for i in asked]) if asked else []
        out = [Draft.empty(self.score_kind) for _ in step.budgets]
        for i, match in zip(asked, found):
            if match is not None:
                whole = Draft.from_tree(match.tree, self.prior)
                budget = int(step.budgets[i])
                out[i] = whole.cut(budget, step.chain)
        return out

    def close(self) -> None:
        """Close the source's backend (a later lookup reopens it)."""
        self.source.close()

    def config(self) -> dict:
        """Name, prior and what the backend serves."""
        return {"name": self.name, "prior": self.prior, "source": self.source.identity()}
