"""The n-gram trie against a brute-force n-gram scan; draft-merge invariants (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from datastore.tree import TokenTree
from decoder.draft import Draft, merge_drafts
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
    toks, pars, cnts, seen = [], [], [], set()
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


@settings(max_examples=200, deadline=None)
@given(trees(), trees(), st.integers(0, 40), st.floats(0.05, 1.0), st.floats(0.05, 1.0))
def test_merge_invariants(a, b, budget, wa, wb):
    draft = merge_drafts([(Draft.from_tree(a), wa), (Draft.from_tree(b), wb)], budget)
    paths = tree_paths(draft)
    union = set(tree_paths(a)) | set(tree_paths(b))
    assert len(draft) == min(budget, len(union))                       # within budget, as full as possible
    assert len(set(paths)) == len(paths)                               # no duplicate siblings
    assert set(paths) <= union                                         # nothing invented
    assert all(p < i for i, p in enumerate(draft.parents.tolist()))    # prefix-closed, parents first
    assert np.all(np.diff(draft.scores) <= 1e-12)                      # best-first
    pa = dict(zip(tree_paths(a), Draft.from_tree(a).scores * wa)) if len(a) else {}
    pb = dict(zip(tree_paths(b), Draft.from_tree(b).scores * wb)) if len(b) else {}
    for path, score in zip(paths, draft.scores.tolist()):
        expected = 1 - (1 - min(pa.get(path, 0.0), 1)) * (1 - min(pb.get(path, 0.0), 1))
        assert abs(score - expected) < 1e-9
    left_out = union - set(paths)
    if left_out and len(draft):
        best_left = max(1 - (1 - min(pa.get(p, 0.0), 1)) * (1 - min(pb.get(p, 0.0), 1)) for p in left_out)
        assert best_left <= draft.scores.min() + 1e-12


def test_trie_rejects_bad_parameters():
    import pytest

    with pytest.raises(ValueError, match="window"):
        NGramTrie(window=1)
    with pytest.raises(ValueError, match="max_prefix"):
        NGramTrie(window=4, max_prefix=4)
    with pytest.raises(ValueError, match="budget"):
        NGramTrie().match(0)
