"""Counting, top-t and token trees against brute-force oracles, on random and real token streams."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datastore.codec import decode_tree, encode_trees
from ingest.continuations import SEPARATOR, build_trees
from ingest.counting import count_top_t
from ingest.occurrences import partitions, tag_occurrences
from oracle.ingest import continuation_tree, count_ngrams, top_t


def _check(stream, n, t, depth, budget, tmp_path, max_occurrences=10**9, min_count=1, sample=None):
    kept = count_top_t(stream, n, t, min_count)
    expected = top_t(count_ngrams(stream, n), t, min_count)
    assert [tuple(g) for g in kept.ngrams.tolist()] == [g for g, _ in expected]
    assert kept.counts.tolist() == [c for _, c in expected]
    tags = tag_occurrences(stream, kept, tmp_path / "tags.npy")
    seen = 0
    for tree_index, positions, local in partitions(tags, kept, max_occurrences):
        batch = build_trees(stream, positions, local, kept.counts[tree_index], n, depth, budget)
        blobs = encode_trees(batch)
        for k, i in enumerate(tree_index.tolist()):
            seen += 1
            if sample is not None and i % sample:
                continue
            tree = decode_tree(blobs[k])
            root, nodes = continuation_tree(stream, tuple(kept.ngrams[i].tolist()), depth, budget)
            assert tree.root_count == root == int(kept.counts[i])
            assert list(zip(tree.paths(), tree.counts.tolist())) == nodes
            assert len(tree) <= budget
    assert seen == len(kept)


@st.composite
def streams(draw):
    vocab = draw(st.integers(1, 6))
    length = draw(st.integers(0, 300))
    toks = draw(st.lists(st.integers(0, vocab - 1), min_size=length, max_size=length))
    seps = draw(st.lists(st.integers(0, max(length - 1, 0)), max_size=6))
    arr = np.array(toks, dtype=np.uint32)
    for s in seps:
        if s < len(arr):
            arr[s] = SEPARATOR
    return arr


@settings(max_examples=60, deadline=None)
@given(streams(), st.integers(1, 4), st.integers(1, 25), st.integers(1, 6), st.integers(1, 12),
       st.integers(1, 50), st.integers(1, 3))
def test_random_streams_match_oracle(tmp_path_factory, stream, n, t, depth, budget, max_occ, min_count):
    _check(stream, n, t, depth, budget, tmp_path_factory.mktemp("t"), max_occ, min_count)


def test_large_token_ids_beyond_16_bits(tmp_path):
    rng = np.random.default_rng(7)
    stream = (rng.integers(0, 4, 500) * 1_000_003 + 70_000).astype(np.uint32)  # ids up to ~3M
    _check(stream, 2, 10, 4, 8, tmp_path)


@pytest.mark.parametrize("n", [1] + [pytest.param(n, marks=pytest.mark.slow) for n in (2, 3, 5)])
def test_real_token_stream_matches_oracle(real_stream, tmp_path, n):
    # every kept n-gram is checked for n>1; for unigrams every 50th (the oracle is quadratic)
    _check(real_stream, n, 300, 10, 64, tmp_path, max_occurrences=20_000, sample=50 if n == 1 else None)


def test_partitioning_does_not_change_trees(real_stream, tmp_path):
    kept = count_top_t(real_stream, 2, 200)
    tags = tag_occurrences(real_stream, kept, tmp_path / "tags.npy")

    def trees(max_occ):
        out = {}
        for ti, pos, loc in partitions(tags, kept, max_occ):
            batch = build_trees(real_stream, pos, loc, kept.counts[ti], 2, 10, 64)
            out.update({int(i): batch.tree(k) for k, i in enumerate(ti.tolist())})
        return out

    assert trees(10**9) == trees(500)
