"""The n-gram trie against a brute-force n-gram scan; the tree operations (union, best-first selection, best path)
against brute force on random trees (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datastore.tree import TokenTree
from decoder import treeops
from decoder.draft import Draft, ScoreKind
from decoder.ngram_trie import NGramTrie


def brute_counts(seq: list[int], window: int) -> dict[tuple[int, ...], int]:
    """How many window starts begin with each path (paths no longer than the window)."""
    out: dict[tuple[int, ...], int] = {}
    for i in range(len(seq)):
        w = seq[i:i + window]
        for d in range(1, len(w) + 1):
            out[tuple(w[:d])] = out.get(tuple(w[:d]), 0) + 1
    return out


def tree_paths(tree: TokenTree | Draft) -> list[tuple[int, ...]]:
    paths: list[tuple[int, ...]] = []
    for tok, par in zip(tree.token_ids.tolist(), tree.parents.tolist()):
        paths.append((paths[par] if par >= 0 else ()) + (tok,))
    return paths


seqs = st.lists(st.integers(0, 4), min_size=1, max_size=60)


@settings(max_examples=150, deadline=None)
@given(seqs, st.integers(2, 8), st.integers(1, 3), st.integers(1, 40), st.integers(0, 59))
def test_trie_matches_brute_force(seq, window, max_prefix, budget, split):
    max_prefix = min(max_prefix, window - 1)
    trie = NGramTrie(window, max_prefix)
    trie.extend(seq[:split])  # built in two pieces: prompt, then generated tokens
    trie.extend(seq[split:])
    oracle = brute_counts(seq, window)
    assert len(trie) == len(oracle)
    match = trie.match(budget)
    # the longest suffix (<= max_prefix) that occurred with a continuation
    expected_len = next((n for n in range(min(max_prefix, len(seq)), 0, -1)
                         if any(len(p) == n + 1 and p[:n] == tuple(seq[-n:]) for p in oracle)), None)
    if expected_len is None:
        assert match is None
        return
    assert match is not None
    assert match.ngram == tuple(seq[-expected_len:])
    ctx = match.ngram
    assert match.tree.root_count == oracle[ctx] - 1  # the sequence's own, final occurrence is not evidence
    paths = tree_paths(match.tree)
    below = {p[len(ctx):]: c for p, c in oracle.items() if len(p) > len(ctx) and p[:len(ctx)] == ctx}
    assert len(paths) == min(budget, len(below))
    for path, count in zip(paths, match.tree.counts.tolist()):
        assert below[path] == count
    # best-first: every node left out counts no more than the least kept one
    if len(paths) < len(below):
        assert max(c for p, c in below.items() if p not in set(paths)) <= min(match.tree.counts.tolist())


def random_tree(draw, vocab: int, max_nodes: int) -> TokenTree:
    n = draw(st.integers(0, max_nodes))
    toks: list[int] = []
    pars: list[int] = []
    cnts: list[int] = []
    seen: set[tuple[int, int]] = set()
    for i in range(n):
        p = draw(st.integers(-1, i - 1))
        t = draw(st.integers(0, vocab - 1))
        if (p, t) in seen:
            continue
        seen.add((p, t))
        # remap to the compacted index space
        p = -1 if p < 0 or p >= len(toks) else p
        if (p, t) in {(a, b) for a, b in zip(pars, toks)}:
            continue
        cap = cnts[p] if p >= 0 else 50
        toks.append(t)
        pars.append(p)
        cnts.append(draw(st.integers(1, cap)))
    root = max([c for c, p in zip(cnts, pars) if p < 0], default=0) + draw(st.integers(0, 20))
    return TokenTree(np.array(toks, np.uint32), np.array(pars, np.int32), np.array(cnts, np.uint32), root)


@st.composite
def trees(draw):
    return random_tree(draw, vocab=4, max_nodes=30)


def _scored(draw, tree: TokenTree) -> np.ndarray:
    """Random scores that never rise along a path (ties allowed: they exercise the tie-breaks)."""
    scores = np.zeros(len(tree))
    for i, p in enumerate(tree.parents.tolist()):
        top = 1.0 if p < 0 else scores[p]
        scores[i] = draw(st.sampled_from([top, top / 2, top / 3, 0.0]))
    return scores


@settings(max_examples=200, deadline=None)
@given(trees(), trees(), trees())
def test_union_is_the_exact_union(a, b, c):
    kids = treeops.children(a.token_ids, a.parents)
    u = treeops.union(a.token_ids, a.parents, treeops.depths(a.parents), kids,
                      [(b.token_ids, b.parents), (c.token_ids, c.parents)])
    paths = tree_paths(Draft(u.tokens, u.parents, np.zeros(len(u.tokens))))
    assert len(set(paths)) == len(paths) == len(set(tree_paths(a)) | set(tree_paths(b)) | set(tree_paths(c)))
    assert paths[:len(a)] == tree_paths(a)                                  # the base first, in its order
    assert all(p < i for i, p in enumerate(u.parents.tolist()))             # parents first
    assert u.depths.tolist() == [len(q) for q in paths]
    for tree, where in zip((a, b, c), u.where):                             # each tree's nodes map to themselves
        assert [paths[w] for w in where.tolist()] == tree_paths(tree)


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


def test_trie_rejects_bad_parameters():
    with pytest.raises(ValueError, match="window"):
        NGramTrie(window=1)
    with pytest.raises(ValueError, match="max_prefix"):
        NGramTrie(window=4, max_prefix=4)
    with pytest.raises(ValueError, match="budget"):
        NGramTrie().match(0)
