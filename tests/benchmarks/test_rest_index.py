"""The REST baseline: suffix-array retrieval against a brute-force scan, its size accounting, its drafter."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.peer_drafters import RetrievalDrafter
from benchmarks.rest_index import RestParams, SuffixIndex
from drafting import DatastoreSource
from evaluation.simulate import replay
from ingest.continuations import SEPARATOR
from oracle.ingest import rest_retrieve, tree_paths
from research.study.corpus import prefix_end
from support import run_module


def _stream(docs: list[list[int]]) -> np.ndarray:
    return np.array([t for d in docs for t in (*d, int(SEPARATOR))], dtype=np.uint32)


@settings(max_examples=150, deadline=None)
@given(docs=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=25), min_size=1, max_size=8),
       context=st.lists(st.integers(0, 3), min_size=0, max_size=7),
       max_matches=st.integers(1, 6), depth=st.integers(1, 4), budget=st.integers(1, 9),
       min_len=st.integers(1, 3))
def test_retrieve_matches_brute_force(docs, context, max_matches, depth, budget, min_len):
    stream = _stream(docs)
    index = SuffixIndex.build(stream, vocab_size=4)
    got = index.retrieve(context, RestParams(min_len=min_len, max_len=5, max_matches=max_matches, depth=depth,
                                             budget=budget))
    want = rest_retrieve(stream, 4, context, min_len, 5, max_matches, depth, budget)
    if want is None or not want[3]:
        assert got is None
        return
    k, occurrences, used, paths = want
    longest = index.longest_match(context, min_len, 5)
    assert got is not None and longest is not None
    found_len, lo, hi = longest
    assert (found_len, hi - lo, got.tree.root_count) == (k, occurrences, used)
    assert got.ngram == tuple(context[len(context) - k:])
    assert tree_paths(got.tree) == paths


def test_find_is_the_occurrence_range():
    stream = _stream([[1, 2, 1, 2, 3], [2, 1, 2], [3, 3, 3]])
    index = SuffixIndex.build(stream, vocab_size=4)
    for pattern in ([1, 2], [2], [3, 3], [1, 2, 3], [0], [2, 3, 3]):
        lo, hi = index.find(pattern)
        starts = sorted(int(p) for p in index.suffix_array[lo:hi])
        brute = [i for i in range(len(stream) - len(pattern) + 1)
                 if stream[i:i + len(pattern)].tolist() == pattern]
        assert starts == brute, pattern


def test_size_is_counted_as_rest_counts_it(tmp_path):
    stream = _stream([[5, 6, 7, 8], [9, 10]])
    small = SuffixIndex.build(stream, vocab_size=49_152)  # ids fit 16 bits: 2 B per token + 4 B per suffix
    assert small.tokens.dtype == np.uint16 and small.suffix_array.dtype == np.int32
    assert small.nbytes == 6 * len(stream)
    wide = SuffixIndex.build(stream, vocab_size=100_000)  # 32-bit ids
    assert wide.nbytes == 8 * len(stream)
    small.save(tmp_path / "idx")
    loaded = SuffixIndex.load(tmp_path / "idx")
    assert loaded.nbytes == small.nbytes
    data = sum(np.load(tmp_path / "idx" / f, mmap_mode="r").nbytes for f in ("tokens.npy", "suffix_array.npy"))
    assert data == small.nbytes
    with pytest.raises(ValueError, match="vocab_size"):
        SuffixIndex.build(stream, vocab_size=8)
    with pytest.raises(FileNotFoundError, match="python -m benchmarks.rest_index"):
        SuffixIndex.load(tmp_path / "missing")


def test_prefix_end_cuts_after_a_document():
    stream = _stream([[1] * 10, [2] * 10, [3] * 10])
    assert prefix_end(stream, 1.0) == len(stream)
    end = prefix_end(stream, 0.4)
    assert stream[end - 1] == SEPARATOR and end >= 0.4 * len(stream)
    assert prefix_end(stream, 0.01) == 11
    with pytest.raises(ValueError, match="fraction"):
        prefix_end(stream, 0.0)


def test_rest_drafter_on_the_real_corpus(real_stream, tokenizer):
    """On real tokens, a context taken from the corpus retrieves a tree holding the true next token,
    and replaying a corpus document as the 'reference' accepts more than one token per step."""
    index = SuffixIndex.build(real_stream, vocab_size=len(tokenizer))
    seps = np.flatnonzero(real_stream == SEPARATOR)
    doc = real_stream[seps[3] + 1:seps[4]].tolist()
    match = index.lookup(doc[:40])
    assert match is not None and len(match.ngram) >= 2 and match.ngram == tuple(doc[40 - len(match.ngram):40])
    assert doc[40] in match.tree.token_ids.tolist()[:64]
    rest = RetrievalDrafter(DatastoreSource(lambda: index), name="rest", vocab_size=len(tokenizer))
    res = replay(rest, doc[:40], doc[40:120])
    assert res.accept_length > 1.5  # the document itself is in the index


@settings(max_examples=80, deadline=None)
@given(docs=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=20), min_size=1, max_size=5),
       query=st.lists(st.integers(0, 4), min_size=0, max_size=12))
def test_longest_run_matches_brute_force(docs, query):
    from research.study.overlap import longest_run

    index = SuffixIndex.build(_stream(docs), vocab_size=5)
    brute = max((j - i for i in range(len(query)) for j in range(i + 1, len(query) + 1)
                 if any(query[i:j] == d[k:k + j - i] for d in docs for k in range(len(d)))), default=0)
    assert longest_run(index, query) == brute


def test_rest_index_cli_indexes_the_same_token_stream(tmp_path, sharegpt_sample, real_stream, tokenizer):
    from benchmarks.rest_index import SuffixIndex
    from ingest.continuations import SEPARATOR

    out = tmp_path / "rest"
    proc = run_module("benchmarks.rest_index", "--path", str(sharegpt_sample), "--limit", "40", "--out", str(out),
                      "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    index = SuffixIndex.load(out)
    expected = real_stream.astype(np.int64)  # the same 40 conversations, tokenized as a build tokenizes them
    expected[real_stream == SEPARATOR] = len(tokenizer)  # REST's separator is the vocabulary size
    assert np.array_equal(np.asarray(index.tokens, dtype=np.int64), expected)
    assert f"{index.nbytes:,} bytes" in proc.stdout and index.nbytes == 6 * len(real_stream)
    assert not list(tmp_path.glob(".rest-*"))  # staged beside the output, renamed into place, nothing left over
    missing = run_module("benchmarks.rest_index", "--path", str(tmp_path / "nowhere.json"), "--out", str(out))
    assert missing.returncode == 2 and "nowhere.json: no such file or directory" in missing.stderr
    assert SuffixIndex.load(out).num_tokens == len(real_stream)  # a failed run leaves the previous index
