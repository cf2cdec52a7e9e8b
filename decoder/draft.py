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

__all__ = ["Draft", "merge_drafts", "best_chain", "select_best", "chain_from"]


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

    def miss_factors(self, weight: float) -> np.ndarray:
        """``[num_nodes]`` float64 ``1 - min(weight * score, 1)``: each node's factor in a noisy-OR merge
        (kept for the last weight asked: a datastore draft reused across steps is merged with one weight)."""
        cached = self.__dict__.get("_miss")
        if cached is None or cached[0] != weight:
            cached = self.__dict__["_miss"] = (weight, 1.0 - np.minimum(weight * self.scores, 1.0))
        return cached[1]

    def with_timing(self, *, lookup_s: float = 0.0, trie_s: float = 0.0, merge_s: float = 0.0) -> "Draft":
        """The same nodes with these assembly costs (seconds)."""
        return Draft(self.token_ids, self.parents, self.scores, lookup_s, trie_s, merge_s)

    def best_path(self, max_len: int, min_score: float = 0.0) -> "Draft":
        """The most probable path as a chain (what a chain verifier, such as vLLM's, takes from a draft tree).

        A chain's expected accepted length is the sum of its nodes' acceptance probabilities, so
        this is the root path of at most ``max_len`` nodes, each scoring at least ``min_score``,
        with the largest sum of scores (ties: the earlier node in node order).

        Raises:
            ValueError: when ``max_len < 0``.
        """
        if max_len < 0:
            raise ValueError(f"max_len={max_len}: must be >= 0")
        nodes = np.flatnonzero((self.scores >= min_score) & (self.depths <= max_len))  # what a chain can use
        path = _best_path(nodes.tolist(), self.parents[nodes].tolist(), self.scores[nodes].tolist())
        return Draft.chain(self.token_ids[path], self.scores[path]).with_timing(
            lookup_s=self.lookup_s, trie_s=self.trie_s, merge_s=self.merge_s)

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


def _best_path(nodes: list[int], parents: list[int], scores: list[float]) -> list[int]:
    """The root path with the largest sum of scores, over ``nodes`` (indices, ascending, parents before
    children) and their ``parents`` and ``scores``: a node whose parent is not among them (and not the
    root, -1) is unreachable. Ties go to the earlier node. Returns the path's indices, root first."""
    total: dict[int, float] = {-1: 0.0}  # reachable nodes: sum of scores from the root
    parent_of: dict[int, int] = {}
    best, best_sum = -1, 0.0
    for i, p, sc in zip(nodes, parents, scores):
        if p in total:
            t = total[i] = sc + total[p]
            parent_of[i] = p
            if t > best_sum:
                best, best_sum = i, t
    path: list[int] = []
    while best >= 0:
        path.append(best)
        best = parent_of[best]
    return path[::-1]


@dataclass
class _Union:
    """The union of several drafts' nodes with their noisy-OR scores (parents before children)."""

    tokens: np.ndarray
    parents: np.ndarray
    depths: np.ndarray
    scores: np.ndarray


def _union(sources: Sequence[tuple[Draft, float]]) -> _Union | None:
    """The first non-empty draft taken whole, each later one walked through the first's cached ``children``;
    ``None`` when every draft is empty."""
    for _, weight in sources:
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"source weight {weight}: must be in (0, 1]")
    sources = [(d, w) for d, w in sources if len(d)]
    if not sources:
        return None
    base, w0 = sources[0]
    n0 = len(base)
    base_kids = base.children
    miss = base.miss_factors(w0).copy()  # prod_s (1 - w_s p_s) per merged node
    added: dict[tuple[int, int], int] = {}  # (merged parent, token) -> merged node, for nodes not in the base
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    extra_miss: list[float] = []
    for draft, weight in sources[1:]:
        where = [0] * len(draft)
        for i, (tok, par, depth, score) in enumerate(zip(draft.token_ids.tolist(), draft.parents.tolist(),
                                                         draft.depths.tolist(), draft.scores.tolist())):
            mpar = -1 if par < 0 else where[par]
            node = base_kids[mpar + 1].get(tok) if mpar < n0 else None
            if node is None:
                node = added.get((mpar, tok))
            if node is None:
                node = added[(mpar, tok)] = n0 + len(tokens)
                tokens.append(tok)
                parents.append(mpar)
                depths.append(depth)
                extra_miss.append(1.0)
            factor = 1.0 - min(weight * score, 1.0)
            if node < n0:
                miss[node] *= factor
            else:
                extra_miss[node - n0] *= factor
            where[i] = node
    if not tokens:
        return _Union(base.token_ids, base.parents.astype(np.int64), base.depths, 1.0 - miss)
    return _Union(np.concatenate([base.token_ids, np.asarray(tokens, dtype=np.int64)]),
                  np.concatenate([base.parents.astype(np.int64), np.asarray(parents, dtype=np.int64)]),
                  np.concatenate([base.depths, np.asarray(depths, dtype=np.int64)]),
                  1.0 - np.concatenate([miss, np.asarray(extra_miss)]))


def merge_drafts(sources: Sequence[tuple[Draft, float]], budget: int) -> Draft:
    """Merge drafts into one draft tree of at most ``budget`` nodes, best first.

    The first non-empty draft is taken whole (its nodes keep their order); every later one is
    walked node by node through the first's cached ``children``, so merging a small draft into
    a large, often-reused one (a datastore tree) costs time in the small one's size.

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
    u = _union(sources)
    if u is None or budget == 0:
        return Draft.empty()
    return select_best(u.tokens, u.parents, u.depths, u.scores, budget)


def select_best(tokens: np.ndarray, parents: np.ndarray, depths: np.ndarray, scores: np.ndarray, budget: int,
                min_score: float = 0.0) -> Draft:
    """The best ``budget`` nodes of a scored tree (score desc, depth asc, node order), as a best-first draft.

    Args:
        tokens / parents / depths / scores: ``[N]`` arrays of a tree whose parents precede their
            children and whose scores never rise along a path (so the result is prefix-closed).
        budget: most nodes kept, >= 0.
        min_score: nodes scoring below this are dropped.
    """
    order = np.lexsort((np.arange(len(scores)), depths, -scores))[:budget]
    if min_score > 0:
        order = order[scores[order] >= min_score]
    new_index = np.full(len(scores) + 1, -1, dtype=np.int64)  # slot -1 maps the root to -1
    new_index[order] = np.arange(len(order))
    return Draft(np.asarray(tokens)[order], new_index[parents[order]].astype(np.int32), scores[order])


def chain_from(tokens: np.ndarray, parents: np.ndarray, depths: np.ndarray, scores: np.ndarray, max_len: int,
               min_score: float = 0.0) -> Draft:
    """The scored tree's root path of at most ``max_len`` nodes, each scoring at least ``min_score``, with
    the largest sum of scores (a chain's expected accepted length); arrays as for :func:`select_best`."""
    nodes = np.flatnonzero((scores >= min_score) & (depths <= max_len))  # the only nodes a chain can use
    path = _best_path(nodes.tolist(), parents[nodes].tolist(), scores[nodes].tolist())
    return Draft.chain(np.asarray(tokens)[path], scores[path])


def best_chain(sources: Sequence[tuple[Draft, float]], max_len: int, min_score: float = 0.0) -> Draft:
    """The merged tree's most probable path: :meth:`Draft.best_path` of the unbounded merge of ``sources``
    (the same union and noisy-OR scores as :func:`merge_drafts`), without building that tree.

    Args:
        sources: ``(draft, weight)`` pairs, as for :func:`merge_drafts`.
        max_len: most chain tokens, >= 0.
        min_score: the chain stops before the first node scoring below this.

    Raises:
        ValueError: when ``max_len < 0`` or a weight is outside ``(0, 1]``.
    """
    u = _union(sources)
    if u is None:
        if max_len < 0:
            raise ValueError(f"max_len={max_len}: must be >= 0")
        return Draft.empty()
    if max_len < 0:
        raise ValueError(f"max_len={max_len}: must be >= 0")
    return chain_from(u.tokens, u.parents, u.depths, u.scores, max_len, min_score)
