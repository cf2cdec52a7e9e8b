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


@settings(max_examples=100, deadline=None)
@given(st.data(), trees(), st.integers(0, 12))
def test_every_cut_keeps_each_nodes_sources(data, tree, budget):
    """A node's sources (``Draft.sources``) travel with it through the tree cut, the chain cut, a batch and the
    batch's goodput cut: each kept node keeps the bits it had."""
    from drafting.draft import CostCurve, Drafts

    scores = _scored(data.draw, tree)
    bits = np.asarray(data.draw(st.lists(st.integers(0, 31), min_size=len(tree), max_size=len(tree))), np.uint8)
    whole = Draft(tree.token_ids, tree.parents, scores, ScoreKind.PROBABILITY, bits)
    of_path = dict(zip(tree_paths(tree), bits.tolist()))
    def bits_of(d: Draft) -> list[int]:
        assert d.sources is not None and d.sources.dtype == np.uint8 and not d.sources.flags.writeable
        return d.sources.tolist()

    for one in (whole.top(budget), whole.best_path(budget)):
        assert [of_path[q] for q in tree_paths(one)] == bits_of(one)
    chains = [whole.best_path(budget), whole.best_path(budget // 2)]
    batch = Drafts.of(chains, ScoreKind.PROBABILITY)
    assert [bits_of(d) for d in batch] == [bits_of(c) for c in chains]
    cut = batch.goodput(CostCurve(np.array([1.0, 64.0]), np.array([0.02, 0.02]), 0.001), rows=2)
    assert [bits_of(d) for d in cut] == [bits_of(c)[:len(d)] for c, d in zip(chains, cut)]


def test_a_draft_without_sources_and_mismatched_sources():
    """A drafter that records no sources makes drafts without them (``None``), and so do their cuts and batches; a
    sources array of another length is refused, naming it."""
    from drafting.draft import Drafts

    plain = Draft.chain([4, 5, 6], [0.9, 0.5, 0.2], ScoreKind.PROBABILITY)
    assert plain.sources is None and plain.top(2).sources is None and plain.best_path(2).sources is None
    assert Drafts.of([plain, Draft.chain([7], [0.3], ScoreKind.PROBABILITY)], ScoreKind.PROBABILITY).sources is None
    with pytest.raises(ValueError, match="sources=2"):
        Draft(plain.token_ids, plain.parents, plain.scores, ScoreKind.PROBABILITY, np.array([1, 2], np.uint8))
