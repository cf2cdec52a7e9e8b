"""A retrieval datastore as a drafter, ranked by its own counts: CREST's stored tree of the longest matching
n-gram, or REST's retrieved tree of the longest matching suffix (both through :class:`DatastoreSource`).

CREST §3 (https://arxiv.org/abs/2408.04678): the last ``max_n`` .. 1 tokens select
the stored tree of the longest matching n-gram, in one round trip. REST §3
(https://arxiv.org/abs/2311.08252): the longest suffix of 16 .. 2 tokens found in a
suffix array, and the trie of its occurrences' continuations. These are the papers' own
drafters (baselines); the merged drafter is :class:`drafting.service.DraftingService`.
"""

from __future__ import annotations

from ..draft import Draft, ScoreKind
from ..lifecycle import StatelessDrafter
from ..source import DatastoreSource


class RetrievalDrafter(StatelessDrafter):
    """Drafts the retrieved continuation tree, pruned to the budget by count ratios; one round trip a batch.

    Args:
        source: the fault-tolerant lookups.
        prior: additive smoothing of count ratios when ranking nodes (default 1.0, >= 0).
        name: how benchmarks label it (``datastore`` for CREST, ``rest`` for REST).

    Raises:
        ValueError: when ``prior < 0``.
    """

    score_kind = ScoreKind.COUNT_RATIO
    context_tokens = 64  # CREST reads <= 8, REST's default <= 16

    def __init__(self, source: DatastoreSource, prior: float = 1.0, name: str = "datastore") -> None:
        super().__init__()
        if prior < 0:
            raise ValueError(f"prior={prior}: must be >= 0")
        self.source, self.prior, self.name = source, prior, name

    def _propose(self, states: list[None], contexts: list[list[int]], budgets: list[int], chain: bool,
                 min_score: float | None) -> list[Draft]:
        asked = [c for c, b in zip(contexts, budgets) if b > 0]
        found = iter(self.source.lookup_batch(asked) if asked else [])
        out = []
        for budget in budgets:
            match = next(found) if budget > 0 else None
            if match is None:
                out.append(Draft.empty(self.score_kind))
                continue
            whole = Draft.from_tree(match.tree, self.prior)
            out.append(whole.best_path(budget) if chain else whole.top(budget))
        return out

    def close(self) -> None:
        """Close the source's backend (a later lookup reopens it)."""
        self.source.close()

    def config(self) -> dict:
        """Name, prior and what the backend serves."""
        return {"name": self.name, "prior": self.prior, "source": self.source.identity()}
