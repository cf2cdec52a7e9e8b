"""The calibration fitted online on the engine's verdicts (``csrc/online.hpp``): against its Python oracle
(``tests/oracle/online.py``) on random streams, per datastore set, off by default, from a flat start, and what a set's
fit adopts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import crest_native
from datastore.tree import Match
from drafting.calibration import FEATURES, Calibration, TokenBias
from oracle.online import OnlineFit, outcomes
from support import given_trees, native_core, native_extend, native_step, random_tree, step_drafts


def tree(m: Match):
    return len(m.ngram), m.tree.token_ids, m.tree.parents, m.tree.counts, m.tree.root_count


def picked_nodes(union_tokens, union_parents, draft_tokens, draft_parents) -> list[int]:
    """The union indices of a draft's nodes (a node: the child of its parent's with its token)."""
    child = {(int(p), int(t)): m for m, (t, p) in enumerate(zip(union_tokens, union_parents))}
    at: list[int] = []
    for t, p in zip(draft_tokens, draft_parents):
        at.append(child[(at[p] if p >= 0 else -1, int(t))])
    return at


def offset_of(cal: Calibration, token: int) -> float:
    term = cal.token_bias
    if term is None:
        return 0.0
    hit = np.flatnonzero(term.tokens == token)
    return float(term.bias[hit[0]]) if len(hit) else 0.0


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.booleans(), st.sampled_from([1, 3]), st.sampled_from([0.5, 20.0]),
       st.sampled_from([5.0, 1000.0]))
def test_native_fit_equals_the_oracle(seed, chain, refit, strength, memory):
    """Each step's draft is judged by the tokens the target commits next: every node beside the path they take (the
    children of the root and of each node reached) is an outcome, in the union's order, and the set's fit equals the
    oracle's after every commit."""
    rng = np.random.default_rng(seed)
    vocab = 6
    biased = np.flatnonzero(rng.random(vocab) < 0.5)
    term = TokenBias(biased, rng.normal(scale=1.0, size=len(biased)), "random") if rng.random() < 0.6 else None
    cal = Calibration(rng.normal(scale=0.5, size=len(FEATURES)), float(rng.normal()), 1.0,
                      sources=crest_native.SOURCES, token_bias=term)
    core = native_core(calibration=cal, sources=("ds", "live", "local"), outputs_bytes=0, online_strength=strength,
                       online_memory=memory, online_refit=refit)
    oracle = OnlineFit(cal.coef, cal.intercept, strength, memory, refit)
    handle = core.start(rng.integers(0, vocab, size=12).astype(np.uint32))
    judged = 0
    for _ in range(12):
        stored = [Match(tuple(range(n)), random_tree(rng, vocab, int(rng.integers(1, 14))))
                  for n in range(int(rng.integers(1, 3)), 0, -1)]
        live = Match((1, 2), random_tree(rng, vocab, int(rng.integers(1, 8)))) if rng.random() < 0.5 else None
        trees = given_trees([[tree(m) for m in stored]], [tree(live) if live else None])
        made = native_step(core, [handle], [64], trees, chain=chain)
        tokens, parents, _ = step_drafts(made)[0]
        # the tables scored as the step scored (no verdict came between), each node's features
        tables = core.tables(handle, given_trees([[tree(m) for m in stored]], [tree(live) if live else None]))
        table = tables[max(int(made.chosen[0]), 0)]
        picked = picked_nodes(table.tokens, table.parents, tokens, parents)
        committed = rng.integers(0, vocab, size=int(rng.integers(1, 4))).tolist()
        if len(tokens) and rng.random() < 0.7:  # the target takes a path of the draft, then its own token
            path = [int(rng.integers(len(tokens)))]
            while parents[path[-1]] >= 0:
                path.append(int(parents[path[-1]]))
            committed = tokens[path[::-1]].tolist() + committed[:1]
        for m, accepted in outcomes(table.tokens.tolist(), table.parents.tolist(), picked, committed):
            oracle.add(table.features[m], offset_of(cal, int(table.tokens[m])), accepted)
            judged += 1
        native_extend(core, handle, committed)
        coef, intercept, seen = core.fit(0)
        assert seen == judged
        np.testing.assert_allclose(coef, oracle.coef, rtol=1e-7, atol=1e-9)
        assert intercept == pytest.approx(oracle.intercept, rel=1e-7, abs=1e-9)
    assert judged > 0


STORED = [(3, np.array([10, 11, 12, 13], np.uint32), np.array([-1, 0, 1, 2], np.int32),
           np.array([60, 40, 30, 20], np.uint32), 100)]
"""The datastore's one continuation, seen now and then: the shipped calibration drafts it, scored low."""


def _learn(core, handle, steps: int, accept: bool) -> None:
    for _ in range(steps):
        made = native_step(core, [handle], [4], given_trees([STORED]), chain=True)
        tokens = step_drafts(made)[0][0].tolist()
        native_extend(core, handle, [*tokens, 5] if accept else [99])


def test_verdicts_move_the_scores_of_their_set_only():
    """A set whose drafts the target keeps taking scores them higher; another set's scores are unchanged, and a new
    request of the first set starts from its fit."""
    core = native_core(sources=("ds",), outputs_bytes=0, online_strength=10.0, online_refit=8)
    first = core.start(np.array([1, 2, 3], np.uint32), 0)
    other = core.start(np.array([1, 2, 3], np.uint32), 1)
    before = step_drafts(native_step(core, [other], [4], given_trees([STORED]), chain=True))[0][2]
    _learn(core, first, 40, accept=True)
    assert core.fit(0)[2] == 40 * 4 and core.fit(1)[2] == 0
    after_other = step_drafts(native_step(core, [other], [4], given_trees([STORED]), chain=True))[0][2]
    assert after_other.tolist() == before.tolist()
    fresh = core.start(np.array([1, 2, 3], np.uint32), 0)
    learnt = step_drafts(native_step(core, [fresh], [4], given_trees([STORED]), chain=True))[0][2]
    assert np.all(learnt > before + 0.1)


def test_rejections_lower_the_scores_until_nothing_is_drafted():
    core = native_core(sources=("ds",), outputs_bytes=0, online_strength=10.0, online_refit=8)
    handle = core.start(np.array([1, 2, 3], np.uint32))
    cut = 0.2
    first = native_step(core, [handle], [4], given_trees([STORED]), chain=True, min_score=cut)
    assert len(first.tokens) > 0
    native_extend(core, handle, [99])
    _learn(core, handle, 60, accept=False)
    last = native_step(core, [handle], [4], given_trees([STORED]), chain=True, min_score=cut)
    assert len(last.tokens) == 0


def test_at_strength_0_the_calibration_stays_as_given():
    cal = Calibration.load()
    core = native_core(sources=("ds",), outputs_bytes=0, online_strength=0.0)
    handle = core.start(np.array([1, 2, 3], np.uint32))
    _learn(core, handle, 20, accept=True)
    coef, intercept, seen = core.fit(0)
    assert seen == 0 and coef.tolist() == cal.coef.tolist() and intercept == cal.intercept
    with pytest.raises(ValueError, match="online learning is off"):
        core.fold(0, False, None)


def test_a_flat_start_learns_what_the_target_takes():
    """A datastore with no calibration starts every node at a coin flip and learns: drafts the target takes score
    higher."""
    flat = Calibration.load().flat()
    core = native_core(calibration=flat, sources=("ds",), outputs_bytes=0, online_strength=1.0, online_refit=4)
    handle = core.start(np.array([1, 2, 3], np.uint32))
    start = step_drafts(native_step(core, [handle], [4], given_trees([STORED]), chain=True))[0][2]
    assert np.allclose(start, np.cumprod([0.5] * len(start)))
    _learn(core, handle, 30, accept=True)
    assert core.fit(0)[0].any()
    learnt = step_drafts(native_step(core, [handle], [4], given_trees([STORED]), chain=True))[0][2]
    assert np.all(learnt > start)


def _fleet_core(share: int = 1 << 20):
    return native_core(sources=("ds",), outputs_bytes=0, online_strength=10.0, online_refit=8, online_share=share)


def test_the_fleet_learns_every_process_s_outcomes_in_the_order_they_are_folded():
    """Two processes fold into one learner: the second goes on from the first's fit (its first draft scores with the
    first's outcomes), and the fleet's state after both equals one process that learnt the same outcomes in that
    order."""
    first, second, alone = _fleet_core(), _fleet_core(), _fleet_core()
    a, b, c = (x.start(np.array([1, 2, 3], np.uint32)) for x in (first, second, alone))
    _learn(first, a, 25, accept=True)
    _learn(alone, c, 25, accept=True)
    fleet = first.fold(0, False, None)
    assert first.fit(0)[0].tolist() == alone.fit(0)[0].tolist()  # a fold of its own outcomes changes nothing
    second.fold(0, False, fleet)  # a new process starts from the fleet's fit
    assert second.fit(0)[0].tolist() == first.fit(0)[0].tolist() and second.fit(0)[2] == 25 * 4
    _learn(second, b, 30, accept=False)
    _learn(alone, c, 30, accept=False)
    fleet = second.fold(0, False, fleet)
    coef, intercept, seen = second.fit(0)
    want = alone.fit(0)
    assert seen == want[2] == 25 * 4 + 30  # a rejection ends its step's outcomes at the root
    np.testing.assert_allclose(coef, want[0], rtol=1e-9, atol=1e-12)
    assert intercept == pytest.approx(want[1], rel=1e-9)
    first.fold(0, False, fleet)  # the first reads the second's outcomes back
    assert first.fit(0)[0].tolist() == coef.tolist()


def test_a_fold_keeps_at_most_share_outcomes_and_refuses_a_foreign_state():
    core = _fleet_core(share=10)
    handle = core.start(np.array([1, 2, 3], np.uint32))
    _learn(core, handle, 5, accept=True)  # 20 outcomes: 10 kept for the fold
    assert core.unshared(0) == 10
    state = core.fold(0, False, None)
    assert core.fit(0)[2] == 10
    with pytest.raises(ValueError, match="not a state of a fit of 26 weights"):
        core.fold(0, False, state[:-8])
    with pytest.raises(ValueError, match="NaN or inf"):
        core.fold(0, False, state[:-8] + np.array([np.nan]).tobytes())
    wider = state[:8] + np.array([30], np.int64).tobytes() + state[16:]  # the width in its header: another's fit
    with pytest.raises(ValueError, match="another calibration's"):
        core.fold(0, False, wider)


def test_a_set_forgotten_starts_again_from_the_prior():
    cal = Calibration.load()
    core = _fleet_core()
    handle = core.start(np.array([1, 2, 3], np.uint32))
    _learn(core, handle, 20, accept=True)
    assert core.fit(0)[2] > 0
    core.forget(0)
    coef, intercept, seen = core.fit(0)
    assert seen == 0 and coef.tolist() == cal.coef.tolist() and intercept == cal.intercept


@pytest.mark.parametrize("bad", [{"online_strength": -1.0}, {"online_strength": float("nan")},
                                 {"online_memory": 0.5}, {"online_memory": float("inf")}, {"online_refit": 0}])
def test_bad_online_settings_are_refused_by_name(bad):
    with pytest.raises(ValueError, match="online_strength must be finite"):
        native_core(sources=("ds",), **bad)
