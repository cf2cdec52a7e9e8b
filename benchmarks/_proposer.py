"""Our vLLM proposer with its figures, for benchmarks and tests that run vLLM in their own process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``): :class:`InstrumentedProposer` records each ``propose`` through the proposer's
per-step hook (:attr:`serving.vllm_proposer.CrestProposer.on_step`) and keeps a weak reference to the last one vLLM
built, so the caller can read :meth:`InstrumentedProposer.stats` after a run.

    speculative_config={"method": "custom_class", "model": "benchmarks._proposer.InstrumentedProposer", ...}
    # then InstrumentedProposer.last().stats()
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import ClassVar

import numpy as np

from datastore.lookup import LookupClient
from drafting.step import STEP_TIMES_KEPT
from serving.vllm_proposer import CrestProposer, ProposeRecord

__all__ = ["InstrumentedProposer"]


class InstrumentedProposer(CrestProposer):
    """:class:`serving.vllm_proposer.CrestProposer` whose every ``propose`` (the hook vLLM calls) is recorded: its time,
    the native core's share of it, the tokens it proposed, its cut and the calibrated expected accepted tokens of its
    chains (what vLLM's accepted-token counter is compared with), and each engine step the step-cost model timed."""

    _last: ClassVar[weakref.ref | None] = None

    def __init__(self, vllm_config, settings=None) -> None:
        super().__init__(vllm_config, settings)
        self.steps = 0
        self.step_s = 0.0
        self.tokens_proposed = 0
        self.times: deque = deque(maxlen=STEP_TIMES_KEPT)
        self.cuts: deque = deque(maxlen=STEP_TIMES_KEPT)
        self.expected = 0.0  # the calibrated expected accepted tokens of every chain proposed (the sum of its scores)
        self.native: deque = deque(maxlen=STEP_TIMES_KEPT)  # each step's seconds in the native core
        # each decode step the step-cost model timed: (rows, tokens verified, seconds, whether it had drafts)
        self.cost_log: deque = deque(maxlen=STEP_TIMES_KEPT)
        self._core_s = 0.0
        self._rows = 0
        self.by_id_steps = 0  # the steps stepped by request id (our plugin's runner hook), not by the rows' tokens
        self.on_step = self._record
        InstrumentedProposer._last = weakref.ref(self)

    @classmethod
    def last(cls) -> InstrumentedProposer | None:
        """The proposer built last in this process while vLLM still holds it, else ``None``."""
        return None if cls._last is None else cls._last()

    def _record(self, step: ProposeRecord) -> None:
        core = self.service.retrieval.stats.core_s
        self.step_s += step.seconds
        self.times.append(step.seconds)
        self.native.append(core - self._core_s)
        self._core_s = core
        self.steps += 1
        self.by_id_steps += step.by_id
        if step.observed is not None:  # the timed step was the one after the previous call: its rows
            self.cost_log.append((self._rows, *step.observed))
        self._rows = step.rows
        if step.chains is not None:  # what the engine is asked to verify, and the lowest score kept
            scores = step.chains.scores
            self.tokens_proposed += len(scores)
            self.expected += float(scores.sum())
            self.cuts.append(max(self.settings.min_score, float(scores.min())) if len(scores) else 1.0)

    def reset_times(self) -> None:
        """Forget the timed steps so far (a run's figures then cover that run only)."""
        self.times.clear()
        self.native.clear()
        self.cost_log.clear()
        self.service.stats.step_times.clear()

    def stats(self) -> dict:
        """Steps, the hook's ``propose`` p50/p99 and mean (ms), the service step's p50, the round trip's share, the
        steps drafted from the replicas, tokens proposed, the cuts, the step-cost fit, the rows followed, faults, the
        output index and the datastore client's figures."""
        st, merged = self.service.stats, self.service.retrieval.stats
        lookups = self.service.catalog.shared
        client = lookups.client if lookups is not None else None
        rows = self.edge.rows
        times = np.asarray(self.times) * 1e3
        service = np.asarray(st.step_times) * 1e3
        native = np.asarray(self.native) * 1e3
        return {"steps": self.steps, "step_ms_mean": 1e3 * self.step_s / max(self.steps, 1),
                "propose_ms_p50": float(np.median(times)) if len(times) else 0.0,
                "propose_ms_p99": float(np.percentile(times, 99)) if len(times) else 0.0,
                "service_step_ms_p50": float(np.median(service)) if len(service) else 0.0,
                # the drafting call itself (core_s: the native calls, timed around them) and the rest of the hook
                "native_ms_p50": float(np.median(native)) if len(native) else 0.0,
                "outside_ms_p50": float(np.median(times - native)) if len(native) else 0.0,
                "lookup_share": merged.lookup_s / max(st.step_s, 1e-12), "lookup_s": merged.lookup_s,
                "replica_steps": merged.replica_steps, "round_trip_steps": merged.round_trip_steps,
                "tokens_proposed": self.tokens_proposed, "expected_accepted": self.expected,
                "cut_mean": float(np.mean(self.cuts)) if self.cuts else 0.0,
                "cut_p90": float(np.percentile(self.cuts, 90)) if self.cuts else 0.0,
                "cost_steps": self.cost.observed, "step_cost": _cost(self.cost.curve),
                "by_id_steps": self.by_id_steps, "rows_resynced": self.edge.engine.resynced,
                "rows_started": rows.started if rows else 0, "rows_moved": rows.moved if rows else 0,
                "rows_stopped": rows.stopped if rows else 0,
                "faults": dict(lookups.faults) if lookups is not None else {},
                "outputs": self.service.outputs_info(),
                "datastore": client.stats() if isinstance(client, LookupClient) else None}


def _cost(curve) -> dict | None:
    """A step-cost curve as JSON: its points (tokens, ms), tail (ms per token) and a step's jump with drafts (ms)."""
    if curve is None:
        return None
    return {"tokens": curve.tokens.tolist(), "ms": (1e3 * curve.seconds).tolist(), "tail_ms": 1e3 * curve.tail,
            "draft_ms": 1e3 * curve.draft_s}
