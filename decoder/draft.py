"""Draft trees: a token tree plus each node's estimated probability of acceptance, and how they merge.

A source's estimate for a node is the product of child/parent count ratios along
its path (CREST §3; REST §3.2 scores candidates by the same prefix counts), which
telescopes to ``count(node) / root_count``. Several sources are combined per
node by a weighted noisy-OR, ``1 - prod_s (1 - w_s * p_s)``: a path that both
sources predict scores higher than either alone, and a node missing from a
source contributes 0 for it. Every estimate is non-increasing along a path, so
keeping the best nodes (score desc, then depth asc, then node order) keeps a
prefix-closed tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from datastore.tree import TokenTree

__all__ = ["Draft", "EMPTY_DRAFT", "source_probabilities", "merge_drafts"]

_SCORE_SCALE = 1_000_000  # draft-tree counts are scores in millionths


@dataclass(frozen=True)
class Draft:
    """A draft tree ready for verification.

    Attributes:
        tree: the nodes (``token_ids`` uint32, ``parents`` int32, ``-1`` = root,
            ``parents[i] < i``, no duplicate siblings); ``counts`` uint32 holds
            each node's score in millionths so the tree stays a valid
            :class:`datastore.TokenTree` (scores never grow along a path).
        scores: ``[num_nodes]`` float64, estimated probability that each node
            is accepted; sorted descending (node order is best-first).
    """

    tree: TokenTree
    scores: np.ndarray

    def __len__(self) -> int:
        return len(self.tree)


EMPTY_DRAFT = Draft(
    TokenTree.trusted(np.zeros(0, np.uint32), np.zeros(0, np.int32), np.zeros(0, np.uint32), 0),
    np.zeros(0, np.float64),
)


def source_probabilities(tree: TokenTree, prior: float = 0.0) -> np.ndarray:
    """``[num_nodes]`` float64: the product of ``count(child) / (count(parent) + prior)`` along each path.

    With ``prior == 0`` this telescopes to ``count(node) / root_count``. A
    positive ``prior`` shrinks ratios drawn from few occurrences (additive
    smoothing): ``2 / (2 + 2)`` instead of ``2 / 2``. When ``root_count`` is 0
    (unknown), the sum of the root's children's counts stands in for it.

    Raises:
        ValueError: when ``prior < 0``.
    """
    if prior < 0:
        raise ValueError(f"prior={prior}: must be >= 0")
    counts = tree.counts.astype(np.float64)
    root = float(tree.root_count or counts[tree.parents < 0].sum())
    probs = np.zeros(len(counts), dtype=np.float64)
    parents = tree.parents.tolist()
    for i, p in enumerate(parents):
        if p < 0:
            probs[i] = counts[i] / (root + prior) if root + prior > 0 else 0.0
        else:
            probs[i] = probs[p] * (counts[i] / (counts[p] + prior))  # ratio <= 1 first: never above the parent
    return probs


def merge_drafts(sources: Sequence[tuple[TokenTree, float]], budget: int, prior: float = 0.0) -> Draft:
    """Merge token trees into one draft tree of at most ``budget`` nodes.

    Args:
        sources: ``(tree, weight)`` pairs; a weight in ``(0, 1]`` scales that
            source's probabilities before the noisy-OR. Trees hang below the same
            root (the current sequence end).
        budget: most nodes kept, >= 0.
        prior: additive smoothing of each count ratio (:func:`source_probabilities`), >= 0.

    Returns:
        A :class:`Draft` whose nodes are in best-first order (score desc, depth
        asc, first-seen order), shared prefixes merged, prefix-closed.

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
    for tree, weight in sources:
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"source weight {weight}: must be in (0, 1]")
        if len(tree) == 0:
            continue
        probs = source_probabilities(tree, prior) * weight
        where = [0] * len(tree)
        for i, (tok, par) in enumerate(zip(tree.token_ids.tolist(), tree.parents.tolist())):
            mpar = -1 if par < 0 else where[par]
            key = (mpar, tok)
            node = keys.get(key)
            if node is None:
                node = len(tokens)
                keys[key] = node
                tokens.append(tok)
                parents.append(mpar)
                depths.append(1 if mpar < 0 else depths[mpar] + 1)
                miss.append(1.0)
            miss[node] *= 1.0 - min(float(probs[i]), 1.0)
            where[i] = node
    if not tokens or budget == 0:
        return EMPTY_DRAFT
    score = 1.0 - np.asarray(miss)
    order = np.lexsort((np.arange(len(tokens)), np.asarray(depths), -score))[:budget]
    return _reindex(order, np.asarray(tokens), np.asarray(parents), score)


def _reindex(order: np.ndarray, tokens: np.ndarray, parents: np.ndarray, score: np.ndarray) -> Draft:
    """Keep nodes ``order`` (parents before children), renumbering parents."""
    new_index = np.full(len(tokens) + 1, -1, dtype=np.int64)  # slot -1 maps the root to -1
    new_index[order] = np.arange(len(order))
    kept_parents = new_index[parents[order]]
    kept_score = score[order]
    counts = np.maximum(np.round(kept_score * _SCORE_SCALE), 0).astype(np.uint32)
    # rounding keeps scores non-increasing along a path, so the count invariant holds
    tree = TokenTree(tokens[order].astype(np.uint32), kept_parents.astype(np.int32), counts, _SCORE_SCALE)
    return Draft(tree, kept_score)
