"""The lifecycle every drafter shares (:class:`drafting.TokenDrafter`, the base of a drafter written in Python) and
its door (:mod:`drafting.door`): every bad input refused at the door, naming it and the fix, nothing coerced; request
ids, budgets and token lists checked as the merged drafter checks them; each request's tokens held and handed to the
drafter's ``draft``."""

from __future__ import annotations

import re
from typing import Any, cast

import numpy as np
import pytest

from datastore.errors import InvalidContext
from drafting import Draft, ScoreKind, TokenDrafter

VOCAB = 100


class Repeat(TokenDrafter):
    """Drafts the request's first tokens again (a chain), and remembers what it saw."""

    name = "repeat"

    def __init__(self) -> None:
        super().__init__(vocab_size=VOCAB)
        self.seen: list[tuple[str, list[int]]] = []

    def started(self, prompt):
        self.seen.append(("start", prompt.tolist()))
        return len(prompt)

    def extended(self, state, tokens):
        self.seen.append(("extend", tokens.tolist()))

    def stopped(self, state, tokens):
        self.seen.append(("stop", tokens))

    def draft(self, state, tokens, budget, chain):
        return Draft.chain(tokens[:budget])


def _started() -> Repeat:
    drafter = Repeat()
    drafter.start_request("a", [1, 2, 3, 1, 2])
    return drafter


BAD = [  # (what a caller does, the error, what its message names)
    (lambda d: d.start_request("b", np.array([1.5, 2.5])), InvalidContext, "float64"),
    (lambda d: d.start_request("b", cast(Any, "hello")), InvalidContext, "str"),
    (lambda d: d.start_request("b", [1, True]), InvalidContext, "True"),
    (lambda d: d.start_request("b", [1, VOCAB]), InvalidContext, f"vocabulary [0, {VOCAB})"),
    (lambda d: d.start_request(cast(Any, 2.5), [1]), TypeError, "req_id 2.5"),
    (lambda d: d.start_request(cast(Any, True), [1]), TypeError, "req_id True"),
    (lambda d: d.start_request(2**63, [1]), ValueError, "64-bit"),
    (lambda d: d.start_request("a", [1]), ValueError, "already active"),
    (lambda d: d.step(["a"], [1], tokens=[[-1]]), InvalidContext, "tokens[0] holds token id -1"),
    (lambda d: d.step(["a"], [1], tokens=[[5, 6.0]]), InvalidContext, "tokens[0] holds 6.0"),
    (lambda d: d.step(["zz"], [2]), KeyError, "'zz' is not active"),
    (lambda d: d.step("a", [2]), TypeError, "requests is a str"),
    (lambda d: d.step(["a"], [2.5]), TypeError, "budgets[0] 2.5"),
    (lambda d: d.step(["a"], ["3"]), TypeError, "budgets[0] '3'"),
    (lambda d: d.step(["a"], [True]), TypeError, "budgets[0] True"),
    (lambda d: d.step(["a"], [float("nan")]), TypeError, "budgets[0] nan"),
    (lambda d: d.step(["a"], [2, 3]), ValueError, "2 budgets for 1 requests"),
    (lambda d: d.step(["a"], [2], chain=cast(Any, 1)), TypeError, "chain=1"),
    (lambda d: d.step(["a"], [2], min_score=0.5), ValueError, "scores are none"),
]


@pytest.mark.parametrize("call,error,named", BAD, ids=[f"{e.__name__}: {n}" for _, e, n in BAD])
def test_bad_input_is_refused_at_the_door(call, error, named):
    drafter = _started()
    with pytest.raises(error, match=re.escape(named)):
        call(drafter)
    assert drafter.tokens("a").tolist() == [1, 2, 3, 1, 2]  # nothing half-done, nothing appended
    assert drafter.step(["a"], [2]).drafts[0].token_ids.tolist() == [1, 2]  # and the drafter still drafts


def test_the_lifecycle_holds_each_request_s_tokens_and_tells_the_drafter():
    drafter = _started()
    made = drafter.step(["a"], [0, ], tokens=[[7, 8]])
    assert made.followed == [True] and len(made.drafts[0]) == 0  # a budget of 0 drafts nothing
    assert drafter.tokens("a").tolist() == [1, 2, 3, 1, 2, 7, 8]
    drafter.start_request("b", [9])
    drafts = drafter.step(["a", "b"], [3, 3], tokens=[[], [4]]).drafts
    assert [d.token_ids.tolist() for d in drafts] == [[1, 2, 3], [9, 4]] and drafts.score_kind is ScoreKind.NONE
    drafter.stop_request("a")
    drafter.stop_request("a")  # ignored
    assert drafter.seen == [("start", [1, 2, 3, 1, 2]), ("extend", [7, 8]), ("start", [9]), ("extend", [4]),
                            ("stop", [1, 2, 3, 1, 2, 7, 8])]
    assert drafter.config() == {"name": "repeat"}
    drafter.close()
    with pytest.raises(ValueError, match="vocab_size"):
        TokenDrafter.__init__(drafter, vocab_size=0)
