"""The papers' drafters (:mod:`research.drafters`): the N-gram trie against a brute-force n-gram scan, and its
parameters checked."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from research.drafters.ngram_trie import NGramTrie
from support import tree_paths


def brute_counts(seq: list[int], window: int) -> dict[tuple[int, ...], int]:
    """How many window starts begin with each path (paths no longer than the window)."""
    out: dict[tuple[int, ...], int] = {}
    for i in range(len(seq)):
        w = seq[i:i + window]
        for d in range(1, len(w) + 1):
            out[tuple(w[:d])] = out.get(tuple(w[:d]), 0) + 1
    return out


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


def test_trie_rejects_bad_parameters():
    with pytest.raises(ValueError, match="window"):
        NGramTrie(window=1)
    with pytest.raises(ValueError, match="max_prefix"):
        NGramTrie(window=4, max_prefix=4)
    with pytest.raises(ValueError, match="budget"):
        NGramTrie().match(0)
