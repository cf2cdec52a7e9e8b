"""The draft tree: the one type that flows from every source through merging, verification and replay.

A draft hangs below the sequence's last committed token. Node ``i`` carries a
token, its parent (``-1`` for a child of the root, ``parents[i] < i``) and a
score: the estimated probability that the target accepts it. Depths and each
node's children are derived once, on first use.

Scoring a source's token tree (:meth:`Draft.from_tree`): the product of
child/parent count ratios along each path (CREST §3, https://arxiv.org/abs/2408.04678;
REST §3.2, https://arxiv.org/abs/2311.08252, ranks candidates by the same prefix
counts), which telescopes to ``count(node) / root_count``, smoothed by an additive
prior. Merging (:func:`merge_drafts`) combines sources per node by a weighted
noisy-OR, ``1 - prod_s (1 - w_s * p_s)``: a path both sources predict scores
higher than either alone, and a node missing from a source contributes 0 for it.
Every score is non-increasing along a path, so the best nodes (score desc, then
depth asc, then first-seen order) form a prefix-closed tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np

from datastore.tree import TokenTree

__all__ = ["Draft", "merge_drafts"]


@dataclass(frozen=True, eq=False)
class Draft:
    """A draft tree ready for verification, with what assembling it cost.

    Attributes:
        token_ids: ``[num_nodes]`` int64 draft tokens; siblings differ.
        parents: ``[num_nodes]`` int32 parent index, ``-1`` for a child of the root, ``parents[i] < i``.
        scores: ``[num_nodes]`` float64 estimated acceptance probability, non-increasing along
            every path (a merged draft is also in best-first order).
        lookup_s / trie_s / merge_s: seconds spent on datastore lookups, on the prompt trie (or a
            scan of the sequence), and on merging and pruning, for this draft.
    """

    token_ids: np.ndarray
    parents: np.ndarray
    scores: np.ndarray
    lookup_s: float = 0.0
    trie_s: float = 0.0
    merge_s: float = 0.0

    def __len__(self) -> int:
        return len(self.token_ids)

    @cached_property
    def depths(self) -> np.ndarray:
        """``[num_nodes]`` int64 depth of each node; children of the root have depth 1."""
        d = np.zeros(len(self), dtype=np.int64)
        for i, p in enumerate(self.parents.tolist()):
            d[i] = 1 if p < 0 else d[p] + 1
        return d

    @cached_property
    def children(self) -> list[dict[int, int]]:
        """``children[q]`` maps token -> node for the children of query ``q``: ``q = 0`` is the root
        (the last committed token) and ``q = 1 + i`` is node ``i``; insertion order is node order."""
        kids: list[dict[int, int]] = [{} for _ in range(len(self) + 1)]
        for i, (t, p) in enumerate(zip(self.token_ids.tolist(), self.parents.tolist())):
            kids[p + 1][t] = i
        return kids

    def with_timing(self, *, lookup_s: float = 0.0, trie_s: float = 0.0, merge_s: float = 0.0) -> "Draft":
        """The same nodes with these assembly costs (seconds)."""
        return Draft(self.token_ids, self.parents, self.scores, lookup_s, trie_s, merge_s)

    @classmethod
    def empty(cls) -> "Draft":
        """No nodes: the step verifies only the last committed token (plain decoding)."""
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.float64))

    @classmethod
    def chain(cls, tokens: Sequence[int], scores: Sequence[float] | None = None) -> "Draft":
        """A single path (what chain verifiers such as vLLM's take); scores default to 1.0."""
        k = len(tokens)
        return cls(np.asarray(tokens, dtype=np.int64).reshape(k), np.arange(-1, k - 1, dtype=np.int32),
                   np.ones(k) if scores is None else np.asarray(scores, dtype=np.float64))

    @classmethod
    def from_tree(cls, tree: TokenTree, prior: float = 0.0) -> "Draft":
        """Score a source's token tree: each node gets the product of ``count(child) / (count(parent) + prior)``
        along its path (with ``prior == 0`` this telescopes to ``count(node) / root_count``).

        A positive ``prior`` shrinks ratios drawn from few occurrences (additive smoothing:
        ``2 / (2 + 2)`` instead of ``2 / 2``). When ``root_count`` is 0 (unknown), the sum of the
        root's children's counts stands in for it. Node order is the tree's.

        Raises:
            ValueError: when ``prior < 0``.
        """
        if prior < 0:
            raise ValueError(f"prior={prior}: must be >= 0")
        counts = tree.counts.astype(np.float64)
        root = float(tree.root_count or counts[tree.parents < 0].sum())
        scores = np.zeros(len(counts), dtype=np.float64)
        for i, p in enumerate(tree.parents.tolist()):
            if p < 0:
                scores[i] = counts[i] / (root + prior) if root + prior > 0 else 0.0
            else:
                scores[i] = scores[p] * (counts[i] / (counts[p] + prior))  # ratio <= 1 first: never above the parent
        return cls(tree.token_ids.astype(np.int64), tree.parents.astype(np.int32), scores)


def merge_drafts(sources: Sequence[tuple[Draft, float]], budget: int) -> Draft:
    """Merge drafts into one draft tree of at most ``budget`` nodes, best first.

    Args:
        sources: ``(draft, weight)`` pairs; a weight in ``(0, 1]`` scales that source's
            scores before the noisy-OR. Drafts hang below the same root (the sequence end).
        budget: most nodes kept, >= 0.

    Returns:
        A :class:`Draft` in best-first order (score desc, depth asc, first-seen order), shared
        prefixes merged, prefix-closed. Assembly times are 0 (the caller records them).

    Raises:
        ValueError: when ``budget < 0`` or a weight is outside ``(0, 1]``.
    """
    if budget < 0:
        raise ValueError(f"budget={budget}: must be >= 0")
    keys: dict[tuple[int, int], int] = {}  # (merged parent, token) -> merged node
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    miss: list[float] = []  # prod_s (1 - w_s p_s) per merged node
    for draft, weight in sources:
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"source weight {weight}: must be in (0, 1]")
        where = [0] * len(draft)
        for i, (tok, par, depth, score) in enumerate(zip(draft.token_ids.tolist(), draft.parents.tolist(),
                                                         draft.depths.tolist(), draft.scores.tolist())):
            mpar = -1 if par < 0 else where[par]
            node = keys.get((mpar, tok))
            if node is None:
                node = keys[(mpar, tok)] = len(tokens)
                tokens.append(tok)
                parents.append(mpar)
                depths.append(depth)
                miss.append(1.0)
            miss[node] *= 1.0 - min(weight * score, 1.0)
            where[i] = node
    if not tokens or budget == 0:
        return Draft.empty()
    score = 1.0 - np.asarray(miss)
    order = np.lexsort((np.arange(len(tokens)), np.asarray(depths), -score))[:budget]
    new_index = np.full(len(tokens) + 1, -1, dtype=np.int64)  # slot -1 maps the root to -1
    new_index[order] = np.arange(len(order))
    return Draft(np.asarray(tokens, dtype=np.int64)[order], new_index[np.asarray(parents)[order]].astype(np.int32),
                 score[order])
