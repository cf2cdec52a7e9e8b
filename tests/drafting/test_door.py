"""The drafting API's door (:mod:`drafting.door`) called directly: what it accepts comes back unchanged in meaning,
and what it refuses names the input and the fix. (Through a drafter: ``test_lifecycle.py``, ``test_service.py``; an
engine's arrays are checked by the native step: ``test_service.py``.)"""

from __future__ import annotations

import numpy as np
import pytest

from crest_native import MAX_BUDGET
from drafting import door


def test_request_ids_are_ints_and_strs():
    assert door.request_id(7) == 7 and door.request_id("r") == "r" and door.request_id(-(2**63)) == -(2**63)
    for bad in (None, 1.0, (1,), b"r", np.int64(3)):
        with pytest.raises(TypeError, match="key requests by an int or a str"):
            door.request_id(bad)


def test_requests_budgets_and_scores_keep_their_values():
    assert door.request_ids(["a", 4]) == ["a", 4] and door.min_score(np.float32(0.25)) == 0.25
    assert door.engine_vocab(None) == door.ENGINE_ID_LIMIT and door.engine_vocab(7) == 7
    tokens, counts = door.token_lists([[1, 2], [], np.array([3])], 3, 10)
    assert tokens.dtype == np.uint32 and tokens.tolist() == [1, 2, 3] and counts.tolist() == [2, 0, 1]
    for bad in (True, 0, 2**32 + 1, 1.0):
        with pytest.raises((TypeError, ValueError), match="vocab_size"):
            door.engine_vocab(bad)


def test_an_engine_steps_budgets():
    got = door.budgets(np.array([0, 3, MAX_BUDGET], np.int32), 3)
    assert got.dtype == np.int64 and got.tolist() == [0, 3, MAX_BUDGET]
    assert door.budgets([1, np.int64(2)], 2).tolist() == [1, 2] and door.budgets([], 0).tolist() == []
    assert door.budgets(np.array([1, -1, MAX_BUDGET + 1]), 3).tolist() == [1, -1, MAX_BUDGET + 1]  # the core's check
    for bad, error, named in [(np.array([1.0, 2.0]), TypeError, "pass 1-D integers"),
                              (np.zeros((1, 2), np.int64), TypeError, "2-D"),
                              ("12", TypeError, "is a str"), ([1, True], TypeError, r"budgets\[1\]"),
                              (np.array([1, 2]), ValueError, "2 budgets for 3 requests")]:
        with pytest.raises(error, match=named):
            door.budgets(bad, 3)


def test_a_step_cost_curve_is_a_cost_curve():
    from drafting.draft import CostCurve

    curve = CostCurve(np.array([1.0, 2.0]), np.array([0.02, 0.03]), 0.01)
    assert curve.tokens.tolist() == [1.0, 2.0] and curve.tail == 0.01 and curve.draft_s == 0.0
    with pytest.raises(TypeError, match="CostCurve"):
        door.curve((curve.tokens, curve.seconds, curve.tail))
    assert door.curve(curve) is curve and door.curve(None) is None
    for args, named in (((np.array([2.0, 1.0]), np.ones(2), 0.0), "increase"),
                        ((np.ones(1), -np.ones(1), 0.0), "seconds be finite and >= 0"),
                        ((np.array([np.nan]), np.ones(1), 0.0), "tokens must be finite"),
                        ((np.ones(1), np.array([np.inf]), 0.0), "seconds be finite"),
                        ((np.ones(1), np.ones(2), 0.0), "as many seconds as tokens"),
                        ((np.ones(1), np.ones(1), float("inf")), "finite")):
        with pytest.raises(ValueError, match=named):
            CostCurve(*args)
