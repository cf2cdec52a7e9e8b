"""The oracle of the native core's merge, features, scores and cuts (``tests/oracle/calibration.py``): known answers
on small trees, brute force on random ones (the exact union, the product of conditionals, the accept rule), the
back-off's choice and the cost cut. The native core drafts what this oracle drafts
(``tests/drafting/test_native.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from crest_native import SOURCES
from datastore.tree import Match, TokenTree
from drafting.accept import accepted_mask, reference_predictions
from drafting.calibration import FEATURES, Calibration, TokenBias
from oracle.calibration import COLUMN, conditional, draft_from_candidates, node_table, scores
from support import tree_from_paths

F = COLUMN


def _paths(table) -> list[tuple]:
    out: list[tuple] = []
    for t, p in zip(table.tokens.tolist(), table.parents.tolist()):
        out.append((out[p] if p >= 0 else ()) + (t,))
    return out


def test_node_table_known_answer():
    ds = Match((1, 2, 3), tree_from_paths({(5,): 10, (6,): 3, (5, 7): 8}, root=14))
    local = Match((3,), tree_from_paths({(5,): 2, (5, 9): 1, (8,): 1}, root=3))
    t = node_table({"ds": ds, "local": local}, prior=1.0)
    assert t is not None
    assert _paths(t) == [(5,), (6,), (5, 7), (5, 9), (8,)]
    assert t.depths.tolist() == [1, 1, 2, 2, 1]
    x = t.features
    assert x[0, F["ds_ratio"]] == pytest.approx(10 / 15) and x[0, F["local_ratio"]] == pytest.approx(2 / 4)
    assert x[2, F["ds_ratio"]] == pytest.approx(8 / 11) and x[2, F["ds_log_parent"]] == pytest.approx(np.log1p(10))
    assert x[:, F["ds_on"]].tolist() == [1, 1, 1, 0, 0] and x[:, F["local_on"]].tolist() == [1, 0, 0, 1, 1]
    assert np.allclose(x[:, F["ds_log_n"]], np.log1p([3, 3, 3, 0, 0]) * [1, 1, 1, 0, 0])
    assert np.allclose(x[:, F["local_log_n"]], np.log1p([1, 0, 0, 1, 1]))
    # a source "misses" a node when it predicted other children of that node's parent
    assert x[:, F["ds_miss"]].tolist() == [0, 0, 0, 1, 1]
    assert x[:, F["local_miss"]].tolist() == [0, 1, 1, 0, 0]
    assert x[:, F["agree"]].tolist() == [1, 0, 0, 0, 0]
    assert x[:, F["live_on"]].sum() == 0 and x[:, F["outputs_on"]].sum() == 0
    assert np.allclose(x[:, F["log_depth"]], np.log([1, 1, 2, 2, 1]))
    assert node_table({"ds": None, "local": None}) is None and node_table({}) is None
    with pytest.raises(ValueError, match="unknown sources"):
        node_table({"corpus": ds})


def test_every_source_block_and_four_way_agreement():
    ds = Match((4,), tree_from_paths({(5,): 4}, root=4))
    live = Match((3, 4), tree_from_paths({(5,): 2, (5, 6): 2}, root=2))
    local = Match((4,), tree_from_paths({(5,): 1}, root=1))
    outputs = Match((2, 3, 4), tree_from_paths({(5,): 3, (5, 6): 1, (7,): 1}, root=4))
    t = node_table({"ds": ds, "live": live, "local": local, "outputs": outputs})
    assert t is not None
    assert _paths(t) == [(5,), (5, 6), (7,)]
    x = t.features
    assert x[0, F["agree"]] == 3 and x[1, F["agree"]] == 1 and x[2, F["agree"]] == 0
    assert x[0, F["live_log_n"]] == pytest.approx(np.log1p(2))
    assert x[0, F["outputs_log_n"]] == pytest.approx(np.log1p(3))
    assert x[1, F["live_on"]] == 1 and x[1, F["ds_on"]] == 0 and x[1, F["outputs_ratio"]] == pytest.approx(1 / 4)
    assert x[2, F["ds_miss"]] == 1 and x[2, F["outputs_miss"]] == 0


def _randomtree_from_paths(rng, vocab=6, nodes=12) -> TokenTree:
    paths: dict[tuple, int] = {}
    frontier = [()]
    while len(paths) < nodes:
        base = frontier[rng.integers(len(frontier))]
        path = base + (int(rng.integers(vocab)),)
        if path in paths or len(path) > 5:
            continue
        paths[path] = 0
        frontier.append(path)
    counts = {p: 0 for p in paths}
    for p in paths:  # each node counts one occurrence of each path through it
        for k in range(1, len(p) + 1):
            counts[p[:k]] += 1
    return tree_from_paths(counts, root=max(counts.values()) + 1)


def test_scores_and_acceptance_against_oracles():
    rng = np.random.default_rng(0)
    cal = Calibration(rng.normal(size=len(FEATURES)), -0.5, sources=SOURCES,
                      token_bias=TokenBias(np.array([1, 3]), np.array([0.8, -1.2]), "t"))
    for _ in range(50):
        a, b = _randomtree_from_paths(rng), _randomtree_from_paths(rng)
        t = node_table({"ds": Match((1, 2), a), "local": Match((2,), b)})
        assert t is not None
        paths = _paths(t)
        assert len(set(paths)) == len(paths) == len(set(a.paths()) | set(b.paths()))  # the exact union
        q, p = conditional(cal, t.features, t.tokens), scores(cal, t)
        for i, path in enumerate(paths):  # P(node) = product of conditionals along its path
            expect = np.prod([q[paths.index(path[:k])] for k in range(1, len(path) + 1)])
            assert p[i] == pytest.approx(expect)
        ref = rng.integers(6, size=8)
        pos = int(rng.integers(0, 4))
        ok = accepted_mask(t.tokens, t.parents, t.depths, reference_predictions(t.depths, ref, pos))
        assert ok.tolist() == [tuple(ref[pos:pos + len(path)].tolist()) == path for path in paths]


def test_back_off_chooses_the_largest_expected_accepted_length():
    rng = np.random.default_rng(1)
    cal = Calibration(rng.normal(size=len(FEATURES)), 0.0, sources=SOURCES)
    for _ in range(30):
        cands = [Match(tuple(range(n)), _randomtree_from_paths(rng)) for n in (3, 2, 1)]
        local = Match((9,), _randomtree_from_paths(rng))
        for budget, chain in ((3, False), (8, False), (3, True), (64, True)):
            draft, chosen = draft_from_candidates(cal, cands, {"local": local}, budget, chain=chain)
            gains = [draft_from_candidates(cal, [c], {"local": local}, budget, chain=chain)[0].scores.sum()
                     for c in cands]
            assert chosen == int(np.argmax(gains)) and draft.scores.sum() == pytest.approx(max(gains))
            assert len(draft) <= budget
            if chain:
                assert draft.parents.tolist() == list(range(-1, len(draft) - 1))
            else:  # prefix-closed, best first
                assert all(p < i for i, p in enumerate(draft.parents.tolist()))
                assert np.all(np.diff(draft.scores) <= 1e-12)
    empty, chosen = draft_from_candidates(cal, [], {}, 8)
    assert len(empty) == 0 and chosen == -1
    with pytest.raises(ValueError, match="budget"):
        draft_from_candidates(cal, [], {}, -1)


def test_budget_stops_where_the_expected_gain_falls_below_the_node_cost():
    rng = np.random.default_rng(2)
    cal = Calibration(rng.normal(size=len(FEATURES)), 1.0, sources=SOURCES)
    local = Match((9,), _randomtree_from_paths(rng, nodes=20))
    full, _ = draft_from_candidates(cal, [], {"local": local}, 20)
    cost = float(np.median(full.scores))
    cut, _ = draft_from_candidates(cal, [], {"local": local}, 20, min_score=cost)
    assert len(cut) == int((full.scores >= cost).sum()) and np.all(cut.scores >= cost)
