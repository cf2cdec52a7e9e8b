"""Each row's last accepted hidden state, selected from a step's sampled states (:mod:`serving.model_state`) as vLLM's
Medusa branch selects it; the wrapper of vLLM's runner is checked inside vLLM in tests/serving/test_vllm_proposer.py."""

from __future__ import annotations

import pytest
import torch

from serving.model_state import select_rows


def _states(positions: int, hidden: int = 3) -> torch.Tensor:
    return torch.arange(positions * hidden, dtype=torch.float32).reshape(positions, hidden)


def test_each_row_gets_the_state_of_its_last_accepted_token():
    # rows drafted 2, 0, 3 and 1 tokens: 3 + 1 + 4 + 2 sampled positions; row 2 sampled nothing (a discarded row)
    sampled = [[11, 12], [13], [], [14, 15]]
    states = _states(10)
    got = select_rows(sampled, states, [2, 0, 3, 1])
    assert got.rows == [0, 1, 3]
    # row 0 accepted 1 draft token: its position 1; row 1 starts at 3; row 3 at 3 + 1 + 4 = 8, accepted 1: 9
    assert torch.equal(got.states, states[[1, 3, 9]])


def test_a_step_without_drafts_hands_over_its_states_uncopied():
    states = _states(3)
    got = select_rows([[1], [2], [3]], states, None)
    assert got.rows == [0, 1, 2] and got.states is states
    partial = select_rows([[1], [], [3]], states, None)
    assert partial.rows == [0, 2] and torch.equal(partial.states, states[[0, 2]])
    same = select_rows([[1], [2]], _states(2), [0, 0])  # drafts of length 0 everywhere: one state a row
    assert same.rows == [0, 1]


@pytest.mark.parametrize(("sampled", "positions", "drafts"), [
    ([[1], [2]], 3, None),        # one state a row expected
    ([[1, 2], [3]], 4, [1, 2]),   # 2 + 3 positions expected
])
def test_states_that_do_not_add_up_are_refused(sampled, positions, drafts):
    with pytest.raises(ValueError, match="sampled states for"):
        select_rows(sampled, _states(positions), drafts)
