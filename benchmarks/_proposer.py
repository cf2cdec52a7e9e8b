"""Our vLLM proposer with its figures, for benchmarks and tests that run vLLM in their own process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``): :class:`InstrumentedProposer` times each step, records each cut and keeps a
weak reference to the last one vLLM built, so the caller can read :meth:`InstrumentedProposer.stats` after a run.

    speculative_config={"method": "custom_class", "model": "_proposer.InstrumentedProposer", ...}
    # with benchmarks/ on sys.path; then InstrumentedProposer.last().stats()
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from typing import ClassVar

import numpy as np

from datastore.lookup import LookupClient
from drafting.service import STEP_TIMES_KEPT
from serving.vllm_proposer import CrestProposer


class InstrumentedProposer(CrestProposer):
    """:class:`serving.vllm_proposer.CrestProposer` that counts its steps, their seconds and cuts, and the tokens it
    proposed."""

    _last: ClassVar[weakref.ref | None] = None

    def __init__(self, vllm_config, config=None) -> None:
        super().__init__(vllm_config, config)
        self.steps = 0
        self.step_s = 0.0
        self.tokens_proposed = 0
        self.cuts: deque = deque(maxlen=STEP_TIMES_KEPT)
        InstrumentedProposer._last = weakref.ref(self)

    @classmethod
    def last(cls) -> InstrumentedProposer | None:
        """The proposer built last in this process while vLLM still holds it, else ``None``."""
        return None if cls._last is None else cls._last()

    def step_cut(self, rows: int) -> float:
        cut = super().step_cut(rows)
        self.cuts.append(cut)
        return cut

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        start = time.perf_counter()
        out = super().propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings)
        self.step_s += time.perf_counter() - start
        self.steps += 1
        self.tokens_proposed += sum(map(len, out))
        return out

    def stats(self) -> dict:
        """Steps, mean and median step time (ms), the round trip's share, tokens proposed, the cuts, the step-cost
        fit, the rows followed, faults, the output index and the datastore client's figures."""
        st = self.service.stats
        lookups = self.service.lookups
        client = lookups.client if lookups is not None else None
        times = np.asarray(st.step_times) * 1e3
        return {"steps": self.steps, "step_ms_mean": 1e3 * self.step_s / max(self.steps, 1),
                "service_step_ms_p50": float(np.median(times)) if len(times) else 0.0,
                "lookup_share": st.lookup_s / max(st.step_s, 1e-12), "lookup_s": st.lookup_s,
                "tokens_proposed": self.tokens_proposed,
                "cut_mean": float(np.mean(self.cuts)) if self.cuts else 0.0,
                "cut_p90": float(np.percentile(self.cuts, 90)) if self.cuts else 0.0,
                "cost_steps": self.cost.observed, "step_cost": self.cost.coefficients,
                "rows_started": self.rows.started, "rows_moved": self.rows.moved, "rows_stopped": self.rows.stopped,
                "faults": dict(lookups.faults) if lookups is not None else {},
                "outputs": self.service.outputs_info(),
                "datastore": client.stats() if isinstance(client, LookupClient) else None}
