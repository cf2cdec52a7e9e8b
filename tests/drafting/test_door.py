"""The drafting API's door (:mod:`drafting.door`) called directly: what it accepts comes back unchanged in meaning,
and what it refuses names the input and the fix. (Through a drafter: ``test_lifecycle.py``.)"""

from __future__ import annotations

import re

import numpy as np
import pytest

from crest_native import MAX_BUDGET
from datastore.errors import InvalidContext
from drafting import door


def test_request_ids_are_ints_and_strs():
    assert door.request_id(7) == 7 and door.request_id("r") == "r" and door.request_id(-(2**63)) == -(2**63)
    for bad in (None, 1.0, (1,), b"r", np.int64(3)):
        with pytest.raises(TypeError, match="key requests by an int or a str"):
            door.request_id(bad)


def test_budgets_and_scores_keep_their_values():
    assert door.budget(np.int32(5)) == 5 and type(door.budget(np.int32(5))) is int
    assert door.budget(MAX_BUDGET) == MAX_BUDGET and door.min_score(np.float32(0.25)) == 0.25
    ids, sizes = door.rows([("a", 3), (4, np.int64(0))])
    assert ids == ["a", 4] and sizes.dtype == np.int64 and sizes.tolist() == [3, 0]


def test_engine_rows_pass_through_and_index_as_int64():
    tokens = np.arange(12, dtype=np.int32).reshape(3, 4)[:, :3]  # not C-contiguous
    lengths = np.array([1, 3, 0], np.int32)
    out, lens, at = door.engine_rows(tokens, lengths, [np.int64(2), 0, 0])
    assert out.flags.c_contiguous and (out == tokens).all() and lens is lengths
    assert at.dtype == np.int64 and at.tolist() == [2, 0, 0]


ROWS = np.zeros((2, 4), np.int64)
LENGTHS = np.array([1, 2], np.int64)
BAD_ROWS = [  # (tokens, lengths, index, what the message names)
    (ROWS.astype(np.float32), LENGTHS, [0], "float32"),
    (ROWS[0], LENGTHS, [0], "1-D"),
    (ROWS, LENGTHS.astype(np.int32), [0], "pass a 1-D int64 array"),
    (ROWS, LENGTHS, [2], "outside the 2 given"),
    (ROWS, LENGTHS, [-1], "outside the 2 given"),
    (ROWS, LENGTHS, [True], "sequence of row numbers"),
    (ROWS, LENGTHS, [0.0], "sequence of row numbers"),
    (ROWS, np.array([5, 1], np.int64), [0], "lengths [5] of the rows in index are outside 0..4 (the rows' columns)"),
    (ROWS, np.array([-1, 1], np.int64), [0], "lengths [-1] of the rows in index are outside 0..4"),
]


@pytest.mark.parametrize("tokens,lengths,index,named", BAD_ROWS, ids=[n for *_, n in BAD_ROWS])
def test_engine_rows_refuse_what_no_engine_passes(tokens, lengths, index, named):
    with pytest.raises(InvalidContext, match=re.escape(named)):
        door.engine_rows(tokens, lengths, index)


def test_an_engine_steps_budgets():
    got = door.budgets(np.array([0, 3, MAX_BUDGET], np.int32), 3)
    assert got.dtype == np.int64 and got.tolist() == [0, 3, MAX_BUDGET]
    assert door.budgets([1, np.int64(2)], 2).tolist() == [1, 2] and door.budgets([], 0).tolist() == []
    for bad, error, named in [(np.array([1.0, 2.0]), TypeError, "pass 1-D integers"),
                              (np.zeros((1, 2), np.int64), TypeError, "2-D"),
                              ("12", TypeError, "is a str"), ([1, True], TypeError, r"budgets\[1\]"),
                              (np.array([1, 2]), ValueError, "2 budgets for 3 rows"),
                              (np.array([1, -1, 2]), ValueError, r"budgets\[1\] -1 is outside"),
                              (np.array([1, 2, MAX_BUDGET + 1]), ValueError, r"budgets\[2\]")]:
        with pytest.raises(error, match=named):
            door.budgets(bad, 3)


def test_a_step_cost_curve_is_a_cost_curve_for_chains():
    from drafting.draft import CostCurve

    curve = CostCurve(np.array([1.0, 2.0]), np.array([0.02, 0.03]), 0.01)
    assert door.curve(curve, True) is curve and door.curve(None, False) is None
    with pytest.raises(TypeError, match="CostCurve"):
        door.curve((curve.tokens, curve.seconds, curve.tail), True)
    with pytest.raises(ValueError, match="chain=True"):
        door.curve(curve, False)
