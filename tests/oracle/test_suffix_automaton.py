"""The oracles of the native core's stages 1 and 2 (``tests/oracle``: the suffix automaton, a request's automaton,
the process-wide output index) against brute-force scans of the sequences (hypothesis), plus known answers. The native
core drafts what these oracles draft (``tests/drafting/test_native.py``)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.local import RequestAutomaton
from oracle.output_index import CONTEXT_TOKENS, OutputIndex
from oracle.suffix_automaton import SuffixAutomaton


def occurrences(seqs: list[list[int]], pattern: tuple[int, ...]) -> int:
    """How many times ``pattern`` occurs in the sequences (never across two of them)."""
    n = len(pattern)
    return sum(tuple(s[i:i + n]) == pattern for s in seqs for i in range(len(s) - n + 1))


def brute_continuations(seqs: list[list[int]], context: tuple[int, ...], max_depth: int) -> Counter:
    """Every continuation path (up to ``max_depth`` tokens) of every occurrence of ``context``, counted."""
    out: Counter = Counter()
    n = len(context)
    for s in seqs:
        for i in range(len(s) - n + 1):
            if tuple(s[i:i + n]) == context:
                cont = s[i + n:i + n + max_depth]
                for d in range(1, len(cont) + 1):
                    out[tuple(cont[:d])] += 1
    return out


def brute_best_first(below: Counter, budget: int) -> list[tuple[int, ...]]:
    """The best-first order the automaton promises: count descending, ties by the earlier parent, then the
    smaller token, taking a node only after its parent."""
    taken: list[tuple[int, ...]] = []
    index = {(): -1}
    while len(taken) < budget:
        ready = [p for p in below if p not in index and p[:-1] in index]
        if not ready:
            break
        best = min(ready, key=lambda p: (-below[p], index[p[:-1]], p[-1]))
        index[best] = len(taken)
        taken.append(best)
    return taken


def paths(tree) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = []
    for tok, par in zip(tree.token_ids.tolist(), tree.parents.tolist()):
        out.append((out[par] if par >= 0 else ()) + (tok,))
    return out


seqs = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=40), min_size=1, max_size=4)


@settings(max_examples=200, deadline=None)
@given(seqs, st.lists(st.integers(0, 3), min_size=1, max_size=12), st.integers(1, 30), st.integers(1, 6))
def test_automaton_matches_and_counts_like_a_scan(sequences, context, budget, max_depth):
    sam = SuffixAutomaton()
    for s in sequences:
        sam.start_sequence()
        sam.extend(s[:len(s) // 2])  # in two pieces: appending continues the same sequence
        sam.extend(s[len(s) // 2:])
    assert sam.num_states <= 2 * sum(map(len, sequences)) + 1
    state, length = sam.match(context)
    want = max((n for n in range(len(context) + 1) if n == 0 or occurrences(sequences, tuple(context[-n:]))), default=0)
    assert length == want
    if length == 0:
        return
    ctx = tuple(context[-length:])
    assert sam.count(state) == occurrences(sequences, ctx)
    tree = sam.continuations(state, budget, max_depth)
    below = brute_continuations(sequences, ctx, max_depth)
    assert paths(tree) == brute_best_first(below, budget)
    assert tree.counts.tolist() == [below[p] for p in paths(tree)]
    assert tree.root_count == occurrences(sequences, ctx)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=60), st.integers(1, 30))
def test_request_automaton_matches_its_longest_repeated_suffix(seq, budget):
    index = RequestAutomaton(max_depth=8)
    index.extend(seq[:5])
    index.extend(seq[5:])
    match = index.match(budget)
    longest = max((n for n in range(1, len(seq)) if occurrences([seq[:-1]], tuple(seq[-n:]))), default=0)
    below = brute_continuations([seq], tuple(seq[-longest:]), 8) if longest else Counter()
    if not below:
        assert match is None
        return
    assert match is not None and match.ngram == tuple(seq[-longest:])
    assert paths(match.tree) == brute_best_first(below, budget)
    assert match.tree.root_count == occurrences([seq], match.ngram) - 1  # the final occurrence is no evidence


def test_known_answer():
    index = RequestAutomaton(max_depth=16)
    index.extend([1, 2, 3, 4, 1, 2, 3, 5, 1, 2])
    m = index.match(10)
    assert m is not None and m.ngram == (1, 2) and m.tree.root_count == 2
    assert paths(m.tree)[:3] == [(3,), (3, 4), (3, 5)] and m.tree.counts.tolist()[:3] == [2, 1, 1]
    with pytest.raises(ValueError, match="budget"):
        index.match(0)


def test_output_index_drafts_from_earlier_outputs_only():
    idx = OutputIndex()
    assert idx.match([1, 2, 3], 8) is None
    idx.add([7, 8, 9, 1, 2, 3, 6])
    idx.add([1, 2, 3, 6, 6])
    m = idx.match([5, 1, 2], 8)
    assert m is not None and m.ngram == (1, 2) and paths(m.tree) == [(3,), (3, 6), (3, 6, 6)]
    assert m.tree.counts.tolist() == [2, 2, 1] and m.tree.root_count == 2
    # no context spans two outputs: 3 6 | 1 2 was never said
    spanning = idx.match([6, 1, 2, 3, 6], 8)
    assert spanning is not None and spanning.ngram == (1, 2, 3, 6)
    tail = idx.match(list(range(100, 100 + 2 * CONTEXT_TOKENS)) + [9], 4)
    assert tail is not None and tail.ngram == (9,)


def test_output_index_stays_within_its_bound_and_keeps_the_newest():
    idx = OutputIndex(max_bytes=4096)
    for i in range(200):
        idx.add([i % 50, 1000 + i, 2000 + i, 3000 + i])
        assert idx.nbytes <= 4096
    assert idx.evictions > 0 and idx.evicted > 0 and idx.num_outputs < 200
    newest = idx.match([1000 + 199, 2000 + 199], 4)
    assert newest is not None and paths(newest.tree) == [(3000 + 199,)]
    assert idx.match([1000, 2000], 4) is None  # the oldest is gone
    OutputIndex(max_bytes=0).add([1, 2, 3])
    with pytest.raises(ValueError, match="max_bytes"):
        OutputIndex(max_bytes=-1)
