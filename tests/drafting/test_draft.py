"""The draft type (:mod:`drafting.draft`) and the native core's cuts it calls: the best prefix-closed nodes and the best
path against brute force on random trees (hypothesis); cuts need probabilities; a draft is read-only."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datastore.tree import TokenTree
from drafting.draft import Draft, ScoreKind
from support import tree_paths, trees


def _scored(draw, tree: TokenTree) -> np.ndarray:
    """Random scores that never rise along a path (ties allowed: they exercise the tie-breaks)."""
    scores = np.zeros(len(tree))
    for i, p in enumerate(tree.parents.tolist()):
        top = 1.0 if p < 0 else scores[p]
        scores[i] = draw(st.sampled_from([top, top / 2, top / 3, 0.0]))
    return scores


@settings(max_examples=200, deadline=None)
@given(st.data(), trees(), st.integers(0, 40), st.sampled_from([0.0, 0.1, 0.4]))
def test_top_nodes_are_the_best_prefix_closed_nodes(data, tree, budget, cut):
    scores = _scored(data.draw, tree)
    draft = Draft(tree.token_ids, tree.parents, scores, ScoreKind.PROBABILITY).top(budget, cut)
    eligible = int((scores >= cut).sum())
    assert len(draft) == min(budget, eligible)                              # within budget, as full as possible
    assert all(p < i for i, p in enumerate(draft.parents.tolist()))         # prefix-closed, parents first
    assert np.all(np.diff(draft.scores) <= 0) and np.all(draft.scores >= cut)  # best-first, above the cut
    kept = set(tree_paths(draft))
    assert kept <= set(tree_paths(tree))
    left_out = [s for q, s in zip(tree_paths(tree), scores.tolist()) if q not in kept and s >= cut]
    if left_out and len(draft):
        assert max(left_out) <= draft.scores.min()


def _all_paths_best(parents: np.ndarray, scores: np.ndarray, k: int, cut: float) -> float:
    """Brute force: the largest score sum over every root path of at most ``k`` nodes, each >= ``cut``."""
    best = 0.0
    for i in range(len(parents)):
        total, node, depth, ok = 0.0, i, 0, True
        while node >= 0:
            total += scores[node]
            ok &= scores[node] >= cut
            node = int(parents[node])
            depth += 1
        if depth <= k and ok:
            best = max(best, total)
    return best


@settings(max_examples=200, deadline=None)
@given(st.data(), trees(), st.integers(0, 6), st.sampled_from([0.0, 0.1, 0.4]))
def test_best_path_against_brute_force(data, tree, k, cut):
    scores = _scored(data.draw, tree)
    chain = Draft(tree.token_ids, tree.parents, scores, ScoreKind.PROBABILITY).best_path(k, cut)
    assert chain.parents.tolist() == list(range(-1, len(chain) - 1)) and len(chain) <= k
    assert chain.scores.sum() == pytest.approx(_all_paths_best(tree.parents, scores, k, cut))
    assert tuple(chain.token_ids.tolist()) in set(tree_paths(tree)) | {()}


def test_cuts_need_probabilities_and_bounds_are_checked():
    tree = TokenTree(np.array([1, 2]), np.array([-1, 0]), np.array([3, 2]), 4)
    ranked = Draft.from_tree(tree)
    assert ranked.score_kind is ScoreKind.COUNT_RATIO and len(ranked.top(5)) == 2
    with pytest.raises(ValueError, match="probability"):
        ranked.top(5, min_score=0.2)
    with pytest.raises(ValueError, match="probability"):
        ranked.best_path(5, min_score=0.2)
    with pytest.raises(ValueError, match="max_len"):
        ranked.best_path(-1)
    with pytest.raises(ValueError, match="budget"):
        ranked.top(-1)
    with pytest.raises(ValueError):  # read-only: a draft never changes
        ranked.scores[0] = 1.0
