"""Each row's last accepted hidden state, selected from a step's sampled states (:mod:`serving.model_state`) as vLLM's
Medusa branch selects it; the wrapper of vLLM's runner is checked inside vLLM in tests/serving/test_vllm_proposer.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

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


def _runner_method(calls: list):
    """A stand-in with the signature of vLLM 0.32's ``propose_draft_token_ids``, recording what it was called with."""
    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, sampling_metadata, hidden_states,
                                sample_hidden_states, aux_hidden_states, spec_decode_metadata, common_attn_metadata,
                                slot_mappings):
        calls.append(sampled_token_ids)
        return [[7]] * len(sampled_token_ids)
    return propose_draft_token_ids


class _Observer:
    def __init__(self) -> None:
        self.got: list = []

    def observe_states(self, states) -> None:
        self.got.append(states)


@pytest.mark.vllm
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # vLLM's imports
def test_the_hook_hands_states_to_a_drafter_that_asks_and_calls_through(monkeypatch, caplog):
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from serving.model_state import install_state_hook

    calls: list = []
    monkeypatch.setattr(GPUModelRunner, "propose_draft_token_ids", _runner_method(calls))
    assert install_state_hook() and install_state_hook()  # once: the second call finds it in place
    wrapped: Any = GPUModelRunner.propose_draft_token_ids  # called with stand-ins for the runner and its step
    meta = SimpleNamespace(num_draft_tokens=[1, 2])
    states = _states(5)
    observer = _Observer()
    args = (None, [[5, 6], [8]], None, None, states, None, meta, None, None)
    assert wrapped(SimpleNamespace(drafter=observer), *args) == [[7], [7]]
    assert observer.got[0].rows == [0, 1] and torch.equal(observer.got[0].states, states[[1, 2]])
    # another method's drafter is called through untouched
    assert wrapped(SimpleNamespace(drafter=object()), *args) == [[7], [7]] and len(calls) == 2
    # states that do not add up: told once, the drafter gets None, the engine's call goes on
    bad = (None, [[5, 6], [8]], None, None, _states(4), None, meta, None, None)
    assert wrapped(SimpleNamespace(drafter=observer), *bad) == [[7], [7]]
    assert wrapped(SimpleNamespace(drafter=observer), *bad) == [[7], [7]]
    assert observer.got[1:] == [None, None] and caplog.text.count("does not fit the batch") == 1


@pytest.mark.vllm
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # vLLM's imports
def test_a_runner_without_what_the_hook_reads_is_left_alone(monkeypatch, caplog):
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from serving.model_state import install_state_hook

    def old(self, scheduler_output, sampled_token_ids):
        return []

    monkeypatch.setattr(GPUModelRunner, "propose_draft_token_ids", old)
    assert not install_state_hook()
    assert GPUModelRunner.propose_draft_token_ids is old
    assert "lacks sample_hidden_states, spec_decode_metadata" in caplog.text
