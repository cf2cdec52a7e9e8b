"""The runner hook (:mod:`serving.runner_hook`): each step's batch by request id, handed to a drafter that observes it
just before vLLM's own call; a step that proposes nothing ends its finished requests; a request's extra_args name its
datastores; each row's last accepted hidden state, selected as vLLM's Medusa branch selects it. On stand-ins of vLLM's
runner here; inside vLLM in tests/serving/test_vllm_proposer.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from serving.runner_hook import EngineView, install, select_rows


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


class _Runner:
    """A stand-in for vLLM's GPUModelRunner: the two methods the hook wraps, and what they record."""

    def __init__(self) -> None:
        self.calls: list = []

    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, sampling_metadata, hidden_states,
                                sample_hidden_states, aux_hidden_states, spec_decode_metadata, common_attn_metadata,
                                slot_mappings):
        self.calls.append(sampled_token_ids)
        drafter: Any = getattr(self, "drafter", None)
        return drafter.propose(sampled_token_ids) if hasattr(drafter, "propose") else [[7]] * len(sampled_token_ids)

    def _update_states(self, scheduler_output):
        self.calls.append("update")


class _Drafter:
    def __init__(self) -> None:
        self.views: list = []
        self.finished: list = []
        self.closed = 0

    def observe(self, view) -> None:
        self.views.append(view)

    def propose(self, sampled):
        return [[9]] * len(sampled)

    def finish(self, req_ids) -> None:
        self.finished.append(set(req_ids))

    def close(self) -> None:
        self.closed += 1


def _runner(drafter, req_ids, extra_args=None):
    """An instance of the wrapped stand-in, with a batch of ``req_ids`` and their requests' extra_args."""
    runner: Any = _Wrapped()
    runner.drafter = drafter
    tokens, lengths = np.zeros((4, 8), np.int32), np.full(4, 3, np.int32)
    runner.input_batch = SimpleNamespace(req_ids=req_ids, token_ids_cpu=tokens, num_tokens_no_spec=lengths)
    runner.requests = {r: SimpleNamespace(sampling_params=SimpleNamespace(extra_args=(extra_args or {}).get(r)))
                       for r in req_ids}
    return runner


class _Wrapped(_Runner):
    pass


def _install():
    module = SimpleNamespace(GPUModelRunner=_Wrapped)
    assert install(module) is None and install(module) is None  # once: the second call finds it in place


def _step(finished=(), tokens=3):
    return SimpleNamespace(finished_req_ids=set(finished), total_num_scheduled_tokens=tokens)


def test_the_hook_hands_the_step_by_request_id_then_calls_through(caplog):
    """A drafter with ``observe`` gets the step's view (ids in row order, the engine's arrays as they are, the finished
    ids, each request's extra_args, the rows' states) just before vLLM's own call, which goes on as ever; another
    drafter is called through untouched; states that do not add up reach it as None, told once."""
    _install()
    drafter = _Drafter()
    runner = _runner(drafter, ["a", "b"], {"a": {"crest_datastore": "code"}})
    meta = SimpleNamespace(num_draft_tokens=[1, 2])
    states = _states(5)
    args = (_step({"z"}), [[5, 6], [8]], None, None, states, None, meta, None, None)
    assert runner.propose_draft_token_ids(*args) == [[9], [9]]
    view = drafter.views[0]
    assert view.req_ids == ["a", "b"] and view.tokens is runner.input_batch.token_ids_cpu and view.finished == {"z"}
    assert view.states.rows == [0, 1] and torch.equal(view.states.states, states[[1, 2]])
    assert view.extra_args("a") == {"crest_datastore": "code"} and view.extra_args("nobody") is None
    other = _runner(object(), ["a"])
    assert other.propose_draft_token_ids(_step(), [[5]], None, None, _states(1), None, None, None, None) == [[7]]
    bad = (_step(), [[5, 6], [8]], None, None, _states(4), None, meta, None, None)
    runner.propose_draft_token_ids(*bad)
    runner.propose_draft_token_ids(*bad)
    assert [v.states for v in drafter.views[1:]] == [None, None] and caplog.text.count("does not fit the batch") == 1


def test_a_step_that_proposes_nothing_ends_its_finished_requests_at_once():
    """``_update_states`` runs every step: one that schedules no tokens (no ``propose`` follows) hands its finished
    requests to the drafter; a step that proposes leaves them to the view."""
    _install()
    drafter = _Drafter()
    runner = _runner(drafter, [])
    runner._update_states(_step({"x"}, tokens=0))
    runner._update_states(_step({"y"}, tokens=5))
    runner._update_states(_step((), tokens=0))
    assert drafter.finished == [{"x"}] and runner.calls == ["update"] * 3


@pytest.mark.parametrize(("args", "want"), [
    (None, (None, True)),
    ({"crest_datastore": "code"}, ("code", True)),
    ({"crest_datastore": "code", "crest_shared": 0}, ("code", False)),
    ({"crest_datastore": "code", "crest_shared": False}, ("code", False)),
    ({"crest_datastore": "code", "crest_shared": "1"}, ("code", True)),
    ({"crest_datastore": 5}, (None, True)),          # not a name: ignored, told once
    ({"crest_shared": "maybe"}, (None, True)),       # not 0 or 1: ignored, told once
    ({"kv_transfer_params": {"x": 1}}, (None, True)),  # vLLM's own keys are not ours
])
def test_a_requests_extra_args_name_its_datastores(args, want, caplog):
    view = EngineView(["r"], [[1]], np.zeros((1, 2), np.int32), np.ones(1, np.int32), (), lambda rid: args, None,
                      set())
    assert view.choice("r") == want
    assert view.choice("r") == want
    assert caplog.text.count("is not") == (1 if want == (None, True) and args and "kv" not in str(args) else 0)


def test_a_runner_without_what_the_hook_reads_is_left_alone():
    class Old:
        def propose_draft_token_ids(self, scheduler_output, sampled_token_ids):
            return []

        def _update_states(self, scheduler_output):
            return None

    before = Old.propose_draft_token_ids
    why = install(SimpleNamespace(GPUModelRunner=Old))
    assert why is not None and "lacks sample_hidden_states, spec_decode_metadata" in why
    assert Old.propose_draft_token_ids is before
    assert install(SimpleNamespace()) == "its GPUModelRunner has no propose_draft_token_ids or _update_states"
