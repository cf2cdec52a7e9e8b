"""The budget choice (``research.hf_bench.budget.choose_budget``): tokens a second of each candidate budget from its
replayed accept length, the verification pass it costs and the drafter's own seconds a step; known answers."""

from __future__ import annotations

import numpy as np
import pytest

from research.hf_bench.budget import LatencyCurve, choose_budget

# a pass over q query tokens: 40 ms + 5 ms for each token past the first
CURVE = LatencyCurve(0.040 + 0.005 * np.arange(9, dtype=np.float64), context_len=256, key="known-answer")
ACCEPT = {1: 1.6, 4: 2.0, 8: 2.5}


def test_a_free_drafter_takes_the_budget_with_the_most_tokens_a_second():
    best, rate = choose_budget(CURVE, ACCEPT)
    assert rate == pytest.approx({1: 1.6 / 0.045, 4: 2.0 / 0.060, 8: 2.5 / 0.080})
    assert best == 1
    assert choose_budget(CURVE, ACCEPT, dict.fromkeys(ACCEPT, 0.0)) == (best, rate)


def test_a_drafter_that_costs_time_a_step_is_given_a_larger_budget():
    """40 ms a step (the S4C heads' pass on a 2-core CPU is about that) amortizes over more accepted tokens."""
    best, rate = choose_budget(CURVE, ACCEPT, dict.fromkeys(ACCEPT, 0.040))
    assert rate == pytest.approx({1: 1.6 / 0.085, 4: 2.0 / 0.100, 8: 2.5 / 0.120})
    assert best == 8


@pytest.mark.parametrize(("accept", "draft_s", "message"), [
    ({}, None, "accept_lengths is empty"),
    (ACCEPT, {1: 0.0, 4: 0.0}, r"no time for budgets \[8\]"),
    (ACCEPT, {1: 0.0, 4: -0.001, 8: 0.0}, "must be finite and >= 0"),
    (ACCEPT, {1: 0.0, 4: float("nan"), 8: 0.0}, "must be finite and >= 0"),
])
def test_refused(accept, draft_s, message):
    with pytest.raises(ValueError, match=message):
        choose_budget(CURVE, accept, draft_s)
