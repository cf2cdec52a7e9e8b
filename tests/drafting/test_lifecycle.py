"""The one lifecycle of the papers' drafters (:class:`drafting.lifecycle.RequestDrafter`): every bad input refused at
the door, naming it and the fix, nothing coerced; request ids and budgets checked as every drafter checks them."""

from __future__ import annotations

import re
from typing import Any, cast

import numpy as np
import pytest

from datastore.errors import InvalidContext
from drafting.drafters import PromptLookupDrafter, TrieDrafter
from drafting.lifecycle import MAX_BUDGET, check_request_id


def _started() -> TrieDrafter:
    drafter = TrieDrafter()
    drafter.start_request("a", [1, 2, 3, 1, 2])
    return drafter


BAD = [  # (what a caller does, the error, what its message names)
    (lambda d: d.start_request("b", np.array([1.5, 2.5])), InvalidContext, "float64"),
    (lambda d: d.start_request("b", cast(Any, "hello")), InvalidContext, "str"),
    (lambda d: d.start_request("b", [1, True]), InvalidContext, "True"),
    (lambda d: d.start_request(cast(Any, 2.5), [1]), TypeError, "req_id 2.5"),
    (lambda d: d.start_request(cast(Any, True), [1]), TypeError, "req_id True"),
    (lambda d: d.start_request(2**63, [1]), ValueError, "64-bit"),
    (lambda d: d.start_request("a", [1]), ValueError, "already active"),
    (lambda d: d.add_tokens("a", [-1]), InvalidContext, "-1"),
    (lambda d: d.add_tokens("zz", [1]), KeyError, "'zz' is not active"),
    (lambda d: d.propose([("zz", [1], 2)]), KeyError, "'zz' is not active"),
    (lambda d: d.propose([("a", 2)]), TypeError, "batch[0]"),
    (lambda d: d.propose(cast(Any, ("a", [1], 2))), TypeError, "batch[0]"),
    (lambda d: d.propose([("a", [1], 2.5)]), TypeError, "batch[0] budget 2.5"),
    (lambda d: d.propose([("a", [1], "3")]), TypeError, "batch[0] budget '3'"),
    (lambda d: d.propose([("a", [1], True)]), TypeError, "batch[0] budget True"),
    (lambda d: d.propose([("a", [1], -1)]), ValueError, f"outside 0..{MAX_BUDGET}"),
    (lambda d: d.propose([("a", [1], 2**63)]), ValueError, f"outside 0..{MAX_BUDGET}"),
    (lambda d: d.propose([("a", [1], float("nan"))]), TypeError, "batch[0] budget nan"),
    (lambda d: d.propose([("a", [1], 2)], min_score=0.5), ValueError, "count_ratio"),
    (lambda d: d.propose([("a", [1], 2)], min_score=float("nan")), ValueError, "min_score=nan"),
]


@pytest.mark.parametrize("call,error,named", BAD, ids=[f"{e.__name__}: {n}" for _, e, n in BAD])
def test_bad_input_is_refused_at_the_door(call, error, named):
    drafter = _started()
    with pytest.raises(error, match=re.escape(named)):
        call(drafter)
    assert drafter.active_requests == {"a"}  # nothing half-done
    assert len(drafter.propose([("a", [1, 2, 3, 1, 2], 2)])[0]) <= 2  # and the drafter still drafts


def test_request_ids_are_ints_and_strs():
    assert check_request_id(7) == 7 and check_request_id("r") == "r" and check_request_id(-(2**63)) == -(2**63)
    for bad in (None, 1.0, (1,), b"r", np.int64(3)):
        with pytest.raises(TypeError, match="key requests by an int or a str"):
            check_request_id(bad)


def test_prompt_lookup_reads_the_whole_context_it_is_given():
    drafter = PromptLookupDrafter(max_ngram=2, max_tokens=3)
    drafter.start_request(1, [9])
    seq = [5, 6, 7, 8, 1, 5, 6]
    assert drafter.propose([(1, seq, 3)])[0].token_ids.tolist() == [7, 8, 1]
    with pytest.raises(InvalidContext, match="batch\\[0\\] context"):
        drafter.propose([(1, cast(Any, [5, 6.0, 7, 5, 6]), 3)])  # an early float is refused, not truncated
