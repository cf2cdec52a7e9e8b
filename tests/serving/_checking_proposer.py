"""A proposer for tests that run vLLM in their own process: :class:`CheckingProposer` drafts as ours does and, after
every step, checks that each row's request holds exactly the row's tokens (what vLLM's ``token_ids_cpu`` holds), so
that a test can run vLLM's own scheduler (its preemption, condensing and reordering) and see the tracking stay exact.
It also keeps the first :data:`STATES_KEPT` row states the target handed it (:mod:`serving.runner_hook`), with the
row's tokens, for a test to hold against the HF model's."""

from __future__ import annotations

import numpy as np

from benchmarks._proposer import InstrumentedProposer

STATES_KEPT = 24


class CheckingProposer(InstrumentedProposer):
    """:class:`benchmarks._proposer.InstrumentedProposer` that counts the rows whose request's tokens differ from the
    row's (``mismatches``; ``checked`` rows in all) and keeps ``(row tokens, state, LM-head argmax of the state)`` of
    the first rows that received a state (``states``)."""

    def __init__(self, vllm_config, config=None) -> None:
        super().__init__(vllm_config, config)
        self.checked = self.mismatches = 0
        self.states: list[dict] = []

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        view = self._view  # the plugin's view of the step, which propose consumes
        self._keep_states(view, num_tokens_no_spec, token_ids_cpu)
        out = super().propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings)
        held = view.req_ids if view is not None else self.edge.rows.held if self.edge.rows is not None else {}
        for i, sampled in enumerate(sampled_token_ids):
            if sampled:
                want = token_ids_cpu[i, :int(num_tokens_no_spec[i])]
                self.checked += 1
                self.mismatches += not np.array_equal(self.service.tokens(held[i]), want)
        return out

    def _keep_states(self, view, num_tokens_no_spec, token_ids_cpu) -> None:
        got = None if view is None else view.states
        lm_head = self.edge.lm_head
        if got is None or lm_head is None:
            return
        for row, state in zip(got.rows, got.states):
            if len(self.states) < STATES_KEPT:
                self.states.append({"tokens": token_ids_cpu[row, :int(num_tokens_no_spec[row])].tolist(),
                                    "state": state.float().tolist(),
                                    "argmax": int((lm_head @ state).argmax())})

    def stats(self) -> dict:
        return super().stats() | {"checked": self.checked, "mismatches": self.mismatches,
                                   "head": self.edge.head is not None, "head_steps": self.edge.head_steps}
