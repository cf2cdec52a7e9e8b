"""The one lifecycle every drafter shares (:class:`drafting.DraftingService` over a method) and its door
(:mod:`drafting.door`): every bad input refused at the door, naming it and the fix, nothing coerced; request ids and
budgets checked as every drafter checks them; the papers' drafters as methods, reading the tokens the service holds."""

from __future__ import annotations

import re
from typing import Any, cast

import numpy as np
import pytest

from crest_native import MAX_BUDGET
from datastore.errors import InvalidContext
from drafting import DraftingService
from drafting.drafters import NoDraft, PromptLookup, Trie

VOCAB = 100


def _started() -> DraftingService:
    drafter = DraftingService(Trie(), vocab_size=VOCAB)
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
    (lambda d: d.add_tokens("a", [-1]), InvalidContext, "-1"),
    (lambda d: d.add_tokens("zz", [1]), KeyError, "'zz' is not active"),
    (lambda d: d.propose([("zz", 2)]), KeyError, "'zz' is not active"),
    (lambda d: d.propose([("a", [1], 2)]), TypeError, "batch[0]"),
    (lambda d: d.propose(cast(Any, ("a", 2))), TypeError, "batch[0]"),
    (lambda d: d.propose([("a", 2.5)]), TypeError, "batch[0] budget 2.5"),
    (lambda d: d.propose([("a", "3")]), TypeError, "batch[0] budget '3'"),
    (lambda d: d.propose([("a", True)]), TypeError, "batch[0] budget True"),
    (lambda d: d.propose([("a", -1)]), ValueError, f"outside 0..{MAX_BUDGET}"),
    (lambda d: d.propose([("a", MAX_BUDGET + 1)]), ValueError, f"outside 0..{MAX_BUDGET}"),
    (lambda d: d.propose([("a", float("nan"))]), TypeError, "batch[0] budget nan"),
    (lambda d: d.propose([("a", 2)], min_score=0.5), ValueError, "count_ratio"),
    (lambda d: d.propose([("a", 2)], min_score=float("nan")), ValueError, "min_score=nan"),
    (lambda d: d.add_hidden_states("a", np.zeros((1, 4))), TypeError, "reads no hidden states"),
]


@pytest.mark.parametrize("call,error,named", BAD, ids=[f"{e.__name__}: {n}" for _, e, n in BAD])
def test_bad_input_is_refused_at_the_door(call, error, named):
    drafter = _started()
    with pytest.raises(error, match=re.escape(named)):
        call(drafter)
    assert drafter.active_requests == {"a"}  # nothing half-done
    assert len(drafter.propose([("a", 2)])[0]) <= 2  # and the drafter still drafts


def test_prompt_lookup_reads_the_tokens_the_service_holds():
    drafter = DraftingService(PromptLookup(max_ngram=2, max_tokens=3), vocab_size=VOCAB)
    drafter.start_request(1, [5, 6, 7, 8, 1])
    assert len(drafter.propose([(1, 3)])[0]) == 0  # 8, 1 occurred nowhere before
    drafter.add_tokens(1, [5, 6])
    assert drafter.propose([(1, 3)])[0].token_ids.tolist() == [7, 8, 1]
    with pytest.raises(InvalidContext, match="tokens holds 6.0"):
        drafter.add_tokens(1, cast(Any, [5, 6.0]))  # a float is refused, not truncated
    assert drafter.propose([(1, 3)])[0].token_ids.tolist() == [7, 8, 1]  # nothing was appended


def test_the_trie_learns_committed_tokens_and_forgets_stopped_requests():
    drafter = DraftingService(Trie(window=4, max_prefix=2), vocab_size=VOCAB)
    drafter.start_request("t", [1, 2, 3, 4])
    assert len(drafter.propose([("t", 4)])[0]) == 0
    drafter.add_tokens("t", [1, 2])
    assert drafter.propose([("t", 2)], chain=True)[0].token_ids.tolist() == [3, 4]
    drafter.stop_request("t")
    assert not drafter.active_requests and drafter.step_seconds() == {}


def test_every_drafter_has_the_whole_protocol():
    """close, step_seconds, config and hidden_states on every drafter: callers never probe for them."""
    for method in (NoDraft(), PromptLookup(), Trie()):
        drafter = DraftingService(method, vocab_size=VOCAB)
        drafter.start_request(0, [1, 2])
        assert [len(d) for d in drafter.propose([(0, 3)])] == [0]
        assert drafter.config()["name"] == drafter.name and drafter.hidden_states is False
        assert isinstance(drafter.step_seconds(), dict)
        drafter.close()
