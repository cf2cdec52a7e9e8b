"""The replay simulator with the target's state (:func:`evaluation.simulate.replay`'s ``states``): each step hands the
drafter the state that gave the row's bonus token, as vLLM's runner hands it to the proposer; malformed states are
refused at the door."""

from __future__ import annotations

import numpy as np
import pytest

from decoder import greedy_generate
from drafting import DraftHead, DraftingService
from drafting.head import DEFAULT_HEAD, target_rows
from evaluation.features import reference_states, target_weights
from evaluation.simulate import replay
from toolkit.tokenizer import tokenizer_fingerprint

MAX_NEW = 24


class Recorder:
    """A drafter that keeps what each step was handed (its new tokens and its states), then drafts with ``service``."""

    name = "recorder"

    def __init__(self, service: DraftingService) -> None:
        self.service = service
        self.seen: list[tuple[list[int], np.ndarray | None]] = []

    def start_request(self, req_id, prompt_ids) -> None:
        self.service.start_request(req_id, prompt_ids)

    def stop_request(self, req_id) -> None:
        self.service.stop_request(req_id)

    def config(self) -> dict:
        return self.service.config()

    def close(self) -> None:
        self.service.close()

    def step(self, requests, budgets, *, tokens=None, chain=False, states=None):
        self.seen.append((list(tokens[0]), None if states is None else states.copy()))
        return self.service.step(requests, budgets, tokens=tokens, chain=chain, states=states)


@pytest.fixture(scope="module")
def lm_head(target) -> np.ndarray:
    return target_rows(*target_weights(target))[1]


def test_each_step_reads_the_state_that_gave_its_bonus_token(target, tokenizer, eval_prompts, lm_head, tmp_path):
    """The target's argmax over each state handed to a step is the step's bonus token (the last token committed):
    the state is the one vLLM hands over. The replay stays lossless, and the head's scores take part in the drafts."""
    head = DraftHead.load(DEFAULT_HEAD)
    service = DraftingService(None, vocab_size=len(lm_head))
    service.set_head(head, lm_head, lm_head, tokenizer_fingerprint(tokenizer))  # SmolLM2 ties the two
    plain = DraftingService(None, vocab_size=len(lm_head))
    differs = 0
    for p in eval_prompts:
        ref = greedy_generate(target, p.token_ids, max_new_tokens=MAX_NEW).output_ids
        states = reference_states(target, list(p.token_ids) + ref, tmp_path)
        rec = Recorder(service)
        res = replay(rec, p.token_ids, ref, 8, chain=True, states=states)
        assert res.output_ids == ref
        committed = list(p.token_ids) + ref[:1]
        *steps, (_, last) = rec.seen
        assert last is None and len(steps) == len(res.steps)  # the closing step drafts nothing and reads none
        for new, state in steps:
            committed += new
            assert state is not None and state.shape == (1, lm_head.shape[1])
            assert int(np.argmax(lm_head @ state[0])) == committed[-1]
        without = replay(plain, p.token_ids, ref, 8, chain=True)
        differs += [s.accepted for s in without.steps] != [s.accepted for s in res.steps]
    assert differs > 0  # the state changed some chain


@pytest.mark.parametrize("bad", ["float64", "short", "flat", "fortran", "no prompt"])
def test_malformed_states_are_refused(lm_head, bad):
    prompt, ref = ([] if bad == "no prompt" else [1, 2, 3, 4]), [5, 6, 7]
    states = np.zeros((7, lm_head.shape[1]), np.float32)
    states = {"float64": states.astype(np.float64), "short": states[:4], "flat": states[0],
              "fortran": np.asfortranarray(states[:, :8]), "no prompt": states}[bad]
    with pytest.raises(ValueError, match="reference_states"):
        replay(DraftingService(None, vocab_size=len(lm_head)), prompt, ref, 8, chain=True, states=states)


def test_a_damaged_cached_state_file_is_computed_again(target, tmp_path):
    """The states replay reads (:func:`evaluation.features.reference_states`) come from a cache; a cached file cut off
    or corrupted is computed again, to the same values, not raised."""
    ids = [1, 2, 3, 4, 5, 6]
    first = reference_states(target, ids, tmp_path)
    (cached,) = tmp_path.glob("*.npy")
    for damage in (cached.read_bytes()[:100], b"not an array"):
        cached.write_bytes(damage)
        assert np.array_equal(reference_states(target, ids, tmp_path), first)
